"""The ingress reverse proxy: an asyncio HTTP/1.1 server that relays each request to a sandbox port.

One client connection is served by one loop: read a request head, route it by ``Host``
(``routing.Router``), dial ``<sandbox ip>:<port>`` (kept open for the next request on the same client
connection while it goes to the same place), write the head, copy the body while the response is read,
copy the response back. Bodies are streamed, never buffered whole. A ``101 Switching Protocols``
answer (WebSocket) turns the connection into a byte splice in both directions.

A sweep every ``SWEEP_S`` cuts open connections to sandboxes that were destroyed or whose ingress was
turned off, so a long WebSocket or keep-alive connection does not outlive the permission.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from paddock_controlplane.execution import Inflight, touch
from paddock_controlplane.ingress import http1, pages
from paddock_controlplane.ingress.routing import IngressError, Router, Target, parse_host
from paddock_controlplane.services import Services
from paddock_core.logging import get_logger

log = get_logger("paddock.ingress")

SWEEP_S = 1.0
#: Requests that may be sent twice when a reused upstream connection turns out to be closed (RFC 9110).
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
#: After the response, how long the request body may still take before the connection is closed.
BODY_GRACE_S = 1.0
FORWARDED_HEADERS = ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host")


@dataclass
class Upstream:
    target: Target
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: Carried an earlier request: the app may have closed it while idle, so an idempotent bodiless
    #: request that gets no answer at all on it is retried once on a fresh connection.
    reused: bool = False

    @property
    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class IngressProxy:
    def __init__(self, services: Services, router: Router) -> None:
        self.services = services
        self.settings = services.settings
        self.router = router
        self.servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.Task[None], str] = {}  # task -> sandbox id it currently serves
        self._sweeper: asyncio.Task[None] | None = None
        self._tls: ssl.SSLContext | None = None
        self._tls_mtimes: tuple[float, float] = (0.0, 0.0)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> list[tuple[str, str, int]]:
        """Opens the configured listeners; returns (scheme, host, port) of each."""
        host = self.settings.ingress_host or self.settings.host
        opened: list[tuple[str, str, int]] = []
        if self.settings.ingress_port:
            server = await asyncio.start_server(
                self._plain,
                host,
                self.settings.ingress_port,
                limit=http1.STREAM_LIMIT_BYTES,
                reuse_address=True,
            )
            self.servers.append(server)
            opened.append(("http", host, server.sockets[0].getsockname()[1]))
        if self.settings.ingress_tls_port:
            self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._tls.set_alpn_protocols(["http/1.1"])
            self._reload_certificate()
            server = await asyncio.start_server(
                self._secure,
                host,
                self.settings.ingress_tls_port,
                limit=http1.STREAM_LIMIT_BYTES,
                reuse_address=True,
                ssl=self._tls,
                ssl_handshake_timeout=10,
            )
            self.servers.append(server)
            opened.append(("https", host, server.sockets[0].getsockname()[1]))
        if self.servers:
            self._sweeper = asyncio.create_task(self._sweep())
        for scheme, bound, port in opened:
            log.info("ingress_listening", scheme=scheme, host=bound, port=port)
        return opened

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        if self._sweeper:
            self._sweeper.cancel()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    def serving(self, task: asyncio.Task[None], sandbox_id: str) -> None:
        self._connections[task] = sandbox_id

    def _reload_certificate(self) -> None:
        cert, key = self.settings.ingress_tls_cert_file, self.settings.ingress_tls_key_file
        assert self._tls is not None and cert is not None and key is not None
        mtimes = (Path(cert).stat().st_mtime, Path(key).stat().st_mtime)
        if mtimes != self._tls_mtimes:
            self._tls.load_cert_chain(str(cert), str(key))
            self._tls_mtimes = mtimes
            log.info("ingress_certificate_loaded", cert_file=str(cert))

    async def _sweep(self) -> None:
        last_cert_check = time.monotonic()
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                if self._tls and time.monotonic() - last_cert_check > 30:
                    last_cert_check = time.monotonic()
                    self._reload_certificate()
                for sandbox_id in set(self._connections.values()) - {""}:
                    if not await self.router.still_open(sandbox_id):
                        for task, serving in list(self._connections.items()):
                            if serving == sandbox_id:
                                task.cancel()
                        log.info("ingress_connections_cut", sandbox_id=sandbox_id)
            except Exception:
                log.exception("ingress_sweep_failed")

    # -- one client connection -------------------------------------------------------------------

    async def _plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, "http")

    async def _secure(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, "https")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, scheme: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = ""
        connection = _Connection(self, reader, writer, scheme, task)
        try:
            await connection.run()
        except (TimeoutError, asyncio.CancelledError, ConnectionError, OSError):
            pass
        except Exception:
            log.exception("ingress_connection_failed")
            await connection.fail(502, "PROXY_ERROR", "the ingress proxy could not relay this request")
        finally:
            self._connections.pop(task, None)
            connection.close()


class _Connection:
    def __init__(
        self,
        proxy: IngressProxy,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        scheme: str,
        task: asyncio.Task[None],
    ) -> None:
        self.proxy = proxy
        self.settings = proxy.settings
        self.reader, self.writer = reader, writer
        self.scheme = scheme
        self.task = task
        peer = writer.get_extra_info("peername")
        self.client_ip = str(peer[0]) if peer else ""
        self.upstream: Upstream | None = None
        self.accept: str | None = None
        self.head_only = False
        self.responded = False  # a response head went out for the current request

    def close(self) -> None:
        if self.upstream:
            self.upstream.close()
        self.writer.close()

    async def fail(self, status: int, code: str, message: str) -> None:
        """Answers the current request with the proxy's own page (only if nothing was sent yet)."""
        if self.responded or self.writer.is_closing():
            return
        self.responded = True
        with contextlib.suppress(ConnectionError, OSError):
            self.writer.write(
                pages.render(status, code, message, accept=self.accept, head_only=self.head_only)
            )
            await self.writer.drain()

    async def run(self) -> None:
        while True:
            self.responded = False
            try:
                head = await asyncio.wait_for(
                    http1.read_head(self.reader), self.settings.ingress_idle_timeout_s
                )
                if head is None:
                    return
                request = http1.parse_request(head)
                self.accept = request.head.get("accept")
                self.head_only = request.method == "HEAD"
                framing = http1.request_framing(request)
            except http1.ProtocolError as exc:
                return await self.fail(400, "BAD_REQUEST", str(exc))
            try:
                target = self._target(request)
                route = await self.proxy.router.resolve(target.sandbox_id)
                self.proxy.serving(self.task, target.sandbox_id)
                await self._dial(target, str(route.ip))
            except IngressError as exc:
                return await self.fail(exc.status, exc.code, exc.message)
            with Inflight(self.proxy.services, target.sandbox_id):
                keep_alive = await self._exchange(request, framing)
            if not keep_alive:
                return

    def _target(self, request: http1.Request) -> Target:
        authority = request.head.get("host")
        if request.target.startswith(("http://", "https://")):  # absolute form wins over Host
            rest = request.target.split("://", 1)[1]
            authority, slash, path = rest.partition("/")
            request.target = slash + path or "/"
            request.head.start = f"{request.method} {request.target} {request.version}"
        if not authority:
            raise IngressError(400, "BAD_REQUEST", "the request has no Host header")
        target = parse_host(authority, self.settings.ingress_domain)
        if target is None:
            raise IngressError(
                404,
                "UNKNOWN_HOST",
                f"{authority} is not a sandbox address; use <port>-<sandbox id>.{self.settings.ingress_domain}",
            )
        return target

    async def _dial(self, target: Target, address: str) -> None:
        if self.upstream and (
            self.upstream.target != target or self.upstream.address != address or not self.upstream.usable
        ):
            self.upstream.close()
            self.upstream = None
        if self.upstream:
            self.upstream.reused = True
            return
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(address, target.port, limit=http1.STREAM_LIMIT_BYTES),
                self.settings.ingress_connect_timeout_s,
            )
        except ConnectionRefusedError:
            raise IngressError(
                502, "NOTHING_LISTENING", f"nothing is listening on port {target.port} in the sandbox"
            ) from None
        except (TimeoutError, OSError) as exc:
            raise IngressError(
                502, "SANDBOX_UNREACHABLE", f"could not reach port {target.port} in the sandbox ({exc!s})"
            ) from None
        self.upstream = Upstream(target, address, reader, writer)

    def _forwarded_head(self, request: http1.Request) -> bytes:
        """The head as received, plus ``X-Forwarded-For/-Proto/-Host`` (client-sent ``-Proto/-Host`` dropped)."""
        prior = request.head.get("x-forwarded-for")
        headers = [(k, v) for k, v in request.head.headers if k.lower() not in FORWARDED_HEADERS]
        headers.append(("X-Forwarded-For", f"{prior}, {self.client_ip}" if prior else self.client_ip))
        headers.append(("X-Forwarded-Proto", self.scheme))
        headers.append(("X-Forwarded-Host", request.head.get("host") or ""))
        return http1.Head(request.head.start, headers).encode()

    async def _exchange(self, request: http1.Request, framing: http1.Framing) -> bool:
        """Relays one request and its response; returns whether the client connection stays open."""
        assert self.upstream is not None
        upstream = self.upstream
        started = time.perf_counter()
        touch(self.proxy.services, upstream.target.sandbox_id)
        forwarded = self._forwarded_head(request)
        head: http1.Head | None = None
        if framing == http1.NO_BODY and upstream.reused and request.method in IDEMPOTENT:
            head = await self._send_retrying(upstream, forwarded)
            if self.upstream is None:
                return False
            upstream = self.upstream
        else:
            upstream.writer.write(forwarded)
        body: asyncio.Task[None] | None = None
        if framing != http1.NO_BODY:
            body = asyncio.create_task(http1.copy_body(self.reader, upstream.writer, framing))
        status = 0
        try:
            response = await self._response_head(upstream, head)
            if response is None:
                return False
            status = response.status
            if response.status == 101:
                self.writer.write(response.head.encode())
                await self.writer.drain()
                self.responded = True
                if body:
                    await body
                await self._splice(upstream)
                return False
            keep_alive = request.keep_alive and response.keep_alive
            if request.version == "HTTP/1.0" and "keep-alive" not in response.head.tokens("connection"):
                keep_alive = False  # a 1.0 client keeps the connection only if the answer says so
            response_framing = http1.response_framing(response, request.method)
            self.writer.write(response.head.encode())
            self.responded = True
            await http1.copy_body(upstream.reader, self.writer, response_framing)
            if response_framing.until_close:
                keep_alive = False
            if body:
                await asyncio.wait({body}, timeout=BODY_GRACE_S)
                if not body.done():
                    keep_alive = False  # the app answered before the client finished sending
                else:
                    body.result()
            return keep_alive
        except http1.ProtocolError as exc:
            await self.fail(502, "BAD_UPSTREAM_RESPONSE", f"the sandbox sent an invalid response: {exc}")
            return False
        finally:
            if body and not body.done():
                body.cancel()
            log.info(
                "ingress_request",
                sandbox_id=upstream.target.sandbox_id,
                port=upstream.target.port,
                method=request.method,
                status=status or None,
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
            )

    async def _send_retrying(self, upstream: Upstream, forwarded: bytes) -> http1.Head | None:
        """Sends a bodiless request on a reused connection; if the app had closed it while idle, sends
        it once more on a fresh one. Returns the response head if it was already read."""
        try:
            upstream.writer.write(forwarded)
            head = await http1.read_head(upstream.reader)
        except (ConnectionError, http1.ProtocolError):
            head = None
        if head is not None:
            return head
        upstream.close()
        self.upstream = None
        try:
            await self._dial(upstream.target, upstream.address)
        except IngressError as exc:
            await self.fail(exc.status, exc.code, exc.message)
            return None
        assert self.upstream is not None
        self.upstream.writer.write(forwarded)
        return None

    async def _response_head(self, upstream: Upstream, head: http1.Head | None) -> http1.Response | None:
        """The final (or 101) response head; interim 1xx answers are passed on as they come."""
        while True:
            head = head or await http1.read_head(upstream.reader)
            if head is None:
                await self.fail(
                    502, "EMPTY_UPSTREAM_RESPONSE", "the sandbox closed the connection without a response"
                )
                return None
            response = http1.parse_response(head)
            if 100 <= response.status < 200 and response.status != 101:
                self.writer.write(head.encode())
                await self.writer.drain()
                head = None
                continue
            return response

    async def _splice(self, upstream: Upstream) -> None:
        """Bytes both ways until both sides have closed (or either fails)."""
        directions = [
            asyncio.create_task(http1.copy_until_eof(self.reader, upstream.writer)),
            asyncio.create_task(http1.copy_until_eof(upstream.reader, self.writer)),
        ]
        try:
            pending: set[asyncio.Task[int]] = set(directions)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task.exception() for task in done):
                    break
        finally:
            for task in directions:
                task.cancel()
            await asyncio.gather(*directions, return_exceptions=True)
