"""HTTP/2 on the ingress's TLS listener (ALPN ``h2``), with the sans-I/O ``h2`` library.

One client connection runs one ``h2`` state machine (``H2ClientConnection``): a loop reads the socket,
feeds the machine, and acts on its events. Each request stream becomes one task (``_Stream``), which is
an HTTP/1.1 exchange with the app exactly as ``proxy._Connection`` makes it: the same routing by
``:authority`` (``<port>-<sandbox id>.<domain>``), the same visibility and live-view checks, the same
wake of a paused sandbox and its settle-window retries, the same llhttp parsing of the app's answer and
the same pages for the proxy's own errors. Upstream connections that end an exchange clean are kept
(at most ``IDLE_UPSTREAMS``) for the connection's next streams to the same port.

Bounds (everything the client controls):

* ``MAX_CONCURRENT_STREAMS`` streams at a time, counted as running tasks (a stream the client reset
  counts until its task has ended): a stream past it is refused with ``REFUSED_STREAM``. More than
  ``RESET_BUDGET`` streams reset by the client within ``RESET_WINDOW_S`` end the connection
  (``ENHANCE_YOUR_CALM``; the "rapid reset" attack).
* Headers: ``SETTINGS_MAX_HEADER_LIST_SIZE`` is ``http1.MAX_HEAD_BYTES``; a request over it (counted as
  RFC 9113 counts, 32 bytes per field plus names and values) gets the 431 page on its stream, and the
  connection's other streams go on. The HPACK decoder's hard limit is ``HARD_HEADER_LIST_BYTES``; a
  header block past that ends the connection (its compression state cannot be trusted any more). ``h2``
  holds at most 64 CONTINUATION frames of one block.
* Request bodies: a stream's receive window is ``STREAM_WINDOW``, the connection's ``CONNECTION_WINDOW``,
  and data is acknowledged only once it has been written to the app, so a slow app slows the client
  down and never fills the proxy's memory.
* Response bodies are sent as the client's windows allow, never queued beyond one frame per stream.
* Timeouts: the client's preface must arrive within ``HEADER_TIMEOUT_S``; a connection with no stream
  open is closed with GOAWAY after ``ingress_idle_timeout_s``, counted from the preface or the end of
  the last stream.

Not served over HTTP/2: WebSocket (RFC 8441's extended CONNECT is not offered, so clients open WebSockets
over HTTP/1.1), ``CONNECT``, server push. Request trailers are dropped, as over HTTP/1.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import deque
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
from h2.errors import ErrorCodes

from paddock_controlplane.edge.ingress import http1, pages
from paddock_controlplane.edge.ingress.proxy import (
    BODY_GRACE_S,
    CUT_PAGE_S,
    IngressProxy,
    Upstream,
    _Connection,
)
from paddock_controlplane.edge.ingress.routing import IngressError, Target
from paddock_controlplane.sandboxes.activity import Inflight
from paddock_core.logging import get_logger
from paddock_core.serving import HEADER_TIMEOUT_S

log = get_logger("paddock.ingress")

MAX_CONCURRENT_STREAMS = 100
STREAM_WINDOW = 256 * 1024
CONNECTION_WINDOW = 4 * 1024 * 1024
HARD_HEADER_LIST_BYTES = 4 * http1.MAX_HEAD_BYTES
RESET_BUDGET = 200
RESET_WINDOW_S = 10.0
IDLE_UPSTREAMS = 8
#: Hop-by-hop headers of HTTP/1.1 that HTTP/2 does not carry (RFC 9113 §8.2.2), dropped both ways.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}
)
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+")
_VALUE = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
_VISIBLE = re.compile(rb"[\x21-\x7e]+")


class _Decoder(hpack.Decoder):
    """The HPACK decoder with a fixed hard limit: ``h2`` lowers it to the advertised
    ``SETTINGS_MAX_HEADER_LIST_SIZE`` when the client acknowledges it, and a block over that would end
    the whole connection instead of answering 431 on one stream."""

    @property
    def max_header_list_size(self) -> int:
        return HARD_HEADER_LIST_BYTES

    @max_header_list_size.setter
    def max_header_list_size(self, value: int) -> None:
        pass


def _config() -> h2.config.H2Configuration:
    return h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        validate_inbound_headers=True,
        normalize_inbound_headers=True,
        validate_outbound_headers=True,
        normalize_outbound_headers=True,
    )


class H2ClientConnection:
    """One HTTP/2 client connection on the TLS listener."""

    def __init__(
        self, proxy: IngressProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.reader, self.writer = reader, writer
        peer = writer.get_extra_info("peername")
        self.client_ip = str(peer[0]) if peer else ""
        self.h2 = h2.connection.H2Connection(_config())
        self.h2.decoder = _Decoder()
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: http1.MAX_HEAD_BYTES,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        self.streams: dict[int, _Stream] = {}
        self.idle: deque[Upstream] = deque()
        self.resets: deque[float] = deque()
        self.closed = False
        self._write_scheduled = False
        #: When the last stream ended (or the connection opened): idleness is counted from there.
        self.last_active = time.monotonic()

    async def run(self) -> None:
        h2c = self.h2
        h2c.initiate_connection()
        h2c.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        await self.flush()
        idle_s = HEADER_TIMEOUT_S
        preface = True
        while True:
            # with streams open the read is only woken every idle_s to look again (no spinning)
            wait = idle_s if self.streams else max(0.0, self.last_active + idle_s - time.monotonic())
            try:
                async with asyncio.timeout(wait):
                    data = await self.reader.read(http1.READ_BYTES)
            except TimeoutError:
                if self.streams or time.monotonic() < self.last_active + idle_s:
                    continue  # requests in flight, or one ended since: not idle
                h2c.close_connection()
                await self.flush()
                return
            if not data:
                return
            try:
                events = h2c.receive_data(data)
            except h2.exceptions.ProtocolError as exc:  # h2 has queued the GOAWAY
                log.info("ingress_h2_protocol_error", error=str(exc))
                await self.flush()
                return
            for event in events:
                if isinstance(event, h2.events.ConnectionTerminated):
                    return
                self._handle(event)
                if self.closed:
                    await self.flush()
                    return
            if preface:
                # Idleness counts from the client's preface, not from the handshake: a client slow to
                # send it (a busy machine) had the idle timeout spent before its first request came.
                preface = False
                self.last_active = max(self.last_active, time.monotonic())
            idle_s = self.proxy.settings.ingress_idle_timeout_s
            await self.flush()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            assert event.stream_id is not None and event.headers is not None
            if len(self.streams) >= MAX_CONCURRENT_STREAMS:
                with contextlib.suppress(h2.exceptions.ProtocolError):  # the client may have reset it
                    self.h2.reset_stream(event.stream_id, ErrorCodes.REFUSED_STREAM)
                return
            ended = event.stream_ended is not None
            stream = _Stream(self, event.stream_id, list(event.headers), ended)
            self.streams[event.stream_id] = stream
            stream.start()
        elif isinstance(event, h2.events.DataReceived):
            assert event.stream_id is not None and event.data is not None
            receiver = self.streams.get(event.stream_id)
            if receiver is None or receiver.body_done:
                self.ack(event.stream_id, event.flow_controlled_length or 0)
            else:
                receiver.body.put_nowait((event.data, event.flow_controlled_length or 0))
        elif isinstance(event, h2.events.StreamEnded):
            assert event.stream_id is not None
            receiver = self.streams.get(event.stream_id)
            if receiver is not None:
                receiver.client_ended = True
                if not receiver.body_done:
                    receiver.body.put_nowait(None)
        elif isinstance(event, h2.events.StreamReset):
            assert event.stream_id is not None
            receiver = self.streams.get(event.stream_id)
            if receiver is not None and event.remote_reset:
                receiver.reset_by_client()
                now = time.monotonic()
                self.resets.append(now)
                while self.resets and self.resets[0] < now - RESET_WINDOW_S:
                    self.resets.popleft()
                if len(self.resets) > RESET_BUDGET:
                    log.info("ingress_h2_reset_flood", client_ip=self.client_ip)
                    self.h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
                    self.closed = True
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            if isinstance(event, h2.events.WindowUpdated) and event.stream_id:
                receiver = self.streams.get(event.stream_id)
                if receiver is not None:
                    receiver.window_open.set()
            else:
                for receiver in self.streams.values():
                    receiver.window_open.set()

    def ack(self, stream_id: int, size: int) -> None:
        """Gives ``size`` bytes of receive window back (stream and connection) once they are forwarded."""
        if size and not self.closed:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.acknowledge_received_data(size, stream_id)

    def send_pending(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def flush(self) -> None:
        self.send_pending()
        await self.writer.drain()

    async def soon(self) -> None:
        """What streams call after sending: the frames go out together at the end of this turn of the
        loop (a small answer's HEADERS, DATA and end in one TLS record), and the caller waits while
        the socket's buffer is full."""
        if not self._write_scheduled:
            self._write_scheduled = True
            asyncio.get_running_loop().call_soon(self._write_now)
        await self.writer.drain()

    def _write_now(self) -> None:
        self._write_scheduled = False
        self.send_pending()

    def take_idle(self, target: Target, address: str) -> Upstream | None:
        found = None
        for upstream in list(self.idle):
            if not upstream.usable:
                self.idle.remove(upstream)
                upstream.close()
            elif found is None and upstream.target == target and upstream.address == address:
                self.idle.remove(upstream)
                found = upstream
        return found

    def keep_idle(self, upstream: Upstream) -> None:
        self.idle.append(upstream)
        while len(self.idle) > IDLE_UPSTREAMS:
            self.idle.popleft().close()

    async def close(self) -> None:
        self.closed = True
        streams = list(self.streams.values())
        for stream in streams:
            stream.task.cancel()
        await asyncio.gather(*(stream.task for stream in streams), return_exceptions=True)
        while self.idle:
            self.idle.popleft().close()
        self.writer.close()


class _Stream(_Connection):
    """One request stream: an HTTP/1.1 exchange with the app, answered on the stream."""

    def __init__(self, conn: H2ClientConnection, stream_id: int, headers: list[Any], ended: bool) -> None:
        # _Connection's HTTP/1.1 client side (reader, writer, request parser) is not used here
        self.conn = conn
        self.proxy = conn.proxy
        self.settings = conn.proxy.settings
        self.scheme = "https"
        self.client_ip = conn.client_ip
        self.stream_id = stream_id
        self.headers = headers
        self.body: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()
        self.client_ended = ended  # the client has sent the end of its stream
        # Whether the stream ended with its headers: then there is no body. ``client_ended`` cannot say
        # so once the request is read: a client's HEADERS, DATA and END_STREAM that came in one read
        # are all handled before this stream's task first runs.
        self.bodiless = ended
        self.body_done = ended  # no more body is queued (it ended, or it is no longer read)
        self.window_open = asyncio.Event()
        self.upstream: Upstream | None = None
        self.accept: str | None = None
        self.head_only = False
        self.responded = False  # response headers went out on the stream
        self.ended = False  # our side of the stream is closed
        self.settle_until = 0.0
        self.upstream_host: str | None = None
        self.upstream_tls = False
        self.keep_upstream = False

    def start(self) -> None:
        self.task = asyncio.create_task(self._main())
        # a callback, not a finally: a task cancelled before its first step never enters its body
        self.task.add_done_callback(self._finish)

    def reset_by_client(self) -> None:
        self.ended = True
        self.task.cancel()

    async def _main(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            cut = self.proxy.cut_by_sweep(self.task)
            if cut is not None:  # not answered yet (else fail sends nothing): the page, as over HTTP/1.1
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CUT_PAGE_S):
                        await self.fail(cut.status, cut.code, cut.message)
        except (
            ConnectionError,
            OSError,
            TimeoutError,
            h2.exceptions.ProtocolError,
            http1.ProtocolError,  # the app's body broke after the head went out: the stream is reset
        ):
            pass
        except Exception:
            log.exception("ingress_stream_failed")
            with contextlib.suppress(Exception):
                await self.fail(502, "PROXY_ERROR", "the ingress proxy could not relay this request")

    def _finish(self, task: asyncio.Task[None]) -> None:
        self.conn.streams.pop(self.stream_id, None)
        self.conn.last_active = time.monotonic()
        self.proxy.done(task)
        if self.upstream is not None:
            if self.keep_upstream and not self.conn.closed:
                self.conn.keep_idle(self.upstream)
            else:
                self.upstream.close()
            self.upstream = None
        self._drain_body()
        if self.conn.closed:
            return
        if not self.ended:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.h2.reset_stream(self.stream_id, ErrorCodes.CANCEL)
        elif not self.client_ended:
            # answered before the client finished sending: it may stop (RFC 9113 §8.1)
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.h2.reset_stream(self.stream_id, ErrorCodes.NO_ERROR)
        self.conn.send_pending()

    def _drain_body(self) -> None:
        """Returns the window of body data nobody will forward, and stops queueing more."""
        self.body_done = True
        while not self.body.empty():
            item = self.body.get_nowait()
            if item is not None:
                self.conn.ack(self.stream_id, item[1])

    async def _run(self) -> None:
        try:
            request = self._request()
        except IngressError as exc:
            return await self.fail(exc.status, exc.code, exc.message)
        self.accept = request.get("accept")
        self.head_only = request.method == "HEAD"
        try:
            target = await self._open(request)
        except IngressError as exc:
            return await self.fail(exc.status, exc.code, exc.message)
        with Inflight(self.proxy.services, target.sandbox_id):
            await self._exchange_h2(request)

    def _request(self) -> http1.Request:
        """The stream's headers as the HTTP/1.1 request the app gets (``Host`` from ``:authority``)."""
        size = sum(len(name) + len(value) + 32 for name, value in self.headers)
        if size > http1.MAX_HEAD_BYTES:
            raise IngressError(
                431, "REQUEST_HEAD_TOO_LARGE", f"request headers larger than {http1.MAX_HEAD_BYTES} bytes"
            )
        pseudo: dict[bytes, bytes] = {}
        fields: list[tuple[str, str]] = []
        cookies: list[str] = []
        host: str | None = None
        length: str | None = None
        for raw_name, raw_value in self.headers:
            name, value = bytes(raw_name), bytes(raw_value)
            if name.startswith(b":"):
                pseudo[name] = value
                continue
            if not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
                raise IngressError(400, "BAD_REQUEST", "a header name or value HTTP/1.1 cannot carry")
            key, text = name.decode("latin-1"), value.decode("latin-1")
            if key in HOP_BY_HOP:
                continue
            if key == "cookie":
                cookies.append(text)  # RFC 9113 §8.2.3: joined again for HTTP/1.1
            elif key == "host":
                if host is not None:
                    raise IngressError(400, "BAD_REQUEST", "more than one Host header")
                host = text
            elif key == "content-length":
                if length is not None or not text.isdigit():
                    raise IngressError(400, "BAD_REQUEST", "a duplicate or invalid content-length")
                length = text
            else:
                fields.append((key, text))
        method = pseudo.get(b":method", b"").decode("latin-1")
        path = pseudo.get(b":path", b"")
        authority = pseudo.get(b":authority")
        if method == "CONNECT":
            raise IngressError(400, "BAD_REQUEST", "CONNECT is not served by the ingress proxy")
        if not _TOKEN.fullmatch(method.lower().encode()) or not _VISIBLE.fullmatch(path):
            raise IngressError(400, "BAD_REQUEST", "an invalid :method or :path")
        if authority is not None:
            if not _VISIBLE.fullmatch(authority):
                raise IngressError(400, "BAD_REQUEST", "an invalid :authority")
            if host is not None and host != authority.decode("latin-1"):
                raise IngressError(400, "BAD_REQUEST", "Host and :authority name different hosts")
            host = authority.decode("latin-1")
        if host is None:
            raise IngressError(400, "BAD_REQUEST", "the request has no :authority or Host")
        fields.insert(0, ("host", host))
        if cookies:
            fields.append(("cookie", "; ".join(cookies)))
        content_length = int(length) if length is not None else None
        chunked = not self.bodiless and content_length is None
        return http1.Request("1.1", fields, chunked, content_length, False, method, path.decode("latin-1"))

    # -- the app's side ------------------------------------------------------------------------------

    async def _dial(self, target: Target, address: str, *, port: int | None = None) -> None:
        if self.upstream is None:
            self.upstream = self.conn.take_idle(target, address)
        await super()._dial(target, address, port=port)

    async def _exchange_h2(self, request: http1.Request) -> None:
        assert self.upstream is not None
        upstream = self.upstream
        started = time.perf_counter()
        body: asyncio.Task[bool] | None = None
        status = 0
        try:
            upstream, response, body = await self._send_and_answer(request)
            if response is None:
                return
            status = response.status
            if response.status == 101:
                raise http1.ProtocolError("101 Switching Protocols to an HTTP/2 request")
            await self._relay_response(upstream, response)
            clean = not response.until_close
            if body:
                await asyncio.wait({body}, timeout=BODY_GRACE_S)
                clean = clean and body.done() and not body.exception() and body.result()
            self.keep_upstream = bool(clean) and upstream.usable
        except http1.ProtocolError as exc:
            self.drop_upstream()
            if self.responded:
                raise  # a broken body after the head: the stream is reset (in _main)
            await self.fail(502, "BAD_UPSTREAM_RESPONSE", f"the sandbox sent an invalid response: {exc}")
        finally:
            if body and not body.done():
                body.cancel()
            log.info(
                "ingress_request",
                sandbox_id=upstream.target.sandbox_id,
                port=upstream.target.port,
                method=request.method,
                status=status or None,
                protocol="h2",
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
            )

    async def _send_body(self, request: http1.Request, upstream: Upstream) -> bool:
        """Forwards the stream's DATA to the app, re-framed, giving window back as each piece is written."""
        writer, chunked = upstream.writer, request.chunked
        try:
            while (item := await self.body.get()) is not None:
                piece, flow = item
                if piece:
                    writer.writelines(http1.frame(piece, chunked))
                    await writer.drain()
                self.conn.ack(self.stream_id, flow)
                self.conn.send_pending()
            self.body_done = True
            if chunked:
                writer.write(http1.end_of_body(chunked, []))
                await writer.drain()
        except (ConnectionError, OSError):
            return False
        return True

    # -- the client's side -----------------------------------------------------------------------------

    def _h2_headers(self, status: int, headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
        connection = {
            token.strip().lower()
            for key, value in headers
            if key.lower() == "connection"
            for token in value.split(",")
        }
        out = [(b":status", str(status).encode())]
        for key, value in headers:
            name = key.lower()
            if name in HOP_BY_HOP or name in connection:
                continue
            out.append((name.encode("latin-1"), value.strip().encode("latin-1")))
        return out

    async def _send_headers(self, headers: list[tuple[bytes, bytes]], *, end: bool) -> None:
        self.conn.h2.send_headers(self.stream_id, headers, end_stream=end)
        self.ended = end
        await self.conn.soon()

    async def _send_data(self, data: bytes) -> None:
        h2c, view = self.conn.h2, memoryview(data)
        while view:
            self.window_open.clear()
            size = min(h2c.local_flow_control_window(self.stream_id), h2c.max_outbound_frame_size, len(view))
            if size <= 0:
                await self.window_open.wait()
                continue
            h2c.send_data(self.stream_id, view[:size].tobytes())
            view = view[size:]
            await self.conn.soon()

    async def _end(self, trailers: list[tuple[str, str]]) -> None:
        fields = self._h2_headers(0, trailers)[1:]
        if fields:
            self.conn.h2.send_headers(self.stream_id, fields, end_stream=True)
        else:
            self.conn.h2.end_stream(self.stream_id)
        self.ended = True
        await self.conn.soon()

    async def _relay_response(self, upstream: Upstream, response: http1.Response) -> None:
        head = self._h2_headers(response.status, _fields(response))
        bodiless = self.head_only or response.status in (204, 304) or response.content_length == 0
        if bodiless:
            if await upstream.responses.read_body_piece() is not None:
                raise http1.ProtocolError("a body on a bodiless response")
            self.responded = True
            return await self._send_headers(head, end=True)
        self.responded = True
        await self._send_headers(head, end=False)
        responses = upstream.responses
        while (piece := await responses.read_body_piece()) is not None:
            await self._send_data(piece)
        await self._end(responses.trailers if response.chunked else [])

    async def _interim(self, response: http1.Response) -> None:
        if response.status == 100:
            return  # the client sends its body without waiting for it over HTTP/2 (window permitting)
        await self._send_headers(self._h2_headers(response.status, _fields(response)), end=False)

    async def fail(self, status: int, code: str, message: str) -> None:
        """Answers the stream with the proxy's own page (the same as over HTTP/1.1, without Connection)."""
        if self.responded or self.ended or self.conn.closed:
            return
        self.responded = True
        headers, body = pages.parts(status, code, message, accept=self.accept)
        fields = self._h2_headers(status, headers)
        if self.head_only:
            return await self._send_headers(fields, end=True)
        await self._send_headers(fields, end=False)
        await self._send_data(body)
        await self._end([])


def _fields(response: http1.Response) -> list[tuple[str, str]]:
    """The app's response headers as HTTP/2 passes them: framing left to HTTP/2, except the length."""
    out: list[tuple[str, str]] = []
    for key, value in response.headers:
        name = key.lower()
        if name == "content-length" and response.content_length is None:
            continue
        out.append((key, value))
    return out
