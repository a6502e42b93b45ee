"""Asyncio client for the guest agent's unix socket: a connection per request, or a kept one for exec.

    client = GuestClient(Path(".../guest.sock"))
    async with client.exec(ExecRequest("ls", ["-l"], env)) as session:
        async for event in session:          # Output(...), then exactly one Exited(...) or SpawnFailed(...)
            ...
    size = await client.write_file("/root/a.bin", chunks)
    async with client.read_file("/root/a.bin") as download:
        async for chunk in download: ...
    async with client.watch("/root/w", recursive=True) as watch:
        async for event in watch: ...         # WatchEvent("create", "file", "a/b.txt"), until left

Leaving an ``exec`` session early closes the connection, and the guest then kills the command's whole
process group.

An exec that ran to its end without stdin leaves its connection clean (the guest's EXIT frame says
so), as does an INFO, and the connection is kept (``KeptConnections``, one idle per guest socket) for
the next exec or INFO on that guest: it skips the connect and the guest's fork of a replacement
handler. A kept connection is
taken only if nothing arrived on it while idle (a restarted, destroyed or reset guest closes it) and
only after its previous exec's EXIT, so no exec ever reads another's output; one found closed when its
request is sent (nothing delivered) is replaced by a new connection.

Many requests at once to one guest take turns to connect (``ConnectGates``): at most
``MAX_CONNECTING_PER_GUEST`` connects are under way to a guest at a time, and a connect the guest's
full listen backlog refuses (a unix socket says EAGAIN) is tried again with a growing pause until the
connect timeout. Past ``MAX_WAITING_PER_GUEST`` callers waiting, no turn within ``MAX_TURN_WAIT_S``, or
no connection within the connect timeout, a request is refused with ``GuestBusyError``: the caller
answers 503 with Retry-After.
Before, 300 parallel execs on one sandbox overflowed the guest's backlog of 128 and 31 of them
answered 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import select
import socket
import stat
import struct
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from paddock_hostagent.guest.protocol import (
    GUEST_TOO_OLD_FOR_USER,
    HEADER,
    UNKNOWN_SIZE,
    WATCH_INCOMPLETE,
    WATCH_KINDS,
    WATCH_TYPES,
    ErrorCode,
    Frame,
    GuestFileError,
    GuestProtocolError,
    GuestTooOldError,
    GuestUnavailableError,
    GuestUserError,
    GuestWatchUnavailableError,
    check_version,
    chunked_frames,
    decode_error,
    encode_exec,
    encode_path_request,
    encode_watch,
    file_error,
    frame,
)

_STREAM_LIMIT_BYTES = 4 << 20
# EXIT frame flags (guest.h): the guest takes another request on this connection.
_EXIT_KEPT = 1
_IDLE_EVENTS = select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR
#: Connects under way to one guest at once (its listen backlog holds 128, agent.c).
MAX_CONNECTING_PER_GUEST = 32
#: Callers waiting for their turn to connect to one guest; the next one is refused as busy at once.
MAX_WAITING_PER_GUEST = 2048
#: How long a caller waits for its turn before it is refused as busy.
MAX_TURN_WAIT_S = 15.0
#: The pauses between connects a full backlog refused: from the first to at most the last, doubling.
_BACKLOG_RETRY_S = (0.001, 0.05)
#: What an overloaded guest's refusal tells the caller to wait before trying again.
BUSY_RETRY_AFTER_S = 1


#: How the guest (glibc, static) words a write that met a full disk or quota: ``strerror``'s text,
#: which its E_IO error carries.
_NO_SPACE_REASONS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


class GuestNoSpaceError(GuestFileError):
    """A write met a full disk (ENOSPC) or quota in the sandbox; the guest removed what it had written."""


class GuestBusyError(GuestUnavailableError):
    """The guest takes no more connections now (too many callers waiting, or its backlog stayed full
    for the connect timeout): the request never reached it; try again in ``BUSY_RETRY_AFTER_S``."""


@dataclass(frozen=True)
class ExecRequest:
    cmd: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    stdin: bytes | None = None
    user: str | None = None  # a name or uid of the sandbox's /etc/passwd: EXEC_AS


@dataclass(frozen=True)
class Output:
    stream: str  # "stdout" | "stderr"
    data: bytes


@dataclass(frozen=True)
class Exited:
    exit_code: int
    signal: int


@dataclass(frozen=True)
class SpawnFailed:
    message: str


ExecEvent = Output | Exited | SpawnFailed


SELF_ACTIONS = {1: "pause", 2: "delete"}


@dataclass(frozen=True)
class GuestInfo:
    last_activity_at: float
    active_requests: int
    version: int
    # The latest self-signal from inside the sandbox (spec 12.4): its sequence number (0: none yet),
    # "pause" or "delete", and the caller's reason label.
    self_seq: int = 0
    self_action: str | None = None
    self_reason: str = ""


class _UnreadError(GuestUnavailableError):
    """The guest's end closed with bytes we sent still unread (a unix socket then says ECONNRESET, where
    it says EOF once everything was read): that guest never had the whole of what followed its read."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.loop = asyncio.get_running_loop()

    def idle_and_open(self) -> bool:
        """True when this idle connection can carry a request: still open, on the running loop, and
        with nothing to read (the guest sends nothing between requests, so readable means it hung up)."""
        if self.loop is not asyncio.get_running_loop() or self.writer.is_closing() or self.reader.at_eof():
            return False
        sock = self.writer.get_extra_info("socket")
        if sock is None:
            return False
        # The kernel's view now, not the event loop's: a guest that just died may not have been read yet.
        poller = select.poll()
        poller.register(sock.fileno(), _IDLE_EVENTS)
        return not poller.poll(0)

    async def read_frame(self) -> tuple[int, bytes]:
        try:
            header = await self.reader.readexactly(HEADER.size)
            frame_type, length = HEADER.unpack(header)
            payload = await self.reader.readexactly(length) if length else b""
        except asyncio.IncompleteReadError as exc:
            raise GuestUnavailableError("guest agent closed the connection") from exc
        except ConnectionResetError as exc:
            raise _UnreadError(f"guest agent connection failed: {exc}") from exc
        except OSError as exc:
            raise GuestUnavailableError(f"guest agent connection failed: {exc}") from exc
        return frame_type, payload

    async def send(self, data: bytes) -> None:
        await self.send_parts([data])

    async def send_parts(self, parts: list[bytes | memoryview]) -> None:
        try:
            self.writer.writelines(parts)  # one vectored send on uvloop, no joined copy
            await self.writer.drain()
        except OSError as exc:
            raise GuestUnavailableError(f"guest agent connection failed: {exc}") from exc

    async def send_aside(self, parts: list[bytes | memoryview]) -> None:
        """Sends through a duplicate of the socket rather than the stream's transport. A guest whose
        command ended with its stdin unread closes the connection, and the next write fails with EPIPE;
        a transport that meets a write error also closes its reading side, which would lose the EXIT
        frame already received. A failure here leaves the reader as it was. Falls back to the
        transport while it still holds unsent bytes of its own (they must go first)."""
        sock = self.writer.get_extra_info("socket")
        if sock is None or self.writer.transport.get_write_buffer_size():
            await self.send_parts(parts)
            return
        aside = socket.socket(fileno=os.dup(sock.fileno()))
        try:
            aside.setblocking(False)
            for part in parts:
                await self.loop.sock_sendall(aside, part)
        except OSError as exc:
            raise GuestUnavailableError(f"guest agent connection failed: {exc}") from exc
        finally:
            aside.close()

    def close(self) -> None:
        self.writer.close()


Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class KeptConnections:
    """Idle connections whose last request left them clean, one per guest socket path.

    A destroyed sandbox's entry holds a closed connection until its path is used again or the next
    sweep (whenever the number of entries has doubled since the last one) drops it. At most
    ``max_idle`` are kept (a quarter of the process's file limit by default), so kept connections
    never take the descriptors that new ones need."""

    def __init__(self, max_idle: int | None = None) -> None:
        self._max_idle = max_idle
        self._idle: dict[str, _Connection] = {}
        self._sweep_at = 64

    @property
    def max_idle(self) -> int:
        # Asked when used, not when this module is imported: the service raises its file limit at start.
        if self._max_idle is not None:
            return self._max_idle
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4

    def take(self, key: str) -> _Connection | None:
        conn = self._idle.pop(key, None)
        if conn is None or conn.idle_and_open():
            return conn
        _close_quietly(conn)
        return None

    def give_back(self, key: str, conn: _Connection) -> None:
        if len(self._idle) >= self._sweep_at:
            self._sweep()
        if key in self._idle or len(self._idle) >= self.max_idle:
            _close_quietly(conn)
        else:
            self._idle[key] = conn

    def _sweep(self) -> None:
        for key, conn in list(self._idle.items()):
            if conn.loop.is_closed() or conn.writer.is_closing() or conn.reader.at_eof():
                del self._idle[key]
                _close_quietly(conn)
        self._sweep_at = max(64, 2 * len(self._idle))

    def close_all(self) -> None:
        for conn in self._idle.values():
            _close_quietly(conn)
        self._idle.clear()


def _close_quietly(conn: _Connection) -> None:
    with contextlib.suppress(RuntimeError):  # its event loop is closed: the socket went with it
        conn.close()


class _Gate:
    __slots__ = ("semaphore", "users")

    def __init__(self, slots: int) -> None:
        self.semaphore = asyncio.Semaphore(slots)
        self.users = 0


class ConnectGates:
    """Turns to connect, per guest socket: ``MAX_CONNECTING_PER_GUEST`` at once, ``MAX_WAITING_PER_GUEST``
    queued behind them, anyone past that refused. A guest's gate lives while someone uses it."""

    def __init__(
        self, slots: int = MAX_CONNECTING_PER_GUEST, max_waiting: int = MAX_WAITING_PER_GUEST
    ) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self._gates: dict[str, _Gate] = {}

    @contextlib.asynccontextmanager
    async def turn(self, key: str, wait_s: float) -> AsyncIterator[None]:
        """Holds one of the guest's connect slots; ``GuestBusyError`` when the queue is full or no
        slot came free within ``wait_s``."""
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(self.slots)
        if gate.users >= self.slots + self.max_waiting:
            raise GuestBusyError(f"guest agent at {key} is busy: {gate.users} connections waiting")
        gate.users += 1
        try:
            if not gate.semaphore.locked():  # a free slot is taken at once: no timer to arm
                await gate.semaphore.acquire()
            else:
                try:
                    async with asyncio.timeout(wait_s):
                        await gate.semaphore.acquire()
                except TimeoutError:
                    raise GuestBusyError(
                        f"guest agent at {key} is busy: no turn to connect within {wait_s} s"
                    ) from None
            try:
                yield
            finally:
                gate.semaphore.release()
        finally:
            gate.users -= 1
            if gate.users == 0 and self._gates.get(key) is gate:
                del self._gates[key]


# The host agent's: one process, one event loop, and a new GuestClient per request.
KEPT_CONNECTIONS = KeptConnections()
CONNECT_GATES = ConnectGates()


def unix_connector(socket_path: Path) -> Connector:
    """Opens a new connection to the agent's unix socket (one per request).

    The socket's directory is the host's, but the socket's name in it may be the sandbox's to change
    (gVisor's guest binds it in a directory shared read-write with the sandbox), so the name is never
    resolved by a connect: it is opened ``O_PATH|O_NOFOLLOW`` in the directory, must be a socket, and is
    connected through ``/proc/self/fd/N``. A symlink a tenant put there (to a host listener) or any
    other file is refused (ENOTSOCK) and nothing is connected."""

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        dir_fd = os.open(socket_path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = os.open(socket_path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise OSError(
                    errno.ENOTSOCK, f"{socket_path.name} is not a socket (a symlink is not followed)"
                )
            # A unix socket connects at once or fails: EAGAIN when the guest's listen backlog is full.
            # Done here, not by the event loop: asyncio's own loop takes EAGAIN for a connect in
            # progress and hands back a socket that never connected. The magic link names the inode
            # opened above, whatever the name now holds (and keeps sun_path short for long paths).
            sock.connect(f"/proc/self/fd/{fd}")
        except BaseException:
            sock.close()
            raise
        finally:
            os.close(fd)
        return await asyncio.open_unix_connection(sock=sock, limit=_STREAM_LIMIT_BYTES)

    return connect


class GuestClient:
    """Speaks to one guest agent. The transport is a ``Connector`` (a fresh byte stream per request):
    a unix socket for containers; a vsock or a hybrid-vsock unix socket would serve a microVM."""

    def __init__(
        self,
        socket_path: Path | None = None,
        *,
        connector: Connector | None = None,
        connect_timeout_s: float = 5.0,
        kept: KeptConnections | None = KEPT_CONNECTIONS,
        gates: ConnectGates = CONNECT_GATES,
        turn_timeout_s: float = MAX_TURN_WAIT_S,
    ) -> None:
        if connector is None:
            if socket_path is None:
                raise ValueError("GuestClient needs a socket path or a connector")
            connector = unix_connector(socket_path)
        elif socket_path is None:
            kept = None  # no key to keep connections under
        self.socket_path = socket_path
        self._connector = connector
        self.connect_timeout_s = connect_timeout_s
        self._kept = kept
        self._kept_key = str(socket_path)
        self._gates = gates
        self.turn_timeout_s = turn_timeout_s
        self._gate_key = str(socket_path) if socket_path is not None else f"connector-{id(connector)}"

    def _take_kept(self) -> _Connection | None:
        return self._kept.take(self._kept_key) if self._kept is not None else None

    def _keep(self, conn: _Connection) -> None:
        if self._kept is not None:
            self._kept.give_back(self._kept_key, conn)
        else:
            conn.close()

    async def _connect(self) -> _Connection:
        """A new connection, once this guest's turn to connect comes (``ConnectGates``). A connect the
        guest's full backlog refuses (EAGAIN) is tried again; one that does not complete within
        ``connect_timeout_s`` meets a guest that accepts nothing now: busy, as a refused turn is (a
        guest that is gone refuses at once)."""
        where = self.socket_path or "its transport"
        async with self._gates.turn(self._gate_key, self.turn_timeout_s):
            try:
                async with asyncio.timeout(self.connect_timeout_s):  # no extra task, unlike wait_for
                    pause_s = _BACKLOG_RETRY_S[0]
                    while True:
                        try:
                            reader, writer = await self._connector()
                            break
                        except OSError as exc:
                            if exc.errno != errno.EAGAIN:
                                raise
                        await asyncio.sleep(pause_s)
                        pause_s = min(pause_s * 2, _BACKLOG_RETRY_S[1])
            except TimeoutError as exc:
                raise GuestBusyError(
                    f"guest agent at {where} is busy: no connection within {self.connect_timeout_s} s"
                ) from exc
            except OSError as exc:
                raise GuestUnavailableError(f"guest agent at {where} does not answer: {exc}") from exc
        return _Connection(reader, writer)

    async def info(self) -> GuestInfo:
        """The guest's INFO, on a kept connection when there is one (the host agent asks every guest
        each second: a new connection each time made each guest fork a handler each second)."""
        conn = self._take_kept()
        if conn is not None:
            with contextlib.suppress(GuestUnavailableError):  # closed under us: INFO is safe to repeat
                return await self._info_on(conn)
        return await self._info_on(await self._connect())

    async def _info_on(self, conn: _Connection) -> GuestInfo:
        try:
            await conn.send(frame(Frame.INFO))
            frame_type, payload = await conn.read_frame()
        except BaseException:  # a timeout may cut the exchange short: that connection is not clean
            conn.close()
            raise
        if frame_type != Frame.INFO_REPLY or len(payload) < 16:
            conn.close()
            raise GuestProtocolError(f"unexpected reply {frame_type} to INFO")
        self._keep(conn)
        last_ms, active, version = struct.unpack_from("<QII", payload)
        self_seq, action = struct.unpack_from("<II", payload, 16) if len(payload) >= 24 else (0, 0)
        return GuestInfo(
            last_activity_at=last_ms / 1000,
            active_requests=active,
            version=version,
            self_seq=self_seq,
            self_action=SELF_ACTIONS.get(action),
            self_reason=payload[24:].decode("utf-8", "replace"),
        )

    async def wait_ready(self, timeout_s: float) -> GuestInfo:
        """Polls until the agent answers INFO (its hello); raises GuestUnavailableError after
        ``timeout_s``, and GuestVersionError at once for a guest of another protocol version."""
        deadline = time.monotonic() + timeout_s
        delay_s = 0.0005
        while True:
            try:
                info = await self.info()
                check_version(info.version)
                return info
            except GuestUnavailableError:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.02)

    def exec(self, request: ExecRequest) -> ExecSession:
        return ExecSession(self, request)

    async def write_file(self, path: str, chunks: AsyncIterable[bytes]) -> int:
        """Streams ``chunks`` into ``path`` atomically; returns the size written. A full disk in the
        sandbox is ``GuestNoSpaceError`` (the guest wrote to a temporary file, and removed it)."""
        conn = await self._connect()
        try:
            await conn.send(encode_path_request(Frame.WRITE, path))
            await self._expect_ok(conn)
            async for chunk in chunks:
                if chunk:
                    await conn.send_parts(chunked_frames(Frame.DATA, chunk))
            await conn.send(frame(Frame.DATA_END))
            payload = await self._expect_ok(conn)
            if len(payload) != 8:
                raise GuestProtocolError("short write acknowledgement")
            (size,) = struct.unpack("<Q", payload)
            return int(size)
        except GuestFileError as exc:
            if type(exc) is GuestFileError and str(exc).endswith(_NO_SPACE_REASONS):
                raise GuestNoSpaceError(str(exc)) from exc
            raise
        finally:
            conn.close()

    def read_file(self, path: str) -> FileDownload:
        return FileDownload(self, path)

    def watch(self, path: str, *, recursive: bool = False) -> DirectoryWatch:
        """The changes under the directory ``path`` as the guest's inotify sees them (``DirectoryWatch``)."""
        return DirectoryWatch(self, path, recursive)

    @staticmethod
    async def _expect_ok(conn: _Connection) -> bytes:
        frame_type, payload = await conn.read_frame()
        if frame_type == Frame.ERROR:
            raise file_error(payload)
        if frame_type != Frame.OK:
            raise GuestProtocolError(f"unexpected frame {frame_type}")
        return payload


class ExecSession:
    """One running command. Iterate for events; leaving the ``async with`` early kills the command."""

    def __init__(self, client: GuestClient, request: ExecRequest) -> None:
        self._client = client
        self._request = request
        self._conn: _Connection | None = None
        self._stdin_task: asyncio.Task[None] | None = None
        self.finished = False
        self._clean = False  # the guest said the connection takes another request
        self._head = b""
        # Sent on a kept connection and nothing answered yet: if the guest's end turns out to have gone
        # with the request unread, it is sent again on a new connection (the command never started).
        self._resend_if_unread = False
        self._closed = False

    async def __aenter__(self) -> ExecSession:
        request = self._request
        self._head = encode_exec(
            request.cmd,
            request.args,
            request.env,
            request.cwd,
            has_stdin=request.stdin is not None,
            user=request.user,
        )
        if request.user is not None:
            self._conn = await self._new_connection()
            await self._await_user_accepted(self._conn)
            if request.stdin is not None:
                self._stdin_task = asyncio.create_task(self._feed_stdin(self._conn, request.stdin))
            return self
        conn = self._client._take_kept()
        if conn is not None:
            try:
                await conn.send(self._head)
            except GuestUnavailableError:  # closed under us: the guest got nothing, so send it anew
                conn.close()
                conn = None
        if conn is None:
            conn = await self._new_connection()
        else:
            # With stdin, the guest may have read the request and started the command before it went.
            self._resend_if_unread = request.stdin is None
        self._conn = conn
        if request.stdin is not None:
            # Stdin is fed in the background: a command may produce output before it reads its input.
            self._stdin_task = asyncio.create_task(self._feed_stdin(conn, request.stdin))
        return self

    async def _await_user_accepted(self, conn: _Connection) -> None:
        """EXEC_AS: the guest answers OK once it has found the user, or ERROR before running anything
        (no such user: GuestUserError; a guest older than EXEC_AS: GuestTooOldError). Another refusal
        (the command not found …) comes after OK, as for EXEC."""
        try:
            frame_type, payload = await conn.read_frame()
        except BaseException:
            await self.aclose()
            raise
        if frame_type == Frame.OK:
            return
        await self.aclose()
        if frame_type != Frame.ERROR:
            raise GuestProtocolError(f"unexpected frame {frame_type} answering an exec as a user")
        code, message = decode_error(payload)
        if code == ErrorCode.USER:
            raise GuestUserError(message)
        if code == ErrorCode.PROTOCOL and message.startswith("unknown request type"):
            raise GuestTooOldError(GUEST_TOO_OLD_FOR_USER)
        raise GuestProtocolError(message)

    async def _new_connection(self) -> _Connection:
        conn = await self._client._connect()
        try:
            await conn.send(self._head)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    async def _feed_stdin(conn: _Connection, stdin: bytes) -> None:
        with contextlib.suppress(GuestUnavailableError):
            await conn.send_aside([*chunked_frames(Frame.STDIN, stdin), frame(Frame.STDIN_EOF)])

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._stdin_task is not None:
            self._stdin_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stdin_task
            self._stdin_task = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            if self._clean:
                self._client._keep(conn)
            else:
                conn.close()

    def __aiter__(self) -> AsyncIterator[ExecEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ExecEvent]:
        assert self._conn is not None, "use `async with client.exec(...)`"
        conn = self._conn
        while True:
            try:
                frame_type, payload = await conn.read_frame()
            except _UnreadError:
                if not self._resend_if_unread:
                    raise
                self._resend_if_unread = False
                conn.close()
                conn = await self._new_connection()
                if self._closed:  # left (aborted) while it connected: the guest then kills the command
                    conn.close()
                    raise
                self._conn = conn
                continue
            self._resend_if_unread = False
            if frame_type == Frame.STDOUT:
                yield Output("stdout", payload)
            elif frame_type == Frame.STDERR:
                yield Output("stderr", payload)
            elif frame_type == Frame.EXIT:
                code, signal = struct.unpack_from("<ii", payload)
                # The EXIT frame is the guest's last word on this exec: nothing of it can follow.
                flags = struct.unpack_from("<I", payload, 8)[0] if len(payload) >= 12 else 0
                self._clean = bool(flags & _EXIT_KEPT) and self._request.stdin is None
                self.finished = True
                yield Exited(code, signal)
                return
            elif frame_type == Frame.ERROR:
                _, message = decode_error(payload)
                self.finished = True
                yield SpawnFailed(message)
                return
            else:
                raise GuestProtocolError(f"unexpected frame {frame_type} in exec stream")


class FileDownload:
    """A file being read from the guest: ``size`` (None when unknown) is set on entering."""

    def __init__(self, client: GuestClient, path: str) -> None:
        self._client = client
        self._path = path
        self._conn: _Connection | None = None
        self.size: int | None = None

    async def __aenter__(self) -> FileDownload:
        conn = await self._client._connect()
        self._conn = conn
        try:
            await conn.send(encode_path_request(Frame.READ, self._path))
            frame_type, payload = await conn.read_frame()
            if frame_type == Frame.ERROR:
                raise file_error(payload)
            if frame_type != Frame.SIZE or len(payload) != 8:
                raise GuestProtocolError(f"unexpected frame {frame_type} opening a download")
            (size,) = struct.unpack("<Q", payload)
            self.size = None if size == UNKNOWN_SIZE else int(size)
        except BaseException:
            conn.close()
            self._conn = None
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        assert self._conn is not None, "use `async with client.read_file(...)`"
        conn = self._conn
        while True:
            frame_type, payload = await conn.read_frame()
            if frame_type == Frame.DATA:
                yield payload
            elif frame_type == Frame.DATA_END:
                return
            elif frame_type == Frame.ERROR:
                raise file_error(payload)
            else:
                raise GuestProtocolError(f"unexpected frame {frame_type} in a download")


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "create" | "modify" | "delete" | "overflow" (events were lost: list again)
    type: str  # "file" | "dir" | "symlink" | "other" (a deleted entry: "dir" or "file")
    path: str  # relative to the watched directory ("" for an overflow)


class DirectoryWatch:
    """A directory's changes as the guest's inotify reports them (``watch.c``). On entering, the guest
    has its watches in place (``directories`` of them; ``complete`` is false when the tree has more than
    it watches); errors (missing, not a directory, no inotify to be had) are raised then. Iterate for
    events until the watched directory goes (``GuestFileNotFoundError``) or the guest does
    (``GuestUnavailableError``); leaving closes the connection, and the guest's watch with it."""

    def __init__(self, client: GuestClient, path: str, recursive: bool) -> None:
        self._client = client
        self._path = path
        self._recursive = recursive
        self._conn: _Connection | None = None
        self.directories = 0
        self.complete = True

    async def __aenter__(self) -> DirectoryWatch:
        conn = await self._client._connect()
        self._conn = conn
        try:
            await conn.send(encode_watch(self._path, recursive=self._recursive))
            frame_type, payload = await conn.read_frame()
            if frame_type == Frame.ERROR:
                code, message = decode_error(payload)
                if code == ErrorCode.PROTOCOL and message.startswith("unknown request type"):
                    raise GuestWatchUnavailableError("this sandbox's guest agent predates WATCH")
                raise file_error(payload)
            if frame_type != Frame.OK or len(payload) < 8:
                raise GuestProtocolError(f"unexpected frame {frame_type} opening a watch")
            self.directories, flags = struct.unpack_from("<II", payload)
            self.complete = not flags & WATCH_INCOMPLETE
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        assert self._conn is not None, "use `async with client.watch(...)`"
        conn = self._conn
        while True:
            frame_type, payload = await conn.read_frame()
            if frame_type == Frame.WATCH_EVENT and len(payload) >= 8:
                kind, entry_type = struct.unpack_from("<II", payload)
                yield WatchEvent(
                    WATCH_KINDS.get(kind, "overflow"),
                    WATCH_TYPES.get(entry_type, "other"),
                    payload[8:].decode("utf-8", "surrogateescape"),
                )
            elif frame_type == Frame.ERROR:
                raise file_error(payload)
            else:
                raise GuestProtocolError(f"unexpected frame {frame_type} in a watch")
