"""The SDK's direct HTTP/1.1 path for plain JSON calls to an ``http://`` control plane.

httpx spends ~0.45 ms of CPU on each request (its request and response models, httpcore's pool, h11's
state machine); a command round trip through the API takes ~1.5 ms, so a third of what an SDK user
waited for an ``exec`` was the SDK itself. Here a call is one ``send`` of the request and a read of a
``Content-Length`` (or chunked) answer on a kept-alive connection: ~0.05 ms.

It serves what nearly every SDK call is: a JSON body (or none), query parameters, a response read whole.
Everything else goes through httpx, which the clients keep for it: streams, uploads and downloads,
``https://`` (TLS, certificates and their configuration stay httpx's), a proxy from the environment, and
any client given its own ``transport``. Failures raise httpx's own exception classes, so the clients
retry and report them exactly as they do httpx's; the answer is an ``httpx.Response``, so everything
that reads one is shared.

``Wire`` (sockets) and ``AsyncWire`` (asyncio streams) are written by hand, as the pairs in
``paddock._blocking`` are: ``scripts/unasync.py`` maps the one onto the other in the generated client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import threading
import time
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlencode, urlsplit

import httpx

#: The keyword arguments a direct call understands; a call with any other goes through httpx.
DIRECT_KWARGS = frozenset({"json", "params", "timeout"})
#: The most idle connections kept per client (more are opened under concurrency, then closed).
MAX_IDLE = 8
#: How long an idle connection is kept for reuse: under the control plane's keep-alive (5 s), after
#: which it closes the connection. Reused later, a connection the server had just closed failed the
#: call whenever the close had not been read yet (an event loop busy elsewhere reads it late).
IDLE_REUSE_S = 4.0
#: Caps on what an answer may hold before it is taken for a broken peer, not an answer.
MAX_HEAD_BYTES = 64 << 10
MAX_BODY_BYTES = 256 << 20


@dataclass(frozen=True)
class Origin:
    host: str
    port: int
    #: ``/prefix/`` of the base URL, so ``v1/...`` is sent as ``/prefix/v1/...``.
    prefix: str
    #: The ``Host`` header: the base URL's authority as written.
    authority: str


def origin_for(base_url: str) -> Origin | None:
    """The base URL's origin when a direct call may serve it: ``http://`` and no proxy for its host."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname or parts.username or parts.password:
        return None
    proxies = urllib.request.getproxies()
    if ("http" in proxies or "all" in proxies) and not urllib.request.proxy_bypass(parts.hostname):
        return None  # httpx honours the environment's proxy; so must every call
    host = parts.hostname
    return Origin(
        host=host,
        port=parts.port or 80,
        prefix=parts.path if parts.path.endswith("/") else parts.path + "/",
        authority=parts.netloc,
    )


def accepts(kwargs: Mapping[str, Any]) -> bool:
    """Whether a call's keyword arguments are ones a direct call sends exactly as httpx would."""
    if not DIRECT_KWARGS.issuperset(kwargs):
        return False
    params = kwargs.get("params")
    if params is not None and not (
        isinstance(params, Mapping)
        and all(
            isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in params.values()
        )
    ):
        return False  # httpx's rendering of other values (True → "true", lists) is left to httpx
    timeout = kwargs.get("timeout")
    return timeout is None or (isinstance(timeout, int | float) and not isinstance(timeout, bool))


def encode_request(
    origin: Origin, headers: Mapping[str, str], method: str, path: str, kwargs: Mapping[str, Any]
) -> bytes:
    """The request's bytes, head and body in one piece (one ``send``, one segment on the wire)."""
    target = origin.prefix + path
    params = kwargs.get("params")
    if params:
        target += "?" + urlencode({k: str(v) for k, v in params.items()})  # as httpx renders them
    lines = [f"{method} {target} HTTP/1.1", f"Host: {origin.authority}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append("Accept-Encoding: gzip")
    body = b""
    if "json" in kwargs:
        # As httpx 0.28 renders ``json=``: compact, UTF-8, no NaN.
        body = json.dumps(kwargs["json"], ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        lines.append("Content-Type: application/json")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Head:
    status: int
    headers: list[tuple[str, str]]
    length: int | None
    chunked: bool
    close: bool


def parse_head(raw: bytes) -> Head:
    """The status line and headers (``raw`` ends with the blank line)."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    headers: list[tuple[str, str]] = []
    length: int | None = None
    chunked = False
    close = version == "HTTP/1.0"
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line: {line[:80]!r}")
        value = value.strip()
        headers.append((name, value))
        lowered = name.lower()
        if lowered == "content-length":
            if not value.isdigit():
                raise httpx.RemoteProtocolError(f"bad Content-Length: {value[:40]!r}")
            length = int(value)
        elif lowered == "transfer-encoding":
            chunked = "chunked" in value.lower()
        elif lowered == "connection":
            close = "close" in value.lower() or (close and "keep-alive" not in value.lower())
    if length is not None and length > MAX_BODY_BYTES:
        raise httpx.RemoteProtocolError(f"an answer of {length} bytes is over the direct path's cap")
    return Head(int(code), headers, length, chunked, close)


def response(head: Head, body: bytes) -> httpx.Response:
    """The answer as httpx's ``Response``, its body decoded as httpx would (gzip). It carries no
    ``request``: building one parses the URL again (~40 µs), and the clients only read the answer."""
    encoding = next((v.lower() for k, v in head.headers if k.lower() == "content-encoding"), "")
    if encoding == "gzip":
        try:
            body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
        except zlib.error as exc:
            raise httpx.DecodingError(f"gzip body does not decode: {exc}") from None
    headers = [(k, v) for k, v in head.headers if k.lower() not in ("content-encoding", "transfer-encoding")]
    return httpx.Response(head.status, headers=headers, content=body)


class AnswerReader:
    """One answer, read from bytes as they arrive. It does no I/O: each connection below feeds it what
    its socket gives, so both read an answer the same way."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.buffer = bytearray()
        self.head: Head | None = None
        self.parts: list[bytes] = []
        self.received = 0
        #: What the next bytes are: the ``head``, the ``body`` (of a Content-Length), a chunk's
        #: ``size`` line, its ``data``, the CRLF that ``ends`` it, ``trailers``, or ``done``.
        self.stage = "head"
        self.remaining = 0

    def feed(self, data: bytes) -> bool:
        """Takes ``data``; whether the answer is whole."""
        self.buffer += data
        while self.stage != "done":
            if not self._step():
                return False
        return True

    def answer(self) -> tuple[Head, bytes]:
        """The whole answer's head and body (after ``feed`` said it was whole)."""
        assert self.head is not None and self.stage == "done"
        return self.head, b"".join(self.parts)

    def clean(self) -> bool:
        """Whether the connection holds nothing past the answer, so it can carry the next request."""
        return not self.buffer and not (self.head is not None and self.head.close)

    def _line(self, marker: bytes, cap: int) -> bytes | None:
        end = self.buffer.find(marker)
        if end < 0:
            if len(self.buffer) > cap:
                raise httpx.RemoteProtocolError("answer head or chunk line is over the direct path's cap")
            return None
        line = bytes(self.buffer[: end + len(marker)])
        del self.buffer[: end + len(marker)]
        return line

    def _take_body(self) -> bool:
        """Moves up to ``remaining`` bytes of body out of the buffer; whether all of it has come."""
        taken = min(self.remaining, len(self.buffer))
        if taken:
            self.parts.append(bytes(self.buffer[:taken]))
            del self.buffer[:taken]
            self.remaining -= taken
        return self.remaining == 0

    def _step(self) -> bool:
        """Advances one stage; False when it needs more bytes."""
        if self.stage == "head":
            raw = self._line(b"\r\n\r\n", MAX_HEAD_BYTES)
            if raw is None:
                return False
            head = self.head = parse_head(raw)
            if 100 <= head.status < 200:
                return True  # an interim answer (100 Continue): the real one follows
            if self.method == "HEAD" or head.status in (204, 304):
                self.stage = "done"
            elif head.chunked:
                self.stage = "size"
            elif head.length is None:
                raise httpx.RemoteProtocolError("answer has neither Content-Length nor chunked encoding")
            else:
                self.stage, self.remaining = "body", head.length
            return True
        if self.stage in ("body", "data"):
            if not self._take_body():
                return False
            self.stage = "done" if self.stage == "body" else "ends"
            return True
        if self.stage == "ends":
            if len(self.buffer) < 2:
                return False
            if self.buffer[:2] != b"\r\n":
                raise httpx.RemoteProtocolError("chunk not followed by CRLF")
            del self.buffer[:2]
            self.stage = "size"
            return True
        line = self._line(b"\r\n", MAX_HEAD_BYTES)
        if line is None:
            return False
        if self.stage == "trailers":  # read and dropped, as httpx does
            if line == b"\r\n":
                self.stage = "done"
            return True
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad chunk size {size_text[:20]!r}") from None
        self.received += size
        if self.received > MAX_BODY_BYTES:
            raise httpx.RemoteProtocolError("chunked answer is over the direct path's cap")
        self.stage, self.remaining = ("data", size) if size else ("trailers", 0)
        return True


def _not_at_end(data: bytes) -> bytes:
    """What a read gave, which must be more of the answer: nothing means the server hung up on it."""
    if not data:
        raise httpx.RemoteProtocolError("server disconnected without sending a complete answer")
    return data


class _Connection(Protocol):
    def stale(self) -> bool: ...
    def close(self) -> None: ...


_C = TypeVar("_C", bound=_Connection)


class _Pool(Generic[_C]):
    """What both clients' direct paths share: the origin, the headers, idle connections and closing.
    Only opening a connection and the exchange on it differ (blocking or awaited). The lock is held
    for list operations only, never across I/O: the blocking client is shared between threads."""

    def __init__(self, origin: Origin, headers: Mapping[str, str], timeout: float) -> None:
        self.origin = origin
        self.headers = dict(headers)
        self.timeout = timeout
        self._idle: list[tuple[_C, float]] = []  # with when each went idle (time.monotonic)
        self._lock = threading.Lock()
        self._closed = False

    def _prepare(self, method: str, path: str, kwargs: Mapping[str, Any]) -> tuple[bytes, float]:
        """The request's bytes and the call's timeout."""
        request = encode_request(self.origin, self.headers, method, path.lstrip("/"), kwargs)
        return request, kwargs.get("timeout") or self.timeout

    def _idle_one(self) -> _C | None:
        """A kept connection the server has not closed meanwhile, if there is one."""
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("Cannot send a request, as the client has been closed.")
                if not self._idle:
                    return None
                conn, since = self._idle.pop()
            if time.monotonic() - since < IDLE_REUSE_S and not conn.stale():
                return conn
            conn.close()

    def _finish(self, conn: _C, answer: AnswerReader) -> httpx.Response:
        """Keeps the connection for the next call if the answer left it clean, and returns the answer."""
        with self._lock:
            kept = answer.clean() and not self._closed and len(self._idle) < MAX_IDLE
            if kept:
                self._idle.append((conn, time.monotonic()))
        if not kept:
            conn.close()
        return response(*answer.answer())

    def _close_idle(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


# -- blocking ---------------------------------------------------------------------------------------


class _Conn:
    """One kept-alive socket."""

    def __init__(self, origin: Origin, timeout: float) -> None:
        try:
            self.sock = socket.create_connection((origin.host, origin.port), timeout=timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def stale(self) -> bool:
        """A kept connection the server closed (or wrote to unasked) while it sat idle."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def exchange(self, request: bytes, method: str, timeout: float) -> AnswerReader:
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(request)
        except TimeoutError:
            raise httpx.WriteTimeout("timed out sending the request") from None
        except OSError as exc:
            raise httpx.WriteError(str(exc)) from None
        reader = AnswerReader(method)
        while not reader.feed(self._more()):
            pass
        return reader

    def _more(self) -> bytes:
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            raise httpx.ReadTimeout("timed out waiting for the answer") from None
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from None
        return _not_at_end(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Wire(_Pool[_Conn]):
    """Direct calls on kept-alive connections, safe to share between threads (each call holds one)."""

    def request(self, method: str, path: str, kwargs: Mapping[str, Any]) -> httpx.Response:
        request, timeout = self._prepare(method, path, kwargs)
        conn = self._idle_one() or _Conn(self.origin, timeout)
        try:
            answer = conn.exchange(request, method, timeout)
        except BaseException:
            conn.close()  # a connection that failed mid-call is never reused
            raise
        return self._finish(conn, answer)

    def close(self) -> None:
        self._close_idle()


# -- asyncio ----------------------------------------------------------------------------------------


class _AsyncConn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, origin: Origin, timeout: float) -> _AsyncConn:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(origin.host, origin.port)
        except TimeoutError:
            raise httpx.ConnectTimeout("connect timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    def stale(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()

    async def exchange(self, request: bytes, method: str, timeout: float) -> AnswerReader:
        try:
            async with asyncio.timeout(timeout):
                self.writer.write(request)
                await self.writer.drain()
        except TimeoutError:
            raise httpx.WriteTimeout("timed out sending the request") from None
        except OSError as exc:
            raise httpx.WriteError(str(exc)) from None
        answer = AnswerReader(method)
        try:
            async with asyncio.timeout(timeout):
                while not answer.feed(await self._more()):
                    pass
        except TimeoutError:
            raise httpx.ReadTimeout("timed out waiting for the answer") from None
        return answer

    async def _more(self) -> bytes:
        try:
            data = await self.reader.read(1 << 20)
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from None
        return _not_at_end(data)

    def close(self) -> None:
        self.writer.close()


class AsyncWire(_Pool[_AsyncConn]):
    """Direct calls on kept-alive connections for one event loop (each call holds one connection)."""

    async def request(self, method: str, path: str, kwargs: Mapping[str, Any]) -> httpx.Response:
        request, timeout = self._prepare(method, path, kwargs)
        conn = self._idle_one() or await _AsyncConn.open(self.origin, timeout)
        try:
            answer = await conn.exchange(request, method, timeout)
        except BaseException:
            conn.close()
            raise
        return self._finish(conn, answer)

    async def aclose(self) -> None:
        self._close_idle()
