"""The ingress reverse proxy: an asyncio HTTP/1.1 server that relays each request to a sandbox port.

One client connection is served by one loop: read a request head, route it by ``Host``
(``routing.Router``), dial ``<sandbox ip>:<port>`` (kept open for the next request on the same client
connection while it goes to the same place), write the head, send the body while the response is read,
send the response back. Every message is parsed by llhttp (``http1``) and re-framed on the way out;
bodies are streamed, never buffered whole. A ``101 Switching Protocols``
answer (WebSocket) turns the connection into a byte splice in both directions.

Right after a wake (``Route.settle_until``, ``routing.WAKE_SETTLE_S``) a refused connect, and an
idempotent bodiless request that the app drops unanswered, are tried again every ``SETTLE_RETRY_S`` or so
until the window ends: a visitor does not get a 502 because the sandbox was paused. Outside that window
a refused connect is the ``NOTHING_LISTENING`` 502 at once, and an unanswered request is sent
``UNANSWERED_TRIES`` times in all.

A sweep every ``SWEEP_S`` cuts exchanges in flight with sandboxes that were destroyed or whose ingress
was turned off, so a long WebSocket, stream or upload does not outlive the permission; one whose answer
had not begun gets the proxy's page (``SANDBOX_NOT_FOUND``, ``INGRESS_DISABLED``) before the close. A
keep-alive connection idle between requests is left open: it carries nothing to the sandbox, and its
next request is routed afresh and answered with that page. Cutting it raced with a client that was
sending that request, which then saw the connection dropped without an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from paddock_controlplane.edge.e2b import identity as e2b_identity
from paddock_controlplane.edge.ingress import http1, pages
from paddock_controlplane.edge.ingress.routing import IngressError, Router, Target, parse_host
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import desktop_access
from paddock_controlplane.sandboxes.activity import Inflight, touch
from paddock_core.logging import get_logger
from paddock_core.serving import HEADER_TIMEOUT_S

#: E2B's header for a sandbox's traffic token (``trafficAccessToken``), sent by E2B's users to its URLs.
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"

log = get_logger("paddock.ingress")

SWEEP_S = 1.0
#: Requests that may be sent twice when a reused upstream connection turns out to be closed (RFC 9110).
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
#: After the response, how long the request body may still take before the connection is closed.
BODY_GRACE_S = 1.0
#: After refusing a malformed request: how long, and how much, of what the client still sends is read
#: and dropped before the close, so the close does not reset the connection under the unread answer.
LINGER_S = 1.0
#: How long the page of a request the sweep cut (not answered yet) may take to go out.
CUT_PAGE_S = 1.0
LINGER_BYTES = 1 << 20
READ_DROP_BYTES = 64 * 1024
FORWARDED_HEADERS = frozenset({"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"})
#: How the E2B edge is told which sandbox and port a request is for (``_open_edge``).
EDGE_TARGET_HEADERS = frozenset({"e2b-sandbox-id", "e2b-sandbox-port"})
#: Within a wake's settle window: the first and the longest pause between tries at the app.
SETTLE_RETRY_S = 0.05
SETTLE_RETRY_MAX_S = 0.5
#: Outside a wake's window: how many times in all an idempotent bodiless request is sent when the app
#: closes fresh connections without a byte of answer, the last after a ``SETTLE_RETRY_S`` pause. Two
#: were not enough for an app under gVisor on a loaded host (a full run's 502 on
#: tests/integration/test_network_tiers.py's ingress test, its two tries both dropped unread).
UNANSWERED_TRIES = 3


@dataclass
class Upstream:
    target: Target
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    responses: http1.ResponseReader
    #: Carried an earlier request: the app may have closed it while idle, so an idempotent bodiless
    #: request that gets no answer at all on it is retried once on a fresh connection.
    reused: bool = False
    #: Over TLS to an app that serves HTTPS itself (E2B's ``httpsPorts``).
    tls: bool = False

    @property
    def usable(self) -> bool:
        return (
            self.responses.clean
            and not self.responses.broken
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        self.writer.close()


_BACKEND_TLS: ssl.SSLContext | None = None


def backend_tls() -> ssl.SSLContext:
    """TLS to an app in a sandbox that serves HTTPS itself (E2B's ``httpsPorts``). Its certificate is not
    checked, as on E2B: it is the app's own, often self-signed, and the hop goes to the sandbox's
    address the control plane assigned, never to one a tenant names."""
    global _BACKEND_TLS
    if _BACKEND_TLS is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["http/1.1"])
        _BACKEND_TLS = context
    return _BACKEND_TLS


class RequestRejectedError(Exception):
    """The client's request body turned out malformed after its head was sent on (-> 400, both closed)."""

    def __init__(self, error: http1.ProtocolError) -> None:
        super().__init__(str(error))
        self.error = error


class H2Connection(Protocol):
    """One client connection that chose h2, served to its end (``http2.H2ClientConnection``)."""

    async def run(self) -> None: ...

    async def close(self) -> None: ...


#: Makes the h2 side of a TLS connection. The composition (``ingress.start``) hands it in, so this module
#: does not import ``http2``, which builds on this one; a proxy without it offers only http/1.1.
H2Factory = Callable[["IngressProxy", asyncio.StreamReader, asyncio.StreamWriter], H2Connection]


class IngressProxy:
    def __init__(self, services: Services, router: Router, h2: H2Factory | None = None) -> None:
        self.services = services
        self._h2 = h2
        self.settings = services.settings
        self.router = router
        self.servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.Task[None], str] = {}  # task -> sandbox id it currently serves
        #: Tasks the sweep cancelled, with the refusal that cut them (for the page of an unanswered request).
        self._cuts: dict[asyncio.Task[None], IngressError] = {}
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
            self._tls.set_alpn_protocols(["h2", "http/1.1"] if self._h2 is not None else ["http/1.1"])
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

    def cut_by_sweep(self, task: asyncio.Task[None]) -> IngressError | None:
        """Why the sweep cancelled ``task`` (the sandbox's refusal), or None if it did not."""
        return self._cuts.get(task)

    def done(self, task: asyncio.Task[None]) -> None:
        """An HTTP/2 stream's task has ended (connection tasks are dropped by ``_serve``)."""
        self._connections.pop(task, None)
        self._cuts.pop(task, None)

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
                for key in set(self._connections.values()) - {""}:
                    refusal = await self.router.refusal(key)
                    if refusal is not None:
                        for task, serving in list(self._connections.items()):
                            if serving == key:
                                self._cuts[task] = refusal
                                task.cancel()
                        log.info("ingress_connections_cut", sandbox_id=key, code=refusal.code)
            except Exception:
                log.exception("ingress_sweep_failed")

    # -- one client connection -------------------------------------------------------------------

    async def _plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, "http")

    async def _secure(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tls = writer.get_extra_info("ssl_object")
        if tls is not None and tls.selected_alpn_protocol() == "h2" and self._h2 is not None:
            await self._serve_h2(self._h2, reader, writer)
        else:
            await self._serve(reader, writer, "https")

    async def _serve_h2(
        self, h2: H2Factory, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = ""
        connection = h2(self, reader, writer)
        try:
            await connection.run()
        except (TimeoutError, asyncio.CancelledError, ConnectionError, OSError):
            pass
        except Exception:
            log.exception("ingress_connection_failed", protocol="h2")
        finally:
            self._connections.pop(task, None)
            await connection.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, scheme: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = ""
        connection = _Connection(self, reader, writer, scheme, task)
        try:
            await connection.run()
        except asyncio.CancelledError:
            cut = self.cut_by_sweep(task)
            if cut is not None and not connection.responded:  # the sweep's, not a stop's: the page
                connection.drop_upstream()
                with contextlib.suppress(TimeoutError, ConnectionError, OSError):
                    async with asyncio.timeout(CUT_PAGE_S):
                        await connection.fail(cut.status, cut.code, cut.message)
                    await connection.linger()
        except (TimeoutError, ConnectionError, OSError):
            pass
        except Exception:
            log.exception("ingress_connection_failed")
            await connection.fail(502, "PROXY_ERROR", "the ingress proxy could not relay this request")
        finally:
            self._connections.pop(task, None)
            self._cuts.pop(task, None)
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
        self.requests = http1.RequestReader(reader)
        self.scheme = scheme
        self.task = task
        peer = writer.get_extra_info("peername")
        self.client_ip = str(peer[0]) if peer else ""
        self.upstream: Upstream | None = None
        self.accept: str | None = None
        self.head_only = False
        self.responded = False  # a response head went out for the current request
        #: Monotonic end of the target's wake settle window for the current request (0.0: none).
        self.settle_until = 0.0
        #: The ``Host`` the app gets in place of the client's (E2B's ``maskRequestHost``), or None.
        self.upstream_host: str | None = None
        #: The app serves HTTPS itself (E2B's ``httpsPorts``): the upstream connection is TLS.
        self.upstream_tls = False

    def close(self) -> None:
        if self.upstream:
            self.upstream.close()
        self.writer.close()

    def drop_upstream(self) -> None:
        if self.upstream:
            self.upstream.close()
            self.upstream = None

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

    async def linger(self) -> None:
        """Ends our side, then drops what the client still sends for a moment (a lingering close)."""
        if self.writer.can_write_eof():
            with contextlib.suppress(OSError):
                self.writer.write_eof()
        budget = LINGER_BYTES
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while budget > 0 and (data := await self.reader.read(READ_DROP_BYTES)):
                    budget -= len(data)

    async def run(self) -> None:
        # A new connection's first request must arrive whole within the head bound, as on the
        # services' listeners (serving.HEADER_TIMEOUT_S); between requests a connection may stay idle
        # for ingress_idle_timeout_s, and each further head again has the head bound from its first
        # byte. Past either the connection is closed without an answer (TimeoutError, in _serve).
        idle_s = HEADER_TIMEOUT_S
        while True:
            self.proxy.serving(self.task, "")  # idle: the sweep leaves it (module docstring)
            self.responded = False
            try:
                request = await self.requests.read_request(idle_s=idle_s, head_s=HEADER_TIMEOUT_S)
                idle_s = self.settings.ingress_idle_timeout_s
            except http1.ProtocolError as exc:
                await self.fail(exc.status, exc.code, str(exc))
                return await self.linger()
            if request is None:
                return
            self.accept = request.get("accept")
            self.head_only = request.method == "HEAD"
            try:
                target = await self._open(request)
            except IngressError as exc:
                return await self.fail(exc.status, exc.code, exc.message)
            with Inflight(self.proxy.services, target.sandbox_id):
                keep_alive = await self._exchange(request)
            if not keep_alive:
                return

    async def _open(self, request: http1.Request) -> Target:
        """Routes the request (by ``Host``, waking a paused sandbox) and dials the app; raises IngressError."""
        target = self._target(request)
        edge = e2b_identity.edge_address(self.settings)
        if edge is not None and target.port in e2b_identity.EDGE_PORTS:
            return await self._open_edge(request, target, edge)
        live_view = self._live_view(request, target)
        traffic_token = self._traffic_token(request, target)
        route = await self.proxy.router.resolve(target.sandbox_id, live_view=live_view or traffic_token)
        if (
            route.desktop
            and target.port in desktop_access.NOVNC_PORTS
            and not (live_view or traffic_token or (route.e2b and route.ingress_enabled))
        ):
            # An E2B-made desktop with public traffic serves e2b-desktop's stream here, whose URL
            # carries no token (noVNC's own password, require_auth, still applies): docs/e2b.md.
            raise IngressError(
                401,
                "LIVE_VIEW_TOKEN_REQUIRED",
                "the live view of a desktop opens only through a link from its connect call",
            )
        via = "#live" if live_view else "#token" if traffic_token else ""
        self.proxy.serving(self.task, target.sandbox_id + via)
        self.settle_until = route.settle_until
        self.upstream_host = route.ports.host_for(target.port)
        self.upstream_tls = route.ports.tls(target.port)
        await self._dial(target, str(route.ip))
        return target

    async def _open_edge(self, request: http1.Request, target: Target, edge: tuple[str, int]) -> Target:
        """E2B's envd and code interpreter of a sandbox (``49983-<id>``, ``49999-<id>``): served by the E2B
        edge of this process, not by the sandbox, so E2B's SDK reaches them at E2B's own addresses,
        without ``E2B_SANDBOX_URL`` (which its next major version drops). The edge finds the sandbox in
        ``E2b-Sandbox-Id``/``-Port``, set here from the host name (a client's own are dropped), and
        checks the sandbox's token itself; the ingress's rule for ports does not apply."""
        request.headers = [(k, v) for k, v in request.headers if k.lower() not in EDGE_TARGET_HEADERS]
        request.headers += [("E2b-Sandbox-Id", target.sandbox_id), ("E2b-Sandbox-Port", str(target.port))]
        self.proxy.serving(self.task, target.sandbox_id + "#e2b")
        self.settle_until, self.upstream_host, self.upstream_tls = 0.0, None, False
        await self._dial(target, edge[0], port=edge[1])
        return target

    def _target(self, request: http1.Request) -> Target:
        authority = request.get("host")
        if request.target.startswith(("http://", "https://")):  # absolute form wins over Host
            rest = request.target.split("://", 1)[1]
            authority, slash, path = rest.partition("/")
            request.target = slash + path or "/"
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

    def _live_view(self, request: http1.Request, target: Target) -> bool:
        """A request under ``/paddock-vnc/<token>/`` (desktop_access): checks the token and strips the
        prefix, or refuses it with 403. False for any other request."""
        split = desktop_access.split_path(request.target)
        if split is None:
            return False
        token, request.target = split
        try:
            desktop_access.check(self.settings, token, target.sandbox_id, target.port)
        except desktop_access.TokenRefusedError as exc:
            raise IngressError(403, "LIVE_VIEW_TOKEN_REFUSED", str(exc)) from None
        return True

    def _traffic_token(self, request: http1.Request, target: Target) -> bool:
        """E2B's ``e2b-traffic-access-token``: the sandbox's token (what its E2B create answered) opens
        its ports with ingress off too, as E2B's proxy does for a sandbox without public traffic. The
        header is taken off the request either way, so the app never sees the token. A wrong token
        is 403."""
        presented = request.get(TRAFFIC_TOKEN_HEADER)
        if presented is None:
            return False
        request.headers = [(k, v) for k, v in request.headers if k.lower() != TRAFFIC_TOKEN_HEADER]
        if not e2b_identity.check_envd_access_token(self.settings, target.sandbox_id, presented):
            raise IngressError(403, "TRAFFIC_TOKEN_REFUSED", f"{TRAFFIC_TOKEN_HEADER} is not this sandbox's")
        return True

    async def _dial(self, target: Target, address: str, *, port: int | None = None) -> None:
        """Connects to ``address`` at the target's port (``port``: another one, the E2B edge's)."""
        if self.upstream and (
            self.upstream.target != target
            or self.upstream.address != address
            or self.upstream.tls != self.upstream_tls
            or not self.upstream.usable
        ):
            self.drop_upstream()
        if self.upstream:
            self.upstream.reused = True
            return
        delay = SETTLE_RETRY_S
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        address,
                        port or target.port,
                        limit=http1.STREAM_LIMIT_BYTES,
                        ssl=backend_tls() if self.upstream_tls else None,
                    ),
                    self.settings.ingress_connect_timeout_s,
                )
                break
            except ConnectionRefusedError:
                if await self._settle_pause(delay):  # a thawed app not listening again yet
                    delay = min(delay * 2, SETTLE_RETRY_MAX_S)
                    continue
                raise IngressError(
                    502, "NOTHING_LISTENING", f"nothing is listening on port {target.port} in the sandbox"
                ) from None
            except (TimeoutError, OSError) as exc:
                raise IngressError(
                    502, "SANDBOX_UNREACHABLE", f"could not reach port {target.port} in the sandbox ({exc!s})"
                ) from None
        self.upstream = Upstream(
            target, address, reader, writer, http1.ResponseReader(reader), tls=self.upstream_tls
        )

    async def _settle_pause(self, delay: float) -> bool:
        """Within the current request's wake settle window: waits ``delay`` (never past the window's
        end) and returns True, to try the app again. Outside it: False at once."""
        left = self.settle_until - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(delay, left))
        return True

    def _forwarded_head(self, request: http1.Request) -> bytes:
        """The parsed head re-encoded, plus ``X-Forwarded-For/-Proto/-Host`` (client-sent ``-Proto/-Host``
        dropped, ``-For`` extended)."""
        prior = request.get("x-forwarded-for")
        extra = [
            ("X-Forwarded-For", f"{prior}, {self.client_ip}" if prior else self.client_ip),
            ("X-Forwarded-Proto", self.scheme),
            ("X-Forwarded-Host", request.get("host") or ""),
        ]
        if self.upstream_host is not None:  # the client's Host stays in X-Forwarded-Host
            return request.encode([("Host", self.upstream_host), *extra], FORWARDED_HEADERS | {"host"})
        return request.encode(extra, FORWARDED_HEADERS)

    async def _send_and_answer(
        self, request: http1.Request
    ) -> tuple[Upstream, http1.Response | None, asyncio.Task[bool] | None]:
        """Sends ``request`` to the app (an idempotent one without a body is resent once on a stale
        connection), its body in a task (``_send_body``), and reads the app's final answer: what an
        HTTP/1.1 exchange and each HTTP/2 stream share. The answer is ``None`` when the client has
        been answered already."""
        upstream = self.upstream
        assert upstream is not None
        touch(self.proxy.services, upstream.target.sandbox_id)
        forwarded = self._forwarded_head(request)
        upstream.responses.begin(request.method)
        first: http1.Response | None = None
        if not request.has_body and request.method in IDEMPOTENT:
            first = await self._send_retrying(upstream, forwarded, request.method)
            if first is None:
                return upstream, None, None
            assert self.upstream is not None
            upstream = self.upstream
        else:
            upstream.writer.write(forwarded)
        body = asyncio.create_task(self._send_body(request, upstream)) if request.has_body else None
        try:
            return upstream, await self._final_response(upstream, first, body), body
        except BaseException:
            if body is not None:
                body.cancel()
            raise

    async def _exchange(self, request: http1.Request) -> bool:
        """Relays one request and its response; returns whether the client connection stays open."""
        assert self.upstream is not None
        upstream = self.upstream
        started = time.perf_counter()
        body: asyncio.Task[bool] | None = None
        status = 0
        try:
            upstream, response, body = await self._send_and_answer(request)
            if response is None:
                return False
            status = response.status
            if response.status == 101:
                if not request.upgrade:
                    raise http1.ProtocolError(
                        "101 Switching Protocols to a request that asked for no upgrade"
                    )
                self.writer.write(response.encode() + upstream.responses.take_upgrade())
                self.responded = True
                await self.writer.drain()
                upstream.writer.write(self.requests.take_upgrade())
                await self._splice(upstream)
                return False
            keep_alive = request.keep_alive and response.keep_alive
            if request.version == "1.0" and "keep-alive" not in response.tokens("connection"):
                keep_alive = False  # a 1.0 client keeps the connection only if the answer says so
            self.writer.write(response.encode())
            self.responded = True
            await self._relay_response_body(upstream, response)
            if response.until_close:
                keep_alive = False
            if body:
                await asyncio.wait({body}, timeout=BODY_GRACE_S)
                if not body.done() or body.exception() or not body.result():
                    keep_alive = False  # the app answered before the client finished sending
            return keep_alive
        except RequestRejectedError as exc:
            self.drop_upstream()  # the app has a truncated request: this connection is spent
            await self.fail(exc.error.status, exc.error.code, str(exc.error))
            await self.linger()
            return False
        except http1.ProtocolError as exc:
            self.drop_upstream()
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

    async def _send_body(self, request: http1.Request, upstream: Upstream) -> bool:
        """Sends the request body as the parser decoded it, re-framed; False if the app stopped reading.

        Raises ProtocolError if the client's body is malformed: nothing after the bad byte is sent."""
        writer = upstream.writer
        chunked = request.chunked
        try:
            while (piece := await self.requests.read_body_piece()) is not None:
                writer.writelines(http1.frame(piece, chunked))
                await writer.drain()
            if chunked:
                writer.write(http1.end_of_body(chunked, []))  # request trailers are not passed on
                await writer.drain()
        except (ConnectionError, OSError):
            return False  # the app closed: its response (or its absence) tells the client
        return True

    async def _relay_response_body(self, upstream: Upstream, response: http1.Response) -> None:
        responses, writer, chunked = upstream.responses, self.writer, response.chunked
        while (piece := await responses.read_body_piece()) is not None:
            writer.writelines(http1.frame(piece, chunked))
            await writer.drain()
        if chunked:
            writer.write(http1.end_of_body(chunked, responses.trailers))
        if response.until_close and writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()
        await writer.drain()

    async def _send_retrying(
        self, upstream: Upstream, forwarded: bytes, method: str
    ) -> http1.Response | None:
        """Sends a bodiless idempotent request; if the app closes the connection without a byte of answer,
        sends it again on a fresh one (RFC 9110 §9.2.2 allows it): ``UNANSWERED_TRIES`` times in all, and
        within a wake's settle window with growing pauses until the window ends. Returns the response head, or None once the
        client has been answered with the proxy's 502 (the upstream is dropped then).

        On a reused connection that is the app's keep-alive timer firing as the request arrives. On a
        fresh one it is an app that dropped the request unread: under gVisor (Debian's 2022 runsc) a
        blocking read that comes before the request's bytes fails with EAGAIN, and an app that reads as
        soon as it accepts closes. Right after a thaw, on a loaded host, that happens to several tries in
        a row, so one retry is not enough there."""
        tries = 0
        delay = SETTLE_RETRY_S
        while True:
            tries += 1
            try:
                upstream.writer.write(forwarded)
                head = await upstream.responses.read_head()
            except ConnectionError:
                head = None
            if head is not None:
                return head
            self.drop_upstream()
            log.info("ingress_retry_unanswered", sandbox_id=upstream.target.sandbox_id, tries=tries)
            if tries >= 2:
                if await self._settle_pause(delay):
                    delay = min(delay * 2, SETTLE_RETRY_MAX_S)
                elif tries < UNANSWERED_TRIES:
                    await asyncio.sleep(SETTLE_RETRY_S)
                else:
                    await self.fail(
                        502, "EMPTY_UPSTREAM_RESPONSE", "the sandbox closed the connection without a response"
                    )
                    return None
            try:
                await self._dial(upstream.target, upstream.address)
            except IngressError as exc:
                await self.fail(exc.status, exc.code, exc.message)
                return None
            assert self.upstream is not None
            upstream = self.upstream
            upstream.responses.begin(method)

    async def _final_response(
        self, upstream: Upstream, first: http1.Response | None, body: asyncio.Task[bool] | None
    ) -> http1.Response | None:
        """The final (or 101) response head; interim 1xx answers are passed on as they come. While it
        is awaited, a malformed request body raises RequestRejectedError."""
        response = first
        while True:
            if response is None:
                response = await self._next_head(upstream, body)
            if response is None:
                await self.fail(
                    502, "EMPTY_UPSTREAM_RESPONSE", "the sandbox closed the connection without a response"
                )
                return None
            if 100 <= response.status < 200 and response.status != 101:
                await self._interim(response)
                response = None
                continue
            return response

    async def _interim(self, response: http1.Response) -> None:
        """Passes an interim (1xx) response on to the client."""
        self.writer.write(response.encode())
        await self.writer.drain()

    async def _next_head(self, upstream: Upstream, body: asyncio.Task[bool] | None) -> http1.Response | None:
        if body is None or body.done():
            if body is not None and isinstance(body.exception(), http1.ProtocolError):
                raise RequestRejectedError(body.exception())  # type: ignore[arg-type]
            return await upstream.responses.read_head()
        reading = asyncio.ensure_future(upstream.responses.read_head())
        done, _ = await asyncio.wait({reading, body}, return_when=asyncio.FIRST_COMPLETED)
        if reading in done:
            return reading.result()
        error = body.exception()
        if isinstance(error, http1.ProtocolError):
            reading.cancel()
            raise RequestRejectedError(error)
        return await reading

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
