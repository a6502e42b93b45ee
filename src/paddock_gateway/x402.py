"""x402 v2 on the wire (Appendix B.1/B.4): the offers in ``PAYMENT-REQUIRED``, the parsing of
``PAYMENT-SIGNATURE`` and the ``PAYMENT-RESPONSE`` header. No database, no chain: ``settlement.py``
verifies and settles what this module parsed.

Only USDC is offered, with the ``exact`` scheme and EIP-3009 ``transferWithAuthorization``: USDC has
it on Base and Arbitrum One under the EIP-712 domain ``("USD Coin", "2")``. USDT is not offered: the
Base USDT contract has no EIP-3009, and the ``permit2`` method needs an on-chain Permit2 allowance
and the x402 proxy contract, which this gateway does not implement. USDT stays payable through
``X-Payment-Tx``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from paddock_gateway.errors import InvalidPaymentSignature
from paddock_gateway.registry import ChainSpec, Registry, TokenSpec

X402_VERSION = 2
SCHEME = "exact"
PAYMENT_REQUIRED = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE = "PAYMENT-RESPONSE"
#: Browsers may read a response header only if the server names it (x402 HTTP transport, CORS).
EXPOSE_HEADERS = {"Access-Control-Expose-Headers": f"{PAYMENT_REQUIRED}, {PAYMENT_RESPONSE}"}
MAX_TIMEOUT_S = 300
#: The tokens offered over x402 and their EIP-712 domain (name, version), as deployed on both chains.
EIP3009_DOMAINS: dict[str, tuple[str, str]] = {"usdc": ("USD Coin", "2")}
#: A header larger than this is not a payment payload (one holds well under 2 KiB).
MAX_HEADER_CHARS = 16_384

ADDRESS_RE = re.compile(r"^0x[0-9a-fA-F]{40}$")
NONCE_RE = re.compile(r"^0x[0-9a-fA-F]{64}$")
SIGNATURE_RE = re.compile(r"^0x[0-9a-fA-F]{130}$")
UINT_RE = re.compile(r"^[0-9]{1,78}$")
UINT256_MAX = 2**256 - 1


def network_of(chain: ChainSpec) -> str:
    """The CAIP-2 id of a chain: ``eip155:<chain id>``."""
    return f"eip155:{chain.chain_id}"


@dataclass(frozen=True)
class Offer:
    """One ``exact`` requirement: a chain and a token with an EIP-3009 domain."""

    chain: ChainSpec
    token: TokenSpec
    domain_name: str
    domain_version: str

    @property
    def network(self) -> str:
        return network_of(self.chain)

    def requirement(self, amount_raw: int) -> dict[str, Any]:
        return {
            "scheme": SCHEME,
            "network": self.network,
            "amount": str(amount_raw),
            "asset": self.token.address,
            "payTo": self.chain.recipient,
            "maxTimeoutSeconds": MAX_TIMEOUT_S,
            "extra": {
                "name": self.domain_name,
                "version": self.domain_version,
                "assetTransferMethod": "eip3009",
            },
        }


def offers(registry: Registry) -> list[Offer]:
    """Every chain in the contract's order, USDC only (see the module docstring for USDT)."""
    return [
        Offer(chain=chain, token=chain.token(name), domain_name=domain[0], domain_version=domain[1])
        for chain in registry.ordered()
        for name, domain in EIP3009_DOMAINS.items()
        if name in chain.tokens
    ]


def payment_required(
    registry: Registry, amount_raw: int, resource_url: str, error: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "x402Version": X402_VERSION,
        "resource": {
            "url": resource_url,
            "description": "Deploy an application on Paddock",
            "mimeType": "application/json",
        },
        "accepts": [offer.requirement(amount_raw) for offer in offers(registry)],
    }
    if error is not None:
        body["error"] = error
    return body


def encode_header(value: dict[str, Any]) -> str:
    """Standard base64, with padding, of the compact UTF-8 JSON (x402 v2 HTTP transport)."""
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode("ascii")


def settlement_response(
    *, success: bool, network: str, payer: str | None, transaction: str = "", error_reason: str | None = None
) -> dict[str, str]:
    """The ``PAYMENT-RESPONSE`` header (a ``SettlementResponse``), with the CORS exposure."""
    body: dict[str, Any] = {"success": success, "transaction": transaction, "network": network}
    if payer is not None:
        body["payer"] = payer
    if error_reason is not None:
        body["errorReason"] = error_reason
    return {PAYMENT_RESPONSE: encode_header(body), **EXPOSE_HEADERS}


@dataclass(frozen=True)
class Authorization:
    """EIP-3009 ``TransferWithAuthorization`` values; addresses and the nonce lowercase."""

    payer: str
    to: str
    value: int
    valid_after: int
    valid_before: int
    nonce: str


@dataclass(frozen=True)
class SignedPayment:
    """A parsed ``PAYMENT-SIGNATURE``: the offer the client says it accepted, and what it signed."""

    scheme: str
    network: str
    asset: str  # lowercase
    pay_to: str  # lowercase
    amount: str
    authorization: Authorization
    signature: bytes  # 65 bytes r ‖ s ‖ v


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidPaymentSignature(field, "must be a JSON object")
    return value


def _string(container: dict[str, Any], key: str, field: str, pattern: re.Pattern[str] | None = None) -> str:
    value = container.get(key)
    if not isinstance(value, str):
        raise InvalidPaymentSignature(f"{field}.{key}" if field else key, "must be a string")
    if pattern is not None and not pattern.match(value):
        raise InvalidPaymentSignature(f"{field}.{key}" if field else key, "has the wrong format")
    return value


def _uint(container: dict[str, Any], key: str, field: str) -> int:
    number = int(_string(container, key, field, UINT_RE))
    if number > UINT256_MAX:
        raise InvalidPaymentSignature(f"{field}.{key}", "exceeds uint256")
    return number


def decode_header(value: str) -> dict[str, Any]:
    """Strict standard base64 (RFC 4648 §4, padding required) of a JSON object, else 400."""
    if len(value) > MAX_HEADER_CHARS:
        raise InvalidPaymentSignature("header", f"longer than {MAX_HEADER_CHARS} characters")
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidPaymentSignature("header", "is not standard base64") from None
    try:
        decoded = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidPaymentSignature("header", "is not base64 of UTF-8 JSON") from None
    return _object(decoded, "header")


def parse_payment_signature(value: str) -> SignedPayment:
    """The syntax of a ``PAYMENT-SIGNATURE`` (step 5 of §5.3.3): every malformed part is a 400 naming
    the field. Whether it pays for this deploy is decided later (``settlement.check``) as a 402."""
    payload = decode_header(value)
    if payload.get("x402Version") != X402_VERSION or isinstance(payload.get("x402Version"), bool):
        raise InvalidPaymentSignature("x402Version", f"must be {X402_VERSION}")
    accepted = _object(payload.get("accepted"), "accepted")
    inner = _object(payload.get("payload"), "payload")
    auth = _object(inner.get("authorization"), "payload.authorization")
    signature = _string(inner, "signature", "payload", SIGNATURE_RE)
    field = "payload.authorization"
    authorization = Authorization(
        payer=_string(auth, "from", field, ADDRESS_RE).lower(),
        to=_string(auth, "to", field, ADDRESS_RE).lower(),
        value=_uint(auth, "value", field),
        valid_after=_uint(auth, "validAfter", field),
        valid_before=_uint(auth, "validBefore", field),
        nonce=_string(auth, "nonce", field, NONCE_RE).lower(),
    )
    return SignedPayment(
        scheme=_string(accepted, "scheme", "accepted"),
        network=_string(accepted, "network", "accepted"),
        asset=_string(accepted, "asset", "accepted", ADDRESS_RE).lower(),
        pay_to=_string(accepted, "payTo", "accepted", ADDRESS_RE).lower(),
        amount=_string(accepted, "amount", "accepted", UINT_RE),
        authorization=authorization,
        signature=bytes.fromhex(signature[2:]),
    )
