"""Serving a Paddock service's ASGI app with uvicorn: the one entry the control plane, the host agent
and the gateway share."""

from __future__ import annotations

import asyncio
import gc
import resource
import socket
import threading
from collections.abc import Iterable

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from paddock_core import stackdump


class FrozenHeapServer(uvicorn.Server):
    """uvicorn's server, which once the app has started takes its heap out of the full collections and
    writes its stacks on demand (``stackdump``)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # Everything alive once the app has started (modules, SQLAlchemy's and pydantic's tables, the
        # routes: ~200,000 objects) lives as long as the process. Left to the collector, each full
        # collection walks all of it again: 50–125 ms on the dev box, during which the event loop
        # answers nothing, so it shows as the p99 of every request. Frozen, a collection walks only
        # what came after.
        gc.collect()
        gc.freeze()
        # Stacks on a signal; a server run in a thread (the tests') cannot take signals.
        if threading.current_thread() is threading.main_thread():
            stackdump.install(asyncio.get_running_loop())


def raise_open_file_limit() -> int:
    """Raises the soft limit on open files to the hard one and returns it. Every kept connection is a
    descriptor (a host agent keeps one to each sandbox's guest, and the clients' connections to each
    service stay open), and systemd's default soft limit of 1,024 would cap a host at a few hundred
    sandboxes long before its memory does; the hard limit is the operator's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


#: How long a service told to stop waits for the requests still open (streams, long polls, the kept
#: channel) before it cancels them and shuts down. uvicorn waits for ever by default, so one open
#: stream (an exec's output followed, a download) kept a host agent from stopping, or from taking its
#: warm pool down, until it was killed.
GRACEFUL_SHUTDOWN_S = 10


#: How long a connection may take to send a request's line and headers, counted from the moment it
#: opens or from the first byte of each further request on it. uvicorn bounds only the wait between
#: two requests (its keep-alive), so a connection that opened and sent nothing, or half a request
#: line, was kept for ever: 200 of them held 200 descriptors of the control plane for as long as
#: the peer liked (slow-loris). Over this, the connection is closed without an answer.
HEADER_TIMEOUT_S = 10.0
#: How long a connection may stay idle after an answer before it is closed (uvicorn's keep-alive; its
#: default, said here so that it is documented and tested).
KEEP_ALIVE_S = 5


#: How long a connection closed after an answer while its client was still sending the request's body
#: (a 413 for a body past its cap, ``paddock_core.bodylimit``) drops what still arrives before it is
#: closed (nginx's lingering_time). Closed at once, the socket is reset with the answer unsent, and a
#: client still writing never reads it. Half-closed first, the answer goes out, and what the client
#: still sends is dropped unparsed (no memory, no app); the connection closes when the client stops
#: sending or after this, whichever comes first.
LINGER_S = 30.0


#: The most a connection's writes of one loop turn are held to be sent as one (``_LingeringTransport``).
COALESCE_BYTES = 64 * 1024


class _LingeringTransport:
    """The protocol's transport, whose ``close`` lingers (``LINGER_S``) while the request's body is
    still coming, and whose writes of one turn of the loop leave as one ``send``; everything else is
    the transport's own.

    uvicorn writes a response's head and its body separately, each straight to the socket: two sends,
    and two wake-ups of the client, of which the first finds half an answer. On a busy 2-core host the
    woken client often preempted the server while it held the GIL; that send was 8-11 % of the control
    plane's and the agent's Python time in sustained creates (py-spy ``--gil``). A write is held until
    the next write of the same turn (sent together) or the turn's end (``call_soon``), at most
    ``COALESCE_BYTES``: past that it goes at once, so a streamed body is never held back or piled up."""

    def __init__(self, transport: asyncio.Transport, protocol: BoundedHttpProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False
        self._held = b""
        self._flush_at: asyncio.Handle | None = None

    def __getattr__(self, name: str) -> object:
        self._flush()  # whatever else is asked of the transport comes after what was written
        return getattr(self._transport, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held and len(data) < COALESCE_BYTES:
            self._held = bytes(data)
            self._flush_at = self._protocol.loop.call_soon(self._flush)
            return
        held, self._held = self._held, b""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        self._transport.write(held + data if held else data)

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(chunks))

    def _flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        if self._held:
            held, self._held = self._held, b""
            if not self._transport.is_closing():
                self._transport.write(held)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def abort(self) -> None:
        self._held = b""  # an abort drops what is unsent, held here or in the transport
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        self._transport.abort()

    def close(self) -> None:
        self._flush()
        cycle = self._protocol.cycle
        if (
            not self.lingering
            and cycle is not None
            and cycle.more_body
            and not self._transport.is_closing()
            and self._transport.can_write_eof()
        ):
            self.lingering = True
            self._transport.write_eof()  # the answer, then our FIN; the client's rest is dropped
            self._protocol.flow.resume_reading()
            self._protocol.loop.call_later(self._protocol.linger_s, self._transport.close)
            return
        self._transport.close()


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request's head (``HEADER_TIMEOUT_S``) and
    a lingering close (``LINGER_S``)."""

    header_timeout_s = HEADER_TIMEOUT_S
    linger_s = LINGER_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        self._lingering = _LingeringTransport(transport, self)
        super().connection_made(self._lingering)  # type: ignore[arg-type]
        self._arm_header_deadline()  # a connection that sends nothing at all is dropped as well

    def data_received(self, data: bytes) -> None:
        if self._lingering.lingering:
            return  # the rest of a refused body: dropped unparsed
        super().data_received(data)

    def eof_received(self) -> None:
        if self._lingering.lingering:
            self._lingering._transport.close()  # the client is done sending: no need to wait

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_deadline is None:
            self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_timed_out(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def config(app: ASGIApp, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for a service: its own logging and access log off (the services log each
    request themselves), a bounded graceful shutdown, and bounded waits for a request's head
    (``HEADER_TIMEOUT_S``) and between requests (``KEEP_ALIVE_S``)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=BoundedHttpProtocol,
        log_config=None,
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def serve(app: ASGIApp, host: str, port: int) -> None:
    """Run ``app`` until the process is told to stop."""
    raise_open_file_limit()
    FrozenHeapServer(config(app, host, port)).run()
