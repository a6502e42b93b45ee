"""Errors the host agent's internal API returns, each with a stable ``code`` and HTTP ``status``.

Rendered as ``{"error": code, "message": ...}`` by one handler in ``app.py``; ``client.py`` maps the
codes back to its own exception classes.

    HostAgentServerError
    ├── BadRequest            400 bad_request
    ├── UnknownImage          400 unknown_image
    ├── BadPath               400 bad_path
    ├── IsDirectory           400 is_directory
    ├── SpawnFailed           400 spawn_failed (a managed process's command did not start)
    ├── Unauthorized          401 unauthorized
    ├── SandboxNotFound       404 sandbox_not_found
    ├── FileNotFound          404 file_not_found
    ├── ParentNotFound        404 parent_not_found
    ├── ProcessNotFound       404 process_not_found
    ├── AlreadyExists         409 already_exists
    ├── InvalidState          409 invalid_state
    ├── ProcessState          409 process_state (the process cannot do that: no terminal, exited)
    ├── UnsupportedOnTier     409 unsupported_on_tier (the sandbox's isolation tier does not offer it)
    ├── RequestTimeout        408 request_timeout (a body that stopped coming; paddock_core.bodylimit)
    ├── PayloadTooLarge       413 payload_too_large
    ├── SandboxFailed         500 sandbox_failed (boot, runtime or host tool failure)
    ├── Busy                  503 busy (the sandbox's guest takes no more connections now; Retry-After)
    ├── SandboxDiskFull       507 sandbox_disk_full (an upload met the sandbox's full disk; nothing kept)
    └── InsufficientCapacity  507 insufficient_capacity
"""

from __future__ import annotations


class HostAgentServerError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class BadRequest(HostAgentServerError):
    status, code = 400, "bad_request"


class UnknownImage(HostAgentServerError):
    status, code = 400, "unknown_image"


class BadPath(HostAgentServerError):
    status, code = 400, "bad_path"


class IsDirectory(HostAgentServerError):
    status, code = 400, "is_directory"


class UnknownUser(HostAgentServerError):
    """The user a command was to run as is not in the sandbox's /etc/passwd; nothing ran."""

    status, code = 400, "unknown_user"


class SpawnFailed(HostAgentServerError):
    status, code = 400, "spawn_failed"


class Unauthorized(HostAgentServerError):
    status, code = 401, "unauthorized"


class SandboxNotFound(HostAgentServerError):
    status, code = 404, "sandbox_not_found"


class SnapshotNotFound(HostAgentServerError):
    status, code = 404, "snapshot_not_found"


class FileNotFound(HostAgentServerError):
    status, code = 404, "file_not_found"


class ParentNotFound(HostAgentServerError):
    status, code = 404, "parent_not_found"


class ProcessNotFound(HostAgentServerError):
    status, code = 404, "process_not_found"


class AlreadyExists(HostAgentServerError):
    status, code = 409, "already_exists"


class InvalidState(HostAgentServerError):
    status, code = 409, "invalid_state"


class ProcessState(HostAgentServerError):
    status, code = 409, "process_state"


class UnsupportedOnTier(HostAgentServerError):
    """The operation is not offered on the sandbox's isolation tier (docs/isolation.md); nothing changed."""

    status, code = 409, "unsupported_on_tier"


class RequestTimeout(HostAgentServerError):
    status, code = 408, "request_timeout"


class PayloadTooLarge(HostAgentServerError):
    status, code = 413, "payload_too_large"


class SandboxFailed(HostAgentServerError):
    status, code = 500, "sandbox_failed"


class Busy(HostAgentServerError):
    """Overload, not failure: the request never reached the guest, and the same one may be sent again
    after ``retry_after_s`` (sent as ``Retry-After``)."""

    status, code = 503, "busy"
    retry_after_s = 1


class SandboxDiskFull(HostAgentServerError):
    """The sandbox's own disk (or quota) is full: its user's to free, not the host's capacity."""

    status, code = 507, "sandbox_disk_full"


class InsufficientCapacity(HostAgentServerError):
    status, code = 507, "insufficient_capacity"
