"""Just enough HTTP/1.1 for a transparent proxy: message heads, body framing, and byte copying.

Heads are parsed (the proxy must read ``Host`` and find where each message ends); bodies are never
parsed or buffered whole: they are copied through in chunks as they arrive, keeping their own framing
(``Content-Length``, ``chunked`` with its trailers, or until the connection closes).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

MAX_HEAD_BYTES = 64 * 1024
#: asyncio stream buffer limit: reading pauses at twice this; a head may not exceed MAX_HEAD_BYTES.
STREAM_LIMIT_BYTES = 256 * 1024
COPY_CHUNK_BYTES = 256 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not HTTP/1.x this proxy can relay (-> 400 or a dropped upstream)."""


@dataclass
class Head:
    """A request or response head; ``start`` is the request line or status line, without CRLF."""

    start: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def tokens(self, name: str) -> set[str]:
        """Comma-separated tokens of every header called ``name``, lowercased (``Connection``, ``TE``)."""
        name = name.lower()
        out: set[str] = set()
        for key, value in self.headers:
            if key.lower() == name:
                out.update(part.strip().lower() for part in value.split(",") if part.strip())
        return out

    def encode(self) -> bytes:
        lines = [self.start, *(f"{key}: {value}" for key, value in self.headers), "", ""]
        return "\r\n".join(lines).encode("latin-1")


@dataclass
class Request:
    head: Head
    method: str
    target: str
    version: str

    @property
    def keep_alive(self) -> bool:
        return _keep_alive(self.version, self.head)


@dataclass
class Response:
    head: Head
    version: str
    status: int

    @property
    def keep_alive(self) -> bool:
        return _keep_alive(self.version, self.head)


def _keep_alive(version: str, head: Head) -> bool:
    connection = head.tokens("connection")
    if version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    """The next head, or None at a clean end of stream before any byte of it."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise ProtocolError("connection closed inside a message head") from None
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"message head larger than {MAX_HEAD_BYTES} bytes") from None
    if len(raw) > MAX_HEAD_BYTES:
        raise ProtocolError(f"message head larger than {MAX_HEAD_BYTES} bytes")
    lines = raw.decode("latin-1").split("\r\n")
    while lines and not lines[0]:
        lines.pop(0)  # RFC 9112 §2.2: ignore empty lines before a request line
    if not lines:
        raise ProtocolError("empty message head")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t":
            raise ProtocolError("obsolete header line folding")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise ProtocolError(f"malformed header line {line[:40]!r}")
        headers.append((name, value.strip()))
    return Head(lines[0], headers)


def parse_request(head: Head) -> Request:
    parts = head.start.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise ProtocolError(f"malformed request line {head.start[:60]!r}")
    return Request(head, parts[0], parts[1], parts[2])


def parse_response(head: Head) -> Response:
    version, _, rest = head.start.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ProtocolError(f"malformed status line {head.start[:60]!r}")
    return Response(head, version, int(code))


@dataclass(frozen=True)
class Framing:
    """How a body ends: ``length`` bytes, ``chunked``, or at end of stream (``until_close``)."""

    length: int = 0
    chunked: bool = False
    until_close: bool = False


NO_BODY = Framing()


def _framing(head: Head) -> Framing | None:
    encodings = head.tokens("transfer-encoding")
    lengths = {value.strip() for key, value in head.headers if key.lower() == "content-length"}
    if encodings:
        if lengths:
            raise ProtocolError("both Transfer-Encoding and Content-Length")  # a smuggling vector
        if "chunked" not in encodings:
            return None
        return Framing(chunked=True)
    if lengths:
        if len(lengths) > 1 or not next(iter(lengths)).isdigit():
            raise ProtocolError("invalid Content-Length")
        return Framing(length=int(next(iter(lengths))))
    return None


def request_framing(request: Request) -> Framing:
    framing = _framing(request.head)
    if framing is None:
        if request.head.tokens("transfer-encoding"):
            raise ProtocolError("a request Transfer-Encoding must end in chunked")
        return NO_BODY
    return framing


def response_framing(response: Response, request_method: str) -> Framing:
    if request_method == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200:
        return NO_BODY
    if request_method == "CONNECT" and 200 <= response.status < 300:
        return Framing(until_close=True)
    return _framing(response.head) or Framing(until_close=True)


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framing: Framing) -> None:
    """Copies one body as it arrives; the writer is drained after each piece (back-pressure)."""
    if framing.chunked:
        await _copy_chunked(reader, writer)
    elif framing.until_close:
        await copy_until_eof(reader, writer)
    else:
        remaining = framing.length
        while remaining:
            data = await reader.read(min(remaining, COPY_CHUNK_BYTES))
            if not data:
                raise ProtocolError("connection closed inside a body")
            remaining -= len(data)
            await _write(writer, data)


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        line = await _read_line(reader)
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError("malformed chunk size") from None
        if size < 0:
            raise ProtocolError("malformed chunk size")
        await _write(writer, line)
        if size == 0:
            while True:  # trailers, then the empty line
                trailer = await _read_line(reader)
                await _write(writer, trailer)
                if trailer == b"\r\n":
                    return
        remaining = size + 2  # the chunk and its CRLF
        while remaining:
            data = await reader.read(min(remaining, COPY_CHUNK_BYTES))
            if not data:
                raise ProtocolError("connection closed inside a chunk")
            remaining -= len(data)
            writer.write(data)
        await writer.drain()


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise ProtocolError("connection closed or overlong line in a chunked body") from None
    return line


async def copy_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Copies until end of stream, then half-closes the writer; returns the bytes copied."""
    copied = 0
    while True:
        data = await reader.read(COPY_CHUNK_BYTES)
        if not data:
            break
        copied += len(data)
        await _write(writer, data)
    if writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()
    return copied
