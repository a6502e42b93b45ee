"""The sandboxes' DNS resolver: a forwarder on the gateway address that enforces name rules.

Every sandbox's ``/etc/resolv.conf`` names the gateway (``.1``), where this resolver listens on UDP
and TCP port 53 (bound with ``IP_FREEBIND``, so it can start before the first veth carries the
address). For each query it asks ``decide(source ip, name)``:

- ``OPEN``: the sandbox has no allowlist; the query is forwarded and answered as is.
- ``DENY``: the name matches no rule; the sandbox gets NXDOMAIN (REFUSED for an unknown source).
- a callback: the name is allowed; the query is forwarded upstream and, *before* the answer goes
  back, the callback admits the answer's A records (with their TTL) into the sandbox's nftables
  sets. Connecting to an address the resolver did not answer stays impossible.

Upstream servers are tried in order, over UDP (TCP when the answer is truncated); a sandbox may ask
over UDP or TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from dnslib import QTYPE, RCODE, DNSRecord

from paddock_core.logging import get_logger

log = get_logger(__name__)

IP_FREEBIND = 15
UPSTREAM_TIMEOUT_S = 2.0
TCP_IDLE_S = 10.0

Admit = Callable[[list[tuple[str, int]]], Awaitable[None]]  # [(address, ttl_s)]
Decision = Literal["open", "deny", "unknown"] | Admit
Decide = Callable[[str, str], Decision]


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int = 53

    @classmethod
    def parse(cls, text: str) -> Upstream:
        text = text.strip()
        if text.startswith("["):
            host, _, port = text[1:].partition("]:")
            return cls(host, int(port or 53))
        if text.count(":") == 1:
            host, _, port = text.partition(":")
            return cls(host, int(port))
        return cls(text)


class Resolver:
    def __init__(self, listen: str, upstreams: list[Upstream], decide: Decide, port: int = 53) -> None:
        self.listen = listen
        self.port = port
        self.upstreams = upstreams
        self.decide = decide
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        udp = _bound_socket(socket.SOCK_DGRAM, self.listen, self.port)
        self._udp, _ = await loop.create_datagram_endpoint(lambda: _UdpProtocol(self), sock=udp)
        tcp = _bound_socket(socket.SOCK_STREAM, self.listen, self.port)
        tcp.listen(128)
        self._tcp = await asyncio.start_server(self._serve_tcp, sock=tcp)
        log.info("resolver_started", listen=self.listen, upstreams=[u.host for u in self.upstreams])

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await self._tcp.wait_closed()

    # -- answering ------------------------------------------------------------------------------

    async def answer(self, data: bytes, source: str) -> bytes | None:
        try:
            query = DNSRecord.parse(data)
        except Exception:
            return None  # not DNS: no answer
        if not query.questions:
            return _reply(query, RCODE.FORMERR)
        qname = str(query.q.qname).lower().rstrip(".")
        decision = self.decide(source, qname)
        if decision == "unknown":
            return _reply(query, RCODE.REFUSED)
        if decision == "deny":
            return _reply(query, RCODE.NXDOMAIN)
        raw = await self._forward(data)
        if raw is None:
            return _reply(query, RCODE.SERVFAIL)
        if callable(decision):
            try:
                answer = DNSRecord.parse(raw)
            except Exception:
                return _reply(query, RCODE.SERVFAIL)
            addresses = [(str(rr.rdata), int(rr.ttl)) for rr in answer.rr if rr.rtype == QTYPE.A]
            if addresses:
                try:
                    await decision(addresses)
                except Exception as exc:  # an address we could not admit must not be handed out
                    log.warning("resolver_admit_failed", name=qname, error=str(exc))
                    return _reply(query, RCODE.SERVFAIL)
        return raw

    async def _forward(self, data: bytes) -> bytes | None:
        """UDP first (also for a sandbox that asked over TCP); TCP when the answer was truncated."""
        for upstream in self.upstreams:
            try:
                raw = await _udp_exchange(data, upstream)
                if not DNSRecord.parse(raw).header.tc:
                    return raw
                return await _tcp_exchange(data, upstream)
            except (OSError, TimeoutError, ValueError, struct.error) as exc:
                log.debug("upstream_failed", upstream=upstream.host, error=repr(exc))
            except Exception as exc:  # a malformed upstream answer: try the next one
                log.debug("upstream_bad_answer", upstream=upstream.host, error=repr(exc))
        return None

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        try:
            while True:
                async with asyncio.timeout(TCP_IDLE_S):
                    (length,) = struct.unpack("!H", await reader.readexactly(2))
                    data = await reader.readexactly(length)
                reply = await self.answer(data, source)
                if reply is None:
                    break
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self.transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            reply = await self.resolver.answer(data, addr[0])
        except Exception as exc:
            log.warning("resolver_error", error=repr(exc))
            return
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


def _reply(query: DNSRecord, rcode: int) -> bytes:
    reply = query.reply()
    reply.header.rcode = rcode
    reply.header.ra = 1
    return bytes(reply.pack())


def _bound_socket(kind: int, address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        sock.setblocking(False)
        sock.bind((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def _udp_exchange(data: bytes, upstream: Upstream) -> bytes:
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in upstream.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, (upstream.host, upstream.port))
        await loop.sock_sendall(sock, data)
        async with asyncio.timeout(UPSTREAM_TIMEOUT_S):
            while True:
                raw = await loop.sock_recv(sock, 65535)
                if raw[:2] == data[:2]:  # the same query id
                    return raw


async def _tcp_exchange(data: bytes, upstream: Upstream) -> bytes:
    async with asyncio.timeout(UPSTREAM_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(upstream.host, upstream.port)
        try:
            writer.write(struct.pack("!H", len(data)) + data)
            await writer.drain()
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(length)
        finally:
            writer.close()
