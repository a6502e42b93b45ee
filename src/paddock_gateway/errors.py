"""The gateway's errors: each carries the contract's HTTP status, stable ``code`` (§11) and extra fields.

    GatewayError
    ├── InvalidJson                 400 invalid_json
    ├── InvalidBody                 400 invalid_body (details: [{field, message}])
    ├── NameTaken                   400 name_taken
    ├── InvalidTxHash               400 invalid_tx_hash
    ├── UnsupportedChain            400 unsupported_chain
    ├── UnsupportedToken            400 unsupported_token
    ├── InvalidHeader               400 invalid_header
    ├── InvalidAddress              400 invalid_address
    ├── InvalidPaymentSignature     400 invalid_payment_signature (field: the malformed part)
    ├── MixedPaymentMethods         400 mixed_payment_methods
    ├── AuthError                   401 auth_missing | auth_malformed | auth_expired | … (reason)
    ├── PaymentRequired             402 payment_required (the quote)
    ├── PaymentVerificationFailed   402 payment_verification_failed (reason, tx_hash …; x402: PAYMENT-RESPONSE)
    ├── NotOwner                    403 not_owner
    ├── NotFound                    404 not_found
    ├── MethodNotAllowed            405 method_not_allowed
    ├── PaymentAlreadyProcessed     409 payment_already_processed
    ├── UptoAlreadyOpen             409 upto_already_open (extend by ``upto`` while one funds the project)
    ├── RequestTooLarge             413 request_too_large
    ├── RateLimited                 429 rate_limited (Retry-After)
    ├── TopupFailed                 500 topup_failed
    ├── DeployFailedAfterTopup      500 deploy_failed_after_topup
    ├── DeployFailed                500 deploy_failed
    ├── DeleteFailed                500 delete_failed
    ├── UpstreamUnavailable         502 upstream_unavailable
    └── PricingUnavailable          503 pricing_unavailable

Adapters raise their own errors (``ChainError``, ``HostingError``, ``PricingError``); the domain turns
them into these. One handler (``api/errors.py``) renders them as ``{error, code, …}``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    status: int = 500
    code: str = "internal_error"
    message: str = "Internal error"

    def __init__(self, message: str | None = None, **extra: Any) -> None:
        self.message = message or type(self).message
        self.extra = {k: v for k, v in extra.items() if v is not None}
        self.headers: dict[str, str] = {}
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, **self.extra}


class InvalidJson(GatewayError):
    status, code, message = 400, "invalid_json", "Body is not valid JSON"


class InvalidBody(GatewayError):
    status, code, message = 400, "invalid_body", "Invalid body"

    def __init__(self, details: list[dict[str, str]]) -> None:
        super().__init__(details=details)


class NameTaken(GatewayError):
    status, code, message = 400, "name_taken", "uniqueName is already taken"


class InvalidTxHash(GatewayError):
    status, code, message = 400, "invalid_tx_hash", "X-Payment-Tx must be 0x followed by 64 hex digits"


class UnsupportedChain(GatewayError):
    status, code, message = 400, "unsupported_chain", "Unsupported chain"


class UnsupportedToken(GatewayError):
    status, code, message = 400, "unsupported_token", "Unsupported token"


class InvalidHeader(GatewayError):
    status, code, message = 400, "invalid_header", "X-Use-Existing-Credits must be true or false"


class InvalidAddress(GatewayError):
    status, code, message = 400, "invalid_address", "Invalid EVM address"


class InvalidPaymentSignature(GatewayError):
    status, code = 400, "invalid_payment_signature"
    message = "PAYMENT-SIGNATURE is not a valid x402 v2 exact EIP-3009 payment payload"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"PAYMENT-SIGNATURE: {field}: {reason}", field=field)


class MixedPaymentMethods(GatewayError):
    status, code = 400, "mixed_payment_methods"
    message = "Send either X-Payment-Tx or PAYMENT-SIGNATURE, not both"


class AuthError(GatewayError):
    status = 401
    MESSAGES: ClassVar[dict[str, str]] = {
        "auth_missing": "Missing authentication headers",
        "auth_malformed": "Malformed authentication headers",
        "auth_expired": "Timestamp outside the allowed window",
        "auth_invalid_signature": "Invalid signature",
        "auth_nonce_reused": "Nonce already used",
        "auth_siwx_rejected": "Sign-in-with-x proof rejected",
    }

    def __init__(self, code: str, reason: str | None = None) -> None:
        self.code = code
        super().__init__(self.MESSAGES[code], reason=reason)  # reason: why a smart wallet was refused


class PaymentRequired(GatewayError):
    status, code, message = 402, "payment_required", "Payment required"


class PaymentVerificationFailed(GatewayError):
    status, code, message = 402, "payment_verification_failed", "Payment verification failed"


class NotOwner(GatewayError):
    status, code, message = 403, "not_owner", "Forbidden: wallet is not the deployer"


class NotFound(GatewayError):
    status, code, message = 404, "not_found", "Not found"


class MethodNotAllowed(GatewayError):
    status, code, message = 405, "method_not_allowed", "Method not allowed"


class PaymentAlreadyProcessed(GatewayError):
    status, code, message = 409, "payment_already_processed", "Payment already processed"


class UptoAlreadyOpen(GatewayError):
    status, code = 409, "upto_already_open"
    message = "An upto authorisation already funds this project; extend it once that one is settled"


class RequestTooLarge(GatewayError):
    status, code, message = 413, "request_too_large", "Request body exceeds 50 MiB"


class RateLimited(GatewayError):
    status, code, message = 429, "rate_limited", "Too many requests"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__()
        self.headers["Retry-After"] = str(max(1, retry_after_s))


class TopupFailed(GatewayError):
    status, code = 500, "topup_failed"
    message = "Credit top-up failed after the payment was verified; resubmit the same X-Payment-Tx"


class DeployFailedAfterTopup(GatewayError):
    status, code = 500, "deploy_failed_after_topup"
    message = (
        "Deployment failed after credits were added; retry without payment headers "
        "and with X-Use-Existing-Credits: true"
    )


class DeployFailed(GatewayError):
    status, code, message = 500, "deploy_failed", "Deployment failed"


class DeleteFailed(GatewayError):
    status, code, message = 500, "delete_failed", "Project deletion failed"


class UpstreamUnavailable(GatewayError):
    status, code, message = 502, "upstream_unavailable", "An upstream service is unavailable"


class PricingUnavailable(GatewayError):
    status, code, message = 503, "pricing_unavailable", "Pricing is unavailable"
