"""Connect-RPC's JSON codec over HTTP/1.1, as the E2B SDKs send it (connectrpc with ``json``, the JS SDK's
``useBinaryFormat: false``):

- unary: ``POST /<service>/<Method>`` with ``application/json``; the answer is the message as JSON (200), or
  an error ``{"code": "<connect code>", "message": …}`` with the code's HTTP status;
- server stream: ``application/connect+json``; the request and every answer are enveloped (one flags
  byte, a 4-byte big-endian length, the JSON); the last envelope has flag 0x02 and holds ``{}`` or
  ``{"error": {"code", "message"}}``; the HTTP status stays 200;
- client stream (``StreamInput``): the same content type and envelopes, the request a run of messages read
  as they arrive (``stream_messages``), the answer one message and the end envelope.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

#: Connect's codes and the HTTP status a unary error carries (connectrpc.com/docs/protocol).
HTTP_STATUS: dict[str, int] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"
END_STREAM = 0x02
COMPRESSED = 0x01
#: A request message's bound (the SDK's biggest is a stdin chunk: 64 KiB, base64 in JSON).
MAX_MESSAGE_BYTES = 4 << 20


class ConnectError(Exception):
    """An RPC's failure in Connect's terms: the SDK maps ``code`` to its exceptions (not_found →
    NotFoundException, invalid_argument → InvalidArgumentException, …)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        assert code in HTTP_STATUS, code
        self.code, self.message = code, message

    def wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def is_stream(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == STREAM_CONTENT_TYPE


def envelope(message: dict[str, Any], *, end: bool = False) -> bytes:
    data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    return struct.pack(">BI", END_STREAM if end else 0, len(data)) + data


def end_of_stream(error: ConnectError | None = None) -> bytes:
    return envelope({"error": error.wire()} if error else {}, end=True)


def _object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data or b"{}")
    except ValueError:
        raise ConnectError("invalid_argument", "the request is not valid JSON") from None
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", "the request must be a JSON object")
    return value


async def read_body(chunks: AsyncIterator[bytes], limit: int = MAX_MESSAGE_BYTES) -> bytes:
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit + 5:
            raise ConnectError("resource_exhausted", f"the request is over {limit} bytes")
    return bytes(body)


def unary_request(body: bytes) -> dict[str, Any]:
    return _object(body)


def stream_request(body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's request, unwrapped from its envelope."""
    if len(body) < 5:
        raise ConnectError("invalid_argument", "the request has no enveloped message")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & COMPRESSED:
        raise ConnectError("unimplemented", "compressed messages are not accepted")
    if length != len(body) - 5:
        raise ConnectError("invalid_argument", "the request must hold exactly one enveloped message")
    return _object(body[5:])


async def stream_messages(
    chunks: AsyncIterator[bytes], limit: int = MAX_MESSAGE_BYTES
) -> AsyncIterator[dict[str, Any]]:
    """A client stream's messages, each yielded as soon as its envelope is complete (the SDK keeps the
    request open while its caller has input to send). Each message is bounded by ``limit``."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if flags & COMPRESSED:
                raise ConnectError("unimplemented", "compressed messages are not accepted")
            if length > limit:
                raise ConnectError("resource_exhausted", f"a request message is over {limit} bytes")
            if len(buffer) < 5 + length:
                break
            data = bytes(buffer[5 : 5 + length])
            del buffer[: 5 + length]
            if flags & END_STREAM:
                raise ConnectError("invalid_argument", "a request may not carry an end-of-stream envelope")
            yield _object(data)
    if buffer:
        raise ConnectError("invalid_argument", "the request ends inside an enveloped message")


def read_envelopes(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    """Every envelope in ``data`` as (flags, message): for tests and the client side."""
    out = []
    while data:
        flags, length = struct.unpack(">BI", data[:5])
        out.append((flags, json.loads(data[5 : 5 + length])))
        data = data[5 + length :]
    return out
