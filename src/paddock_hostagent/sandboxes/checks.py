"""What a sandbox request is refused for, and how driver and guest errors become the contract's.

Each noun of ``sandboxes/`` checks its input here and wraps its driver and guest calls in
``driver_errors``/``guest_file_errors``, so an error means the same thing whichever route met it
(``errors.py`` holds the contract's errors themselves).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from paddock_hostagent import errors
from paddock_hostagent.drivers.base import (
    CapacityError,
    DriverError,
    NotRunningError,
    TierUnsupportedError,
    UnsupportedError,
)
from paddock_hostagent.drivers.net.egress_rules import EgressPolicy, EgressRuleError
from paddock_hostagent.guest import (
    GuestBadPathError,
    GuestError,
    GuestFileNotFoundError,
    GuestIsDirectoryError,
    GuestParentNotFoundError,
)
from paddock_hostagent.guest.client import GuestBusyError, GuestNoSpaceError


def check_rules(rules: list[str]) -> None:
    try:
        EgressPolicy.parse(rules)
    except EgressRuleError as exc:
        raise errors.BadRequest(str(exc)) from exc


def check_path(path: str) -> None:
    if not path or not path.startswith("/") or "\0" in path or len(path) >= os.pathconf("/", "PC_PATH_MAX"):
        raise errors.BadPath(f"path must be absolute and without NUL: {path!r}")


def check_no_nul(values: list[str]) -> None:
    if any("\0" in value for value in values):
        raise errors.BadRequest("cmd, args, env and cwd may not contain NUL characters")


@contextlib.contextmanager
def driver_errors() -> Any:
    try:
        yield
    except CapacityError as exc:
        raise errors.InsufficientCapacity(str(exc)) from exc
    except NotRunningError as exc:
        raise errors.InvalidState(str(exc)) from exc
    except TierUnsupportedError as exc:
        raise errors.UnsupportedOnTier(str(exc)) from exc
    except UnsupportedError as exc:
        raise errors.BadRequest(str(exc)) from exc
    except DriverError as exc:
        raise errors.SandboxFailed(str(exc)) from exc


@contextlib.asynccontextmanager
async def guest_file_errors(sandbox_id: str) -> AsyncIterator[None]:
    try:
        yield
    except GuestFileNotFoundError as exc:
        raise errors.FileNotFound(str(exc)) from exc
    except GuestParentNotFoundError as exc:
        raise errors.ParentNotFound(str(exc)) from exc
    except GuestIsDirectoryError as exc:
        raise errors.IsDirectory(str(exc)) from exc
    except GuestBadPathError as exc:
        raise errors.BadPath(str(exc)) from exc
    except GuestNoSpaceError as exc:
        raise errors.SandboxDiskFull(
            f"the disk of sandbox {sandbox_id} is full; nothing was written ({exc})"
        ) from exc
    except GuestBusyError as exc:
        raise errors.Busy(f"sandbox {sandbox_id} is busy: {exc}; retry") from exc
    except GuestError as exc:
        raise errors.SandboxFailed(f"file transfer with {sandbox_id} failed: {exc}") from exc
