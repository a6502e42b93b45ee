"""The SDK's exception tree.

PaddockError
├── TransportError            the request never got an answer (connect, read, timeout)
├── ProtocolError             an answer that is not the contract's envelope
├── WaitTimeoutError          a wait helper ran out of time
└── APIError                  an error answer: status, code, message, request_id
    ├── ValidationError       400
    ├── AuthenticationError   401
    ├── PaymentRequiredError  402
    ├── PermissionDeniedError 403
    ├── NotFoundError         404
    ├── ConflictError         409
    ├── PayloadTooLargeError  413
    ├── RateLimitedError      429 (retry_after_s)
    └── ServerError           5xx
"""

from __future__ import annotations


class PaddockError(Exception):
    """Root of every exception the SDK raises."""


class TransportError(PaddockError):
    """The request got no answer: connection refused, reset, or timed out."""


class ProtocolError(PaddockError):
    """The server answered with something that is not the contract's envelope."""


class WaitTimeoutError(PaddockError):
    """A wait helper (for example waiting for ``running``) ran out of time."""


class APIError(PaddockError):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        request_id: str | None = None,
        fields: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {code or ''} {message}".replace("  ", " ").strip())
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.fields = fields or {}


class ValidationError(APIError):
    pass


class AuthenticationError(APIError):
    pass


class PaymentRequiredError(APIError):
    pass


class PermissionDeniedError(APIError):
    pass


class NotFoundError(APIError):
    pass


class ConflictError(APIError):
    pass


class PayloadTooLargeError(APIError):
    pass


class RateLimitedError(APIError):
    def __init__(self, *args: object, retry_after_s: float | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.retry_after_s = retry_after_s


class ServerError(APIError):
    pass


_BY_STATUS: dict[int, type[APIError]] = {
    400: ValidationError,
    401: AuthenticationError,
    402: PaymentRequiredError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitedError,
}


def error_class(status: int) -> type[APIError]:
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, APIError)
