"""The SDK's exception tree.

PaddockError
├── TransportError            the request never got an answer (connect, read, timeout)
├── ProtocolError             an answer that is not the contract's envelope
├── WaitTimeoutError          a wait helper ran out of time
├── SandboxStateError         a wait saw a terminal state (also a RuntimeError); ``.status``
├── WebhookVerificationError  ``paddock.webhooks.verify`` rejected a delivery
├── PaymentError              GatewayClient: the payment could not be made or was not accepted
│   ├── InsufficientFundsError    token (or gas) balance below the quote; nothing was sent
│   └── PaymentVerificationError  the gateway refused a transfer that was sent (``.reason``, ``.tx_hash``)
├── DeploymentFailedError     a gateway deployment ended ``failed`` (``.reason``)
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
    """The request got no answer: connection refused, reset, or timed out (the message names the URL)."""


class CommandTimeoutError(TransportError, TimeoutError):
    """``run(..., timeout_s=N)`` got no answer in N seconds. The command may still be running in the
    sandbox; ``run`` has no limit of its own unless given one (raise ``timeout_s`` or leave it unset)."""


class CommandStartError(PaddockError):
    """The command could not be started in the sandbox (no such program, not executable, bad ``cwd``);
    ``run`` raises it instead of returning ``exit_code=-1``. The CLI exits 127 for it, as a shell does."""

    def __init__(self, message: str, *, cmd: str) -> None:
        super().__init__(message)
        self.cmd = cmd


class PaddockWarning(UserWarning):
    """The server did what was asked but said something about it (its ``Warning`` header), such as a
    body field it does not know and ignored (a typo like ``envz``)."""


class ProtocolError(PaddockError):
    """The server answered with something that is not the contract's envelope."""


class WaitTimeoutError(PaddockError):
    """A wait helper (for example waiting for ``running``) ran out of time."""


class SandboxStateError(PaddockError, RuntimeError):
    """A wait saw a state it can never leave for the one it waited for (``failed``, ``destroyed`` …)."""

    def __init__(self, message: str, *, sandbox_id: str, status: str) -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id
        self.status = status


class WebhookVerificationError(PaddockError):
    """A webhook delivery whose signature does not match, or whose timestamp is missing or stale."""


class PaymentError(PaddockError):
    """GatewayClient could not pay, or the gateway did not accept what was paid."""

    def __init__(self, message: str, *, tx_hash: str | None = None) -> None:
        super().__init__(message)
        self.tx_hash = tx_hash


class InsufficientFundsError(PaymentError):
    """The wallet holds less than the quote (tokens) or no gas; no transaction was sent."""


class PaymentVerificationError(PaymentError):
    """The gateway answered 402 ``payment_verification_failed`` for a transfer that was sent."""

    def __init__(self, message: str, *, tx_hash: str | None, reason: str | None) -> None:
        super().__init__(message, tx_hash=tx_hash)
        self.reason = reason


class DeploymentFailedError(PaddockError):
    """A gateway deployment reached ``failed``."""

    def __init__(self, message: str, *, reason: str | None, status: dict[str, object]) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


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
