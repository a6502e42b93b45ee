"""Managed processes in the guest agent (spec §12.2), host side: ``process.c`` is the other half.

    procs = GuestProcesses(guest_client)
    info = await procs.start(StartRequest("bash", pty=(24, 80)))   # the process as the guest's JSON
    await procs.input(info["process_id"], b"ls\\n")
    async with procs.connect(info["process_id"], after=0) as stream:
        async for event in stream:          # ProcessOutput(...) ..., then at most one ProcessExit(...)
            ...

Every request is one connection, which the guest's connection handler passes to its process manager;
leaving a ``connect`` stream only closes that connection, never the process.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from types import TracebackType
from typing import Any, Literal

from paddock_hostagent.guest.client import GuestClient, _Connection, _UnreadError
from paddock_hostagent.guest.protocol import (
    GUEST_TOO_OLD_FOR_USER,
    ErrorCode,
    Frame,
    GuestError,
    GuestProtocolError,
    GuestTooOldError,
    GuestUserError,
    _string,
    decode_error,
    frame,
)

StreamName = Literal["stdout", "stderr", "pty"]
STREAMS: dict[int, StreamName] = {1: "stdout", 2: "stderr", 3: "pty"}


class ProcessOp(IntEnum):
    START = 1
    LIST = 2
    GET = 3
    KILL = 4
    INPUT = 5
    STDIN_CLOSE = 6
    RESIZE = 7
    SIGNAL = 8
    WAIT = 9
    CONNECT = 10
    START_AS = 11  # a user first, then START's fields


class GuestProcessError(GuestError):
    """A managed-process request the guest refused."""


class GuestProcessNotFoundError(GuestProcessError):
    pass


class GuestProcessStateError(GuestProcessError):
    pass


class GuestSpawnError(GuestProcessError):
    pass


_ERRORS: dict[int, type[GuestError]] = {
    ErrorCode.PROC_NOT_FOUND: GuestProcessNotFoundError,
    ErrorCode.PROC_STATE: GuestProcessStateError,
    ErrorCode.SPAWN: GuestSpawnError,
    ErrorCode.PROTOCOL: GuestProtocolError,
    ErrorCode.USER: GuestUserError,
}


def _error(payload: bytes) -> GuestError:
    code, message = decode_error(payload)
    return _ERRORS.get(code, GuestProcessError)(message)


@dataclass(frozen=True)
class StartRequest:
    cmd: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    pty: tuple[int, int] | None = None  # (rows, cols)
    user: str | None = None  # a name or uid of the sandbox's /etc/passwd (START_AS)


@dataclass(frozen=True)
class ProcessOutput:
    seq: int
    stream: StreamName
    data: bytes


@dataclass(frozen=True)
class ProcessExit:
    exit_code: int
    signal: int


ProcessEvent = ProcessOutput | ProcessExit


def _request(op: ProcessOp, body: bytes = b"") -> bytes:
    return frame(Frame.PROC, struct.pack("<I", op) + body)


#: START's flags (process.c): a PTY; the starting connection is the process's stream from its first
#: byte (a guest that knows it says ``"streaming": true`` in its answer; an older one ignores it);
#: stdin closed at the start.
START_PTY = 1
START_STREAM = 2
START_CLOSE_STDIN = 4


def encode_start(request: StartRequest, *, stream: bool = False, close_stdin: bool = False) -> bytes:
    rows, cols = request.pty or (0, 0)
    flags = (START_PTY if request.pty else 0) | (START_STREAM if stream else 0)
    flags |= START_CLOSE_STDIN if stream and close_stdin else 0
    head = struct.pack("<IIIII", flags, rows, cols, len(request.args), len(request.env))
    parts = [] if request.user is None else [_string(request.user)]
    parts += [head, _string(request.cmd), *(_string(arg) for arg in request.args)]
    parts += [_string(f"{key}={value}") for key, value in request.env.items()]
    parts.append(_string(request.cwd))
    op = ProcessOp.START if request.user is None else ProcessOp.START_AS
    return _request(op, b"".join(parts))


def _parse_json(payload: bytes) -> dict[str, Any]:
    try:
        value = json.loads(payload.decode("utf-8", "replace"))
    except ValueError as exc:
        raise GuestProtocolError(f"malformed process reply: {exc}") from exc
    if not isinstance(value, dict):
        raise GuestProtocolError("process reply is not an object")
    return value


class GuestProcesses:
    """The managed-process operations of one guest agent."""

    def __init__(self, client: GuestClient) -> None:
        self._client = client

    async def _call(self, request: bytes) -> dict[str, Any]:
        conn = await self._client._connect()
        try:
            await conn.send(request)
            return await _read_reply(conn)
        finally:
            conn.close()

    async def start(self, request: StartRequest) -> dict[str, Any]:
        with _start_refusals(request):
            return await self._call(encode_start(request))

    async def start_streaming(
        self, request: StartRequest, *, close_stdin: bool
    ) -> tuple[dict[str, Any], ProcessStream]:
        """Starts a process and opens its stream from its first output, on one connection: the start
        asks the guest to make that connection the process's stream at once (``START_STREAM``, stdin
        closed by ``START_CLOSE_STDIN`` when asked), before the guest reads a byte of the process's
        output. A guest that predates the flag answers without ``"streaming"``; then stdin's close
        (when asked) and a connect from the first output are sent after its answer (its process
        manager serves a connection's requests in order until a connect turns it into a stream), and
        what a fast command wrote past the guest's 1 MiB ring while the host read that answer is lost
        (the connect's answer has ``output.oldest_seq`` after 1, which the stream's first frame
        carries as ``oldest_available_seq``). A start, a close and a connect on
        three connections cost the guest three handler processes; this costs one, and none while the
        guest has a kept idle connection (the host's INFO each second leaves one): a handler waiting
        on it passes it to the process manager as it would a new one."""
        start = encode_start(request, stream=True, close_stdin=close_stdin)
        conn = self._client._take_kept()
        view: dict[str, Any] | None = None
        if conn is not None:
            try:
                await conn.send(start)
                with _start_refusals(request):
                    view = await _read_reply(conn)
            except _UnreadError:  # its handler had gone with the start unread: nothing started
                conn.close()
                conn = None
            except BaseException:
                conn.close()
                raise
        if conn is None:
            conn = await self._client._connect()
        try:
            if view is None:
                await conn.send(start)
                with _start_refusals(request):
                    view = await _read_reply(conn)
            process_id = str(view["process_id"])
            stream = ProcessStream(self._client, process_id, 0)
            if view.get("streaming") is True:
                stream.process = view
            else:  # a guest from before START_STREAM
                connect = _request(ProcessOp.CONNECT, _string(process_id) + struct.pack("<Q", 0))
                if close_stdin:
                    await conn.send(_request(ProcessOp.STDIN_CLOSE, _string(process_id)) + connect)
                    await _read_reply(conn)
                else:
                    await conn.send(connect)
                stream.process = await _read_reply(conn)
        except BaseException:
            conn.close()
            raise
        stream._conn = conn
        return view, stream

    async def list(self) -> dict[str, Any]:
        return await self._call(_request(ProcessOp.LIST))

    async def get(self, process_id: str) -> dict[str, Any]:
        return await self._call(_request(ProcessOp.GET, _string(process_id)))

    async def kill(self, process_id: str, grace_ms: int) -> dict[str, Any]:
        return await self._call(_request(ProcessOp.KILL, _string(process_id) + struct.pack("<I", grace_ms)))

    async def input(self, process_id: str, data: bytes) -> dict[str, Any]:
        body = _string(process_id) + struct.pack("<I", len(data)) + data
        return await self._call(_request(ProcessOp.INPUT, body))

    async def stdin_close(self, process_id: str) -> dict[str, Any]:
        return await self._call(_request(ProcessOp.STDIN_CLOSE, _string(process_id)))

    async def resize(self, process_id: str, rows: int, cols: int) -> dict[str, Any]:
        body = _string(process_id) + struct.pack("<II", rows, cols)
        return await self._call(_request(ProcessOp.RESIZE, body))

    async def signal(self, process_id: str, signo: int) -> dict[str, Any]:
        return await self._call(_request(ProcessOp.SIGNAL, _string(process_id) + struct.pack("<I", signo)))

    async def wait(self, process_id: str, *, tree: bool, timeout_ms: int) -> dict[str, Any]:
        body = _string(process_id) + struct.pack("<II", 1 if tree else 0, timeout_ms)
        return await self._call(_request(ProcessOp.WAIT, body))

    def connect(self, process_id: str, after: int) -> ProcessStream:
        return ProcessStream(self._client, process_id, after)


@contextlib.contextmanager
def _start_refusals(request: StartRequest) -> Iterator[None]:
    try:
        yield
    except GuestProcessNotFoundError as exc:
        # An older process manager reads START_AS as an operation on a process named by the user.
        if request.user is None:
            raise
        raise GuestTooOldError(GUEST_TOO_OLD_FOR_USER) from exc


async def _read_reply(conn: _Connection) -> dict[str, Any]:
    frame_type, payload = await conn.read_frame()
    if frame_type == Frame.ERROR:
        raise _error(payload)
    if frame_type != Frame.PROC_REPLY:
        raise GuestProtocolError(f"unexpected frame {frame_type} to a process request")
    return _parse_json(payload)


class ProcessStream:
    """A process's retained output after ``after``, then its live output, then its exit."""

    def __init__(self, client: GuestClient, process_id: str, after: int) -> None:
        self._client = client
        self._process_id = process_id
        self._after = after
        self._conn: _Connection | None = None
        self.process: dict[str, Any] = {}

    async def __aenter__(self) -> ProcessStream:
        conn = await self._client._connect()
        try:
            await conn.send(
                _request(ProcessOp.CONNECT, _string(self._process_id) + struct.pack("<Q", self._after))
            )
            self.process = await _read_reply(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __aiter__(self) -> AsyncIterator[ProcessEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ProcessEvent]:
        if self._conn is None:
            raise RuntimeError("ProcessStream used outside 'async with'")
        while True:
            frame_type, payload = await self._conn.read_frame()
            if frame_type == Frame.PROC_OUTPUT and len(payload) >= 12:
                seq, stream = struct.unpack_from("<QI", payload)
                yield ProcessOutput(seq, STREAMS.get(stream, "stdout"), payload[12:])
            elif frame_type == Frame.PROC_EXIT and len(payload) == 8:
                code, signo = struct.unpack("<ii", payload)
                yield ProcessExit(code, signo)
                return
            else:
                raise GuestProtocolError(f"unexpected frame {frame_type} in a process stream")
