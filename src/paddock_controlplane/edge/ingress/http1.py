"""HTTP/1.1 for the ingress proxy: messages parsed by llhttp (``httptools``), bodies re-framed on the way out.

The public edge does not parse HTTP by hand. Both directions go through llhttp, the parser of Node.js and
uvicorn, in its strict mode: it rejects ``Content-Length`` together with ``Transfer-Encoding``, duplicate
or malformed ``Content-Length``, a request ``Transfer-Encoding`` that does not end in ``chunked``, invalid
chunk sizes, obs-fold, bare CR, NUL and other bytes outside the grammar. On top of that this module
refuses what llhttp lets through but a proxy must not: more than one ``Host``, versions other than
HTTP/1.0 and 1.1, ``Transfer-Encoding`` on HTTP/1.0, ``CONNECT``, a body on an upgrade request, and a
head larger than ``MAX_HEAD_BYTES`` (431).

Nothing is copied through as received. A head is rebuilt from the parsed fields with one canonical
framing header, and a body is re-emitted from what the parser decoded: exactly ``Content-Length`` bytes,
or ``chunked`` framing written anew around each decoded piece. So whatever the app receives is what
llhttp accepted, and the app cannot read one request where the proxy saw another (request smuggling).
Bodies are never buffered whole: each read from the socket is parsed and forwarded before the next.

Readers queue what one ``feed_data`` found as events, in order (a head, body pieces, the end, an
upgrade with the bytes after it, or an error), so pipelined requests are served one after another and
an error in a later message never undoes an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools

MAX_HEAD_BYTES = 64 * 1024
#: asyncio stream buffer limit, and the most read from a socket at once.
STREAM_LIMIT_BYTES = 256 * 1024
READ_BYTES = 256 * 1024
VERSIONS = frozenset({"1.0", "1.1"})

# event kinds in a reader's queue
_HEAD, _BODY, _END, _UPGRADE, _ERROR, _EOF = range(6)


class ProtocolError(Exception):
    """The peer sent something that is not HTTP/1.x this proxy relays: the client gets ``status``
    (400, or 431 for an oversized head) and the connection is closed; from an app it is a 502."""

    def __init__(self, message: str, status: int = 400, code: str = "BAD_REQUEST") -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass(slots=True, eq=False)
class Message:
    """What a request and a response head have in common. ``headers`` keeps names as sent."""

    version: str  # "1.1" or "1.0"
    headers: list[tuple[str, str]]
    chunked: bool
    content_length: int | None
    upgrade: bool

    def get(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def tokens(self, name: str) -> set[str]:
        """Comma-separated tokens of every header called ``name``, lowercased (``Connection``)."""
        name = name.lower()
        out: set[str] = set()
        for key, value in self.headers:
            if key.lower() == name:
                out.update(part.strip().lower() for part in value.split(",") if part.strip())
        return out

    @property
    def keep_alive(self) -> bool:
        connection = self.tokens("connection")
        if self.version == "1.0":
            return "keep-alive" in connection
        return "close" not in connection

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)

    def encode_headers(self, extra: list[tuple[str, str]], *, drop: frozenset[str]) -> list[str]:
        """Header lines without ``drop`` (lowercase names), the framing headers replaced by the one this
        proxy writes the body with, then ``extra``."""
        reframed = FRAMING_HEADERS if self.chunked or self.content_length is not None else frozenset()
        lines = [
            f"{key}: {value}"
            for key, value in self.headers
            if (lowered := key.lower()) not in drop and lowered not in reframed
        ]
        if self.chunked:
            lines.append("Transfer-Encoding: chunked")
        elif self.content_length is not None:
            lines.append(f"Content-Length: {self.content_length}")
        lines.extend(f"{key}: {value}" for key, value in extra)
        return lines


FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})


@dataclass(slots=True, eq=False)
class Request(Message):
    method: str
    target: str

    def encode(self, extra: list[tuple[str, str]], drop: frozenset[str]) -> bytes:
        lines = [f"{self.method} {self.target} HTTP/{self.version}", *self.encode_headers(extra, drop=drop)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(slots=True, eq=False)
class Response(Message):
    status: int
    reason: str
    #: No length and not chunked: the body ends when the app closes the connection.
    until_close: bool

    def encode(self) -> bytes:
        lines = [
            f"HTTP/{self.version} {self.status} {self.reason}",
            *self.encode_headers([], drop=frozenset()),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def frame(piece: bytes, chunked: bool) -> tuple[bytes, ...]:
    """One decoded body piece as it goes out: as is, or as one chunk."""
    if chunked:
        return (b"%x\r\n" % len(piece), piece, b"\r\n")
    return (piece,)


def end_of_body(chunked: bool, trailers: list[tuple[str, str]]) -> bytes:
    if not chunked:
        return b""
    lines = "".join(f"{key}: {value}\r\n" for key, value in trailers)
    return b"0\r\n" + lines.encode("latin-1") + b"\r\n"


def _framing(headers: list[tuple[str, str]]) -> tuple[list[str], str | None]:
    codings: list[str] = []
    length: str | None = None
    for key, value in headers:
        lowered = key.lower()
        if lowered == "transfer-encoding":
            codings.extend(part.strip().lower() for part in value.split(",") if part.strip())
        elif lowered == "content-length":
            length = value
    return codings, length


class _Reader:
    """One direction of one connection: reads the socket, feeds llhttp, queues what it found."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.events: deque[tuple[int, Any]] = deque()
        self.parser: httptools.HttpRequestParser | httptools.HttpResponseParser = self._new_parser()
        self.in_message = False
        self.awaiting_head = True
        self.broken = False
        self._head_bytes = 0  # of the current head (and trailers), as the parser reported its parts
        #: Bytes read while a head is unfinished (llhttp reports a header only once it has ended).
        self._unfinished_head_bytes = 0
        self._target = b""
        self._headers: list[tuple[str, str]] = []
        self._trailers: list[tuple[str, str]] | None = None  # a list once the head is complete
        #: Bytes read since a chunk-size line without chunk data after it: the last chunk's trailers
        #: (httptools gathers a header in memory until it ends, so they need a bound as heads do).
        self._chunk_head_bytes: int | None = None
        #: Called at each read from the socket while set (``RequestReader.read_request``'s deadlines).
        self._on_bytes: Callable[[], None] | None = None

    def _new_parser(self) -> httptools.HttpRequestParser | httptools.HttpResponseParser:
        raise NotImplementedError

    def _message(self) -> Message:
        raise NotImplementedError

    # -- llhttp callbacks (they run inside feed_data; an exception stops the parser) ---------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self._head_bytes = 0
        self._chunk_head_bytes = None
        self._target = b""
        self._headers = []
        self._trailers = None

    def on_url(self, url: bytes) -> None:
        self._target += url
        self._grow_head(len(url))

    def on_status(self, reason: bytes) -> None:
        self._target += reason
        self._grow_head(len(reason))

    def on_header(self, name: bytes, value: bytes) -> None:
        header = (name.decode("latin-1"), value.decode("latin-1"))
        if self._trailers is None:
            self._grow_head(len(name) + len(value) + 4)
            self._headers.append(header)
        else:
            self._grow_head(len(name) + len(value) + 4)
            self._trailers.append(header)

    def on_headers_complete(self) -> None:
        self.events.append((_HEAD, self._message()))
        self.awaiting_head = False
        self._unfinished_head_bytes = 0
        self._trailers = []

    def on_body(self, body: bytes) -> None:
        self._chunk_head_bytes = None
        self.events.append((_BODY, body))

    def on_chunk_header(self) -> None:
        self._chunk_head_bytes = 0

    def on_chunk_complete(self) -> None:
        self._chunk_head_bytes = None

    def on_message_complete(self) -> None:
        self.in_message = False
        self.awaiting_head = True
        self._unfinished_head_bytes = 0
        self._chunk_head_bytes = None
        self.events.append((_END, self._trailers or []))

    def _grow_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise ProtocolError(
                f"message head larger than {MAX_HEAD_BYTES} bytes", 431, "REQUEST_HEAD_TOO_LARGE"
            )

    # -- feeding -----------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._on_bytes is not None:
            self._on_bytes()
        if self.awaiting_head:
            self._unfinished_head_bytes += len(data)
        elif self._chunk_head_bytes is not None:
            self._chunk_head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self.events.append((_UPGRADE, data[exc.args[0] :]))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._fail(cause if isinstance(cause, ProtocolError) else ProtocolError(str(exc)))
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"malformed HTTP: {exc}"))
        else:
            unfinished = self._unfinished_head_bytes if self.awaiting_head else self._chunk_head_bytes or 0
            if unfinished > MAX_HEAD_BYTES:  # a head or trailer section still unfinished
                self._fail(
                    ProtocolError(
                        f"message head larger than {MAX_HEAD_BYTES} bytes", 431, "REQUEST_HEAD_TOO_LARGE"
                    )
                )

    def _fail(self, error: ProtocolError) -> None:
        self.broken = True  # llhttp stays in its error state: nothing more is parsed
        self.events.append((_ERROR, error))

    def at_eof(self) -> None:
        if self.in_message:
            self._fail(ProtocolError("connection closed inside a message"))
        else:
            self.events.append((_EOF, None))

    async def next_event(self) -> tuple[int, Any]:
        while not self.events:
            if self.broken:
                raise ProtocolError("the connection is no longer usable")
            data = await self.stream.read(READ_BYTES)
            if data:
                self.feed(data)
            else:
                self.at_eof()
        return self.events.popleft()

    async def read_body_piece(self) -> bytes | None:
        """The next decoded piece of the current body; None at its end (trailers in ``trailers``)."""
        kind, value = await self.next_event()
        if kind == _BODY:
            return value  # type: ignore[no-any-return]
        if kind == _END:
            self.trailers: list[tuple[str, str]] = value
            return None
        if kind == _ERROR:
            raise value
        raise ProtocolError("connection closed inside a body")

    def take_upgrade(self) -> bytes:
        """After an upgrade: the bytes that followed the head (they belong to the new protocol)."""
        while self.events:
            kind, value = self.events.popleft()
            if kind == _UPGRADE:
                return value  # type: ignore[no-any-return]
        return b""


class RequestReader(_Reader):
    """Requests from a client connection, strictly parsed."""

    def _new_parser(self) -> httptools.HttpRequestParser:
        return httptools.HttpRequestParser(self)

    def _message(self) -> Request:
        parser = self.parser
        assert isinstance(parser, httptools.HttpRequestParser)
        version = parser.get_http_version()
        if version not in VERSIONS:
            raise ProtocolError(f"HTTP/{version} is not served here; use HTTP/1.1")
        method = parser.get_method().decode("ascii")
        if method == "CONNECT":
            raise ProtocolError("CONNECT is not served by the ingress proxy")
        if sum(1 for key, _ in self._headers if key.lower() == "host") > 1:
            raise ProtocolError("more than one Host header")  # RFC 9112 §3.2
        codings, length = _framing(self._headers)
        if codings and version == "1.0":
            raise ProtocolError("Transfer-Encoding in an HTTP/1.0 request")  # RFC 9112 §6.1
        upgrade = parser.should_upgrade()
        content_length = int(length) if length is not None else None
        if upgrade and (codings or content_length):
            raise ProtocolError("an upgrade request cannot carry a body")
        # llhttp has refused every request Transfer-Encoding that does not end in chunked
        return Request(
            version,
            self._headers,
            bool(codings),
            None if codings else content_length,
            upgrade,
            method,
            self._target.decode("latin-1"),
        )

    async def read_request(self, idle_s: float | None = None, head_s: float | None = None) -> Request | None:
        """The next request head; None at a clean end of the connection between requests.

        A request whose rest is already known to be malformed (a bad chunk in the same read) is
        refused here, before anything of it is sent to the app. Deadlines (``TimeoutError`` past
        either): the request's first byte must come within ``idle_s``, and its whole head within
        ``head_s`` of that first byte (of now, if it is already here), so a client that sends half a
        request line and then nothing is not kept for longer than ``head_s``."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(None if idle_s is None else loop.time() + idle_s) as scope:

            def head_begun() -> None:
                self._on_bytes = None
                if head_s is not None:
                    deadline, current = loop.time() + head_s, scope.when()
                    scope.reschedule(deadline if current is None else min(current, deadline))

            if self.in_message or any(kind == _HEAD for kind, _ in self.events):
                head_begun()
            else:
                self._on_bytes = head_begun
            try:
                return await self._read_request()
            finally:
                self._on_bytes = None

    async def _read_request(self) -> Request | None:
        while True:
            kind, value = await self.next_event()
            if kind == _HEAD:
                break
            if kind == _EOF:
                return None
            if kind == _ERROR:
                raise value
            if kind == _UPGRADE:  # the app refused an upgrade: what follows is HTTP again
                self.feed(value)
            # _END of a request without a body, or what is left of one already relayed: skip
        for later, error in self.events:
            if later == _ERROR:
                raise error
            if later == _END:
                break
        return value  # type: ignore[no-any-return]


class ResponseReader(_Reader):
    """Responses from an app, one exchange at a time: ``begin`` before each request is sent."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        super().__init__(stream)
        self.received = False  # some byte of the current response arrived
        #: The connection carries nothing beyond the response: safe to send the next request on.
        self.clean = True
        self._method = "GET"
        self._final: Response | None = None
        self._pending = b""

    def _new_parser(self) -> httptools.HttpResponseParser:
        return httptools.HttpResponseParser(self)

    def begin(self, method: str) -> None:
        # a fresh parser per exchange: leftovers of the last one cannot leak into this one
        self.parser = self._new_parser()
        self.events.clear()
        self.in_message = self.broken = self.received = False
        self.awaiting_head = True
        self._head_bytes = self._unfinished_head_bytes = 0
        self._chunk_head_bytes = None
        self._method = method
        self._final = None
        self._pending = b""

    def on_message_begin(self) -> None:
        if self._final is not None:
            self.clean = False  # bytes after the final response: never reuse this connection
            raise ProtocolError("data after the response")
        super().on_message_begin()

    def _message(self) -> Response:
        parser = self.parser
        assert isinstance(parser, httptools.HttpResponseParser)
        version = parser.get_http_version()
        if version not in VERSIONS:
            raise ProtocolError(f"HTTP/{version} response")
        status = parser.get_status_code()
        codings, length = _framing(self._headers)
        chunked = bool(codings) and codings[-1] == "chunked"
        bodiless = self._method == "HEAD" or status in (204, 304) or 100 <= status < 200
        content_length = int(length) if length is not None and not codings else None
        response = Response(
            version,
            self._headers,
            chunked and not bodiless,
            content_length,
            status == 101,
            status,
            self._target.decode("latin-1"),
            not bodiless and not chunked and content_length is None,
        )
        if status >= 200 or status == 101:
            self._final = response
        return response

    def feed(self, data: bytes) -> None:
        self.received = True
        if self._method != "HEAD":
            super().feed(data)
            return
        # llhttp cannot be told that a response answers HEAD (httptools does not expose that), so it
        # would wait for the body its Content-Length announces. A strict head ends at the first
        # CRLFCRLF: feed one head at a time, and end the message at the final head.
        pending = self._pending + data
        while self._final is None and not self.broken:
            end = pending.find(b"\r\n\r\n")
            if end < 0:
                if len(pending) > MAX_HEAD_BYTES:
                    self._fail(ProtocolError("response head too large"))
                self._pending = pending
                return
            super().feed(pending[: end + 4])
            pending = pending[end + 4 :]
        self._pending = b""
        if self._final is None:
            return
        self.in_message = False
        if self._final.status == 101:
            self.events.append((_END, []))
            self.events.append((_UPGRADE, pending))
            return
        self.events.append((_END, []))
        if pending:
            self.clean = False

    def at_eof(self) -> None:
        self.clean = False
        final = self._final
        if final is not None and final.until_close and self.in_message:
            self.in_message = False
            self.events.append((_END, []))  # the end of a body delimited by the close
            return
        super().at_eof()

    async def read_head(self) -> Response | None:
        """The next response head (interim 1xx included); None if the app closed before any byte."""
        while True:
            kind, value = await self.next_event()
            if kind == _HEAD:
                return value  # type: ignore[no-any-return]
            if kind == _EOF and not self.received:
                return None
            if kind == _ERROR:
                raise value
            if kind != _END:  # _END: of an interim response already passed on
                raise ProtocolError("the app closed the connection inside a response")


async def copy_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Copies until end of stream, then half-closes the writer; returns the bytes copied."""
    copied = 0
    while True:
        data = await reader.read(READ_BYTES)
        if not data:
            break
        copied += len(data)
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()
    return copied
