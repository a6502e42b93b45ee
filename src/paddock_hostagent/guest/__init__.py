"""The in-sandbox guest agent: C source (``agent.c``), its build (``build.py``) and the host-side client."""

from __future__ import annotations

from paddock_hostagent.guest.client import (
    ExecEvent,
    ExecRequest,
    ExecSession,
    Exited,
    FileDownload,
    GuestClient,
    GuestInfo,
    Output,
    SpawnFailed,
)
from paddock_hostagent.guest.protocol import (
    GuestBadPathError,
    GuestError,
    GuestFileError,
    GuestFileNotFoundError,
    GuestIsDirectoryError,
    GuestParentNotFoundError,
    GuestProtocolError,
    GuestTooOldError,
    GuestUnavailableError,
    GuestUserError,
    GuestVersionError,
)

__all__ = [
    "ExecEvent",
    "ExecRequest",
    "ExecSession",
    "Exited",
    "FileDownload",
    "GuestBadPathError",
    "GuestClient",
    "GuestError",
    "GuestFileError",
    "GuestFileNotFoundError",
    "GuestInfo",
    "GuestIsDirectoryError",
    "GuestParentNotFoundError",
    "GuestProtocolError",
    "GuestTooOldError",
    "GuestUnavailableError",
    "GuestUserError",
    "GuestVersionError",
    "Output",
    "SpawnFailed",
]
