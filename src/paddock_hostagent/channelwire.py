"""The frames of the kept channel between the control plane and a host agent (``channelclient.py``,
``channelserver.py``).

The channel is one WebSocket per agent at ``/internal/v1/channel``, on the internal API's own listener
(so behind the same TLS and proxy as its HTTP routes), authenticated once by the bearer token of its
upgrade request. It carries the buffered exec, pause and resume, and (``PROTOCOL``) create and fork.
Each binary message is one frame; WebSocket carries the length. Many calls share the channel at once,
told apart by a request id the caller picks:

    call    >I id  >B op  >B len  request id (X-Request-Id, UTF-8)  >H len  sandbox id  body (JSON)
    cancel  >I id  >B OP_CANCEL                                      (the caller left: stop that call)
    answer  >I id  >H status  body (exactly the HTTP route's answer body for that status)

An answer's body is what the HTTP route answers, so the client parses both the same way; the HTTP
routes stay the contract, and the channel only carries a few hot calls.

A streamed call (``STREAM_OPS``) is answered by several frames under its id: first the route's status
and body, as any call's; after a 200, ``STATUS_ITEM`` answers each carry one line of the route's NDJSON
stream, and one ``STATUS_END`` answer ends it, carrying the stream's last line when the agent knows it
is the last (a process's exit: one message fewer per command), else no body. A cancel ends the stream early. The agent sends
at most ``STREAM_WINDOW_BYTES`` of lines ahead of what the caller has read; the caller grants more as it
reads, as TCP does for an HTTP stream (so a slow reader slows the stream, not the channel):

    credit  >I id  >B OP_CREDIT  >I bytes                            (the caller read that many more)

Which calls an agent takes is said at the upgrade, as WebSocket subprotocols are meant to: the client
offers ``PROTOCOL``, an agent that knows it names it in its answer, and an agent from before it (which
names none) takes ``FIRST_OPS`` only; the client sends the rest over HTTP.
Imports nothing but the standard library: the control plane uses it through ``client.py``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PATH = "/internal/v1/channel"
#: A buffered exec (``POST /sandboxes/{id}/exec`` with ``stream: false``); body: ``ExecBody``.
OP_EXEC = 1
#: The caller of call ``id`` went away (the call is cancelled, as a closed HTTP connection would).
OP_CANCEL = 2
#: ``POST /sandboxes/{id}/pause`` and ``/resume``; no body.
OP_PAUSE = 3
OP_RESUME = 4
#: ``POST /sandboxes/{id}/fork`` (body: ``ForkBody``) and ``POST /sandboxes`` (body:
#: ``CreateSandboxBody``, no sandbox id): they run to their end whatever the caller does, as over HTTP.
OP_FORK = 5
OP_CREATE = 6
#: ``POST /sandboxes/{id}/processes/stream`` (body: ``ProcessStreamBody``), streamed: the process's
#: view, then its frames (``ProcessFrame`` JSON) until its exit. Ending it early (a cancel, a dropped
#: channel) leaves the process running, as closing the HTTP stream does.
OP_PROCESS_STREAM = 7
#: The ops by name, for the agent's log.
OP_NAMES = {
    OP_EXEC: "exec",
    OP_PAUSE: "pause",
    OP_RESUME: "resume",
    OP_FORK: "fork",
    OP_CREATE: "create",
    OP_PROCESS_STREAM: "process_stream",
}
#: The caller of stream ``id`` has read this many more bytes of its lines (module docstring).
OP_CREDIT = 8
#: The calls answered by a stream (module docstring).
STREAM_OPS = frozenset({OP_PROCESS_STREAM})
#: How far a stream's lines may run ahead of its reader, in bytes of their bodies.
STREAM_WINDOW_BYTES = 1 << 20
#: A streamed call's answers after its first: one line of its stream, and its end.
STATUS_ITEM = 0
STATUS_END = 1
#: What the channel's first version carried: an agent that names no subprotocol takes these only.
FIRST_OPS = frozenset({OP_EXEC, OP_PAUSE, OP_RESUME})
#: The subprotocol of a channel that also carries create and fork.
PROTOCOL = "paddock.channel.2"
PROTOCOL_OPS = FIRST_OPS | {OP_FORK, OP_CREATE}
#: The subprotocol of a channel that also carries a process's streamed start.
PROTOCOL_3 = "paddock.channel.3"
PROTOCOL_3_OPS = PROTOCOL_OPS | STREAM_OPS
#: What a client offers, newest first; an agent names the newest it knows.
PROTOCOLS = (PROTOCOL_3, PROTOCOL)
#: Calls larger than this go over HTTP: the agent's WebSocket server drops the whole channel (every
#: call on it) on a message above its limit (uvicorn's 16 MiB), and big bodies gain nothing here.
MAX_CALL_BYTES = 1 << 20

_CALL_HEAD = struct.Struct(">IBB")
_CANCEL = struct.Struct(">IB")
_CREDIT = struct.Struct(">IBI")
_U16 = struct.Struct(">H")
_ANSWER_HEAD = struct.Struct(">IH")


class FrameError(ValueError):
    """A frame that does not parse (the peer is not speaking this protocol)."""


@dataclass(frozen=True, slots=True)
class Call:
    id: int
    op: int
    request_id: str
    sandbox_id: str
    body: bytes
    #: A credit's bytes (``OP_CREDIT``).
    credit: int = 0


def encode_call(call_id: int, op: int, request_id: str, sandbox_id: str, body: bytes) -> bytes:
    rid = request_id.encode()[:255]
    sid = sandbox_id.encode()
    return b"".join((_CALL_HEAD.pack(call_id, op, len(rid)), rid, _U16.pack(len(sid)), sid, body))


def encode_cancel(call_id: int) -> bytes:
    return _CANCEL.pack(call_id, OP_CANCEL)


def encode_credit(call_id: int, nbytes: int) -> bytes:
    return _CREDIT.pack(call_id, OP_CREDIT, nbytes)


def decode_call(frame: bytes) -> Call:
    """A call, a cancel (``op == OP_CANCEL``, other fields empty) or a credit (``OP_CREDIT``)."""
    try:
        if len(frame) == _CANCEL.size:
            call_id, op = _CANCEL.unpack(frame)
            return Call(call_id, op, "", "", b"")
        if len(frame) == _CREDIT.size and frame[4] == OP_CREDIT:
            call_id, op, nbytes = _CREDIT.unpack(frame)
            return Call(call_id, op, "", "", b"", credit=nbytes)
        call_id, op, rid_len = _CALL_HEAD.unpack_from(frame)
        at = _CALL_HEAD.size
        rid = frame[at : at + rid_len].decode()
        (sid_len,) = _U16.unpack_from(frame, at + rid_len)
        at += rid_len + _U16.size
        if at + sid_len > len(frame):
            raise FrameError("bad channel frame: truncated sandbox id")
        return Call(call_id, op, rid, frame[at : at + sid_len].decode(), frame[at + sid_len :])
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"bad channel frame: {exc}") from None


def ops_of(protocol: str | None) -> frozenset[int]:
    """The calls an agent takes, from the subprotocol it answered the upgrade with."""
    return {PROTOCOL_3: PROTOCOL_3_OPS, PROTOCOL: PROTOCOL_OPS}.get(protocol or "", FIRST_OPS)


def chosen(offered: tuple[str, ...] | list[str]) -> str | None:
    """The subprotocol an agent names in its answer to an upgrade that offered ``offered``."""
    return next((protocol for protocol in PROTOCOLS if protocol in offered), None)


def encode_answer(call_id: int, status: int, body: bytes) -> bytes:
    return _ANSWER_HEAD.pack(call_id, status) + body


def decode_answer(frame: bytes) -> tuple[int, int, bytes]:
    """(call id, status, body)."""
    try:
        call_id, status = _ANSWER_HEAD.unpack_from(frame)
    except struct.error as exc:
        raise FrameError(f"bad channel answer: {exc}") from None
    return call_id, status, frame[_ANSWER_HEAD.size :]
