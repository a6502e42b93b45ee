"""Domain errors shared by the services.

Every error a caller may see is a ``PaddockError`` with a stable machine ``code`` and an HTTP
``status``. One handler per service renders them into that service's envelope; nothing else decides
status codes.

    PaddockError
    ├── ValidationFailed      400 VALIDATION_FAILED (carries per-field reasons)
    ├── RegionMismatch        400 REGION_MISMATCH
    ├── Unauthorized          401 UNAUTHORIZED
    ├── InsufficientCredit    402 INSUFFICIENT_CREDIT
    ├── PlanLimit             403 PLAN_LIMIT
    ├── QuotaExceeded         403 QUOTA_EXCEEDED
    ├── Forbidden             403 FORBIDDEN
    ├── NotFound              404 NOT_FOUND
    ├── MethodNotAllowed      405 METHOD_NOT_ALLOWED
    ├── InvalidState          409 INVALID_STATE
    ├── AlreadyExists         409 ALREADY_EXISTS
    ├── InUse                 409 IN_USE
    ├── PayloadTooLarge       413 PAYLOAD_TOO_LARGE
    ├── RateLimited           429 RATE_LIMITED (carries retry_after_s)
    ├── ServerError           500 (error envelope)
    ├── NotImplementedYet     501 (error envelope)
    ├── Unavailable           503 (error envelope, carries retry_after_s)
    └── InsufficientStorage   507 (error envelope: the sandbox's own disk is full)
"""

from __future__ import annotations

from collections.abc import Mapping


class PaddockError(Exception):
    status: int = 500
    code: str = "INTERNAL"
    default_message: str = "internal error"

    def __init__(self, message: str | None = None, *, fields: Mapping[str, str] | None = None) -> None:
        self.message = message or self.default_message
        self.fields: dict[str, str] = dict(fields or {})
        super().__init__(self.message)


class ValidationFailed(PaddockError):
    status, code, default_message = 400, "VALIDATION_FAILED", "validation failed"

    @classmethod
    def field(cls, name: str, reason: str) -> ValidationFailed:
        return cls(f"{name}: {reason}", fields={name: reason})


class RegionMismatch(PaddockError):
    status, code, default_message = 400, "REGION_MISMATCH", "region does not match this server"


class Unauthorized(PaddockError):
    status, code, default_message = 401, "UNAUTHORIZED", "missing or invalid API key"


class InsufficientCredit(PaddockError):
    status, code, default_message = 402, "INSUFFICIENT_CREDIT", "no credit left"


class PlanLimit(PaddockError):
    status, code, default_message = 403, "PLAN_LIMIT", "not included in your plan"


class QuotaExceeded(PaddockError):
    status, code, default_message = 403, "QUOTA_EXCEEDED", "quota exceeded"


class Forbidden(PaddockError):
    status, code, default_message = 403, "FORBIDDEN", "forbidden"


class NotFound(PaddockError):
    status, code, default_message = 404, "NOT_FOUND", "not found"


class MethodNotAllowed(PaddockError):
    status, code, default_message = 405, "METHOD_NOT_ALLOWED", "method not allowed"


class InvalidState(PaddockError):
    status, code, default_message = 409, "INVALID_STATE", "operation not allowed in the current state"


class AlreadyExists(PaddockError):
    status, code, default_message = 409, "ALREADY_EXISTS", "already exists"


class InUse(PaddockError):
    status, code, default_message = 409, "IN_USE", "resource in use"


class RequestTimeout(PaddockError):
    """A request's body stopped coming (``paddock_core.bodylimit``'s minimum rate): nothing was done."""

    status, code, default_message = 408, "REQUEST_TIMEOUT", "the request's body came too slowly"


class PayloadTooLarge(PaddockError):
    status, code, default_message = 413, "PAYLOAD_TOO_LARGE", "payload too large"


class RateLimited(PaddockError):
    status, code, default_message = 429, "RATE_LIMITED", "rate limited"

    def __init__(self, message: str | None = None, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(PaddockError):
    status, code, default_message = 500, "INTERNAL", "internal error"


class NotImplementedYet(PaddockError):
    status, code, default_message = 501, "NOT_IMPLEMENTED", "not implemented"


class Unavailable(PaddockError):
    status, code, default_message = 503, "UNAVAILABLE", "service unavailable"

    def __init__(self, message: str | None = None, *, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InsufficientStorage(PaddockError):
    status, code, default_message = 507, "INSUFFICIENT_STORAGE", "the sandbox's disk is full"
