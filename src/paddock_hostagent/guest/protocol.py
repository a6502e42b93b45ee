"""The guest agent's wire format, host side: frame types, encoders and the error tree.

A frame is ``u8 type | u32 little-endian length | payload``; strings inside payloads are ``u32 length |
bytes``. The C side is ``agent.c``; the two tables must agree. ``PROTOCOL_VERSION`` guards them: the
guest reports its version in every INFO reply, and a booting sandbox whose guest reports another one
is refused (``check_version``), so a stale guest binary fails its boot saying so instead of
misreading frames.

    GuestError
    ├── GuestUnavailableError     the socket does not answer (sandbox gone, paused, or agent dead)
    ├── GuestProtocolError        a malformed or unexpected frame
    │   └── GuestVersionError     the guest speaks another protocol version
    ├── GuestProcessError         a managed-process request failed inside the guest (processes.py)
    │   ├── GuestProcessNotFoundError
    │   ├── GuestProcessStateError    the process cannot do that now (no PTY, exited, limits)
    │   └── GuestSpawnError           the command did not start
    └── GuestFileError            a file request failed inside the guest
        ├── GuestFileNotFoundError
        ├── GuestParentNotFoundError
        ├── GuestIsDirectoryError
        ├── GuestNotDirectoryError
        ├── GuestBadPathError
        └── GuestWatchUnavailableError  the sandbox has no inotify to give (or its guest predates WATCH)
"""

from __future__ import annotations

import struct
from enum import IntEnum

PROTOCOL_VERSION = 2
HEADER = struct.Struct("<BI")
MAX_DATA_PAYLOAD_BYTES = 1 << 20
# MAX_CONTROL_PAYLOAD in guest.h: an EXEC frame (cmd, args, env, cwd) larger than this is refused by
# the guest, which hangs up; the host agent answers 413 before sending one.
MAX_CONTROL_PAYLOAD_BYTES = 4 << 20
EXEC_HAS_STDIN = 1
UNKNOWN_SIZE = 2**64 - 1


class Frame(IntEnum):
    EXEC = 1
    STDIN = 2
    STDIN_EOF = 3
    WRITE = 4
    READ = 5
    DATA = 6
    DATA_END = 7
    INFO = 8
    EXEC_AS = 9  # a user (name or uid) first, then EXEC's payload; the guest answers OK once it has them
    WATCH = 10  # u32 flags, path: OK u32 dirs, u32 flags, then WATCH_EVENT frames (watch.c)
    PROC = 16
    STDOUT = 32
    STDERR = 33
    EXIT = 34
    ERROR = 35
    OK = 36
    SIZE = 37
    INFO_REPLY = 38
    PROC_REPLY = 40
    PROC_OUTPUT = 41
    PROC_EXIT = 42
    WATCH_EVENT = 43


class ErrorCode(IntEnum):
    SPAWN = 1
    FILE_NOT_FOUND = 2
    PARENT_NOT_FOUND = 3
    IS_DIRECTORY = 4
    BAD_PATH = 5
    IO = 6
    PROTOCOL = 7
    PROC_NOT_FOUND = 8
    PROC_STATE = 9
    USER = 10  # no such user in the sandbox's /etc/passwd
    NOT_DIRECTORY = 11  # WATCH of a path that is not a directory
    WATCH_UNAVAILABLE = 12  # WATCH: no inotify instance (or watch) to be had in the sandbox


class GuestError(Exception):
    """Root of everything the guest client raises."""


class GuestUnavailableError(GuestError):
    pass


class GuestProtocolError(GuestError):
    pass


class GuestVersionError(GuestProtocolError):
    pass


def check_version(version: int) -> None:
    """Refuses a guest agent built from another protocol version than this host agent's."""
    if version != PROTOCOL_VERSION:
        raise GuestVersionError(
            f"guest agent speaks protocol version {version}, this host agent {PROTOCOL_VERSION}; "
            "rebuild the guest agent (python -m paddock_hostagent.guest.build)"
        )


class GuestUserError(GuestError):
    """The user a command was to run as is not in the sandbox's ``/etc/passwd`` (the guest's words)."""


class GuestTooOldError(GuestError):
    """The sandbox's guest agent predates the request (it was started before the host agent that sent
    it): it refused it without running anything."""


#: A guest agent older than EXEC_AS and START_AS refuses them; the sandbox is to be created anew.
GUEST_TOO_OLD_FOR_USER = (
    "this sandbox's guest agent predates running a command as a user (it was started before this "
    "host agent); create the sandbox anew to get one that can"
)

#: A user name or uid sent to the guest: at most RUN_AS_MAX_NAME bytes (guest.h).
MAX_USER_BYTES = 256


class GuestFileError(GuestError):
    code: ErrorCode = ErrorCode.IO


class GuestFileNotFoundError(GuestFileError):
    code = ErrorCode.FILE_NOT_FOUND


class GuestParentNotFoundError(GuestFileError):
    code = ErrorCode.PARENT_NOT_FOUND


class GuestIsDirectoryError(GuestFileError):
    code = ErrorCode.IS_DIRECTORY


class GuestBadPathError(GuestFileError):
    code = ErrorCode.BAD_PATH


class GuestNotDirectoryError(GuestFileError):
    code = ErrorCode.NOT_DIRECTORY


class GuestWatchUnavailableError(GuestFileError):
    """No watch from this guest: no inotify instance to be had, or a guest older than WATCH. The
    caller may fall back to polling a listing."""

    code = ErrorCode.WATCH_UNAVAILABLE


_FILE_ERRORS: dict[int, type[GuestFileError]] = {
    cls.code: cls
    for cls in (
        GuestFileNotFoundError,
        GuestParentNotFoundError,
        GuestIsDirectoryError,
        GuestBadPathError,
        GuestNotDirectoryError,
        GuestWatchUnavailableError,
    )
}

#: WATCH's flags (guest.h): the request's, and the OK's.
WATCH_RECURSIVE = 1
WATCH_INCOMPLETE = 1
#: A WATCH_EVENT's kind and type (guest.h), as the host agent's NDJSON names them.
WATCH_KINDS = {1: "create", 2: "modify", 3: "delete", 4: "overflow"}
WATCH_TYPES = {1: "file", 2: "dir", 3: "symlink", 4: "other"}


def file_error(payload: bytes) -> GuestError:
    """Turns an ERROR frame's payload into the matching exception."""
    code, message = decode_error(payload)
    if code == ErrorCode.PROTOCOL:
        return GuestProtocolError(message)
    return _FILE_ERRORS.get(code, GuestFileError)(message)


def decode_error(payload: bytes) -> tuple[int, str]:
    if len(payload) < 4:
        raise GuestProtocolError("short error frame")
    (code,) = struct.unpack_from("<I", payload)
    return code, payload[4:].decode("utf-8", "replace")


def frame(frame_type: Frame, payload: bytes = b"") -> bytes:
    return HEADER.pack(frame_type, len(payload)) + payload


def _string(value: str) -> bytes:
    raw = value.encode()
    if b"\0" in raw:
        raise ValueError("strings sent to the guest may not contain NUL")
    return struct.pack("<I", len(raw)) + raw


def encode_exec(
    cmd: str, args: list[str], env: dict[str, str], cwd: str, *, has_stdin: bool, user: str | None = None
) -> bytes:
    """An EXEC frame, or with ``user`` an EXEC_AS one (an older guest refuses that, running nothing)."""
    parts = [] if user is None else [_string(user)]
    parts += [struct.pack("<III", EXEC_HAS_STDIN if has_stdin else 0, len(args), len(env)), _string(cmd)]
    parts += [_string(arg) for arg in args]
    parts += [_string(f"{key}={value}") for key, value in env.items()]
    parts.append(_string(cwd))
    return frame(Frame.EXEC if user is None else Frame.EXEC_AS, b"".join(parts))


def exec_payload_bytes(cmd: str, args: list[str], env: dict[str, str], cwd: str) -> int:
    """The size of ``encode_exec``'s payload, without building it."""
    strings = [cmd, *args, cwd, *(f"{key}={value}" for key, value in env.items())]
    return 12 + sum(4 + len(item.encode()) for item in strings)


def encode_path_request(frame_type: Frame, path: str) -> bytes:
    return frame(frame_type, _string(path))


def encode_watch(path: str, *, recursive: bool) -> bytes:
    return frame(Frame.WATCH, struct.pack("<I", WATCH_RECURSIVE if recursive else 0) + _string(path))


def chunked_frames(frame_type: Frame, chunk: bytes) -> list[bytes | memoryview]:
    """A chunk as DATA or STDIN frames no larger than the guest accepts: headers and views of the
    chunk, to be written as they are (``writelines``), so its bytes are never copied into frames."""
    step = MAX_DATA_PAYLOAD_BYTES
    view = memoryview(chunk)
    parts: list[bytes | memoryview] = []
    for start in range(0, len(view), step):
        piece = view[start : start + step]
        parts += (HEADER.pack(frame_type, len(piece)), piece)
    return parts
