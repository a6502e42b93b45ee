"""x402 v2 on the wire (Appendix B.1/B.4): the offers in ``PAYMENT-REQUIRED``, the parsing of
``PAYMENT-SIGNATURE`` and the ``PAYMENT-RESPONSE`` header. No database, no chain: ``settlement.py``
verifies and settles what this module parsed.

Every offer is the ``exact`` scheme, by one of two asset transfer methods (``extra.assetTransferMethod``,
which x402 clients read to choose how to sign):

- ``eip3009``: USDC only, its own ``transferWithAuthorization`` under the EIP-712 domain
  ``("USD Coin", "2")`` that USDC has on Base and Arbitrum One. Listed first: it needs nothing of the
  payer but a signature.
- ``permit2``: USDC and USDT, a Permit2 ``PermitWitnessTransferFrom`` whose spender is x402's exact
  Permit2 proxy and whose witness binds the recipient (``Witness(address to,uint256 validAfter)``). The
  payer must have approved Permit2 for the token once; the gateway's key calls the proxy's ``settle``.

USDT has no EIP-3009 on either chain, so Permit2 is its only x402 method.

After the ``exact`` offers, a deploy's and an extension's 402 offers USDC by ``upto`` on every chain
(``UptoTerms``): a Permit2 ``PermitWitnessTransferFrom`` for a *maximum* (the price of the months asked),
whose spender is x402's upto Permit2 proxy and whose witness also names the facilitator allowed to settle
it (``Witness(address to,address facilitator,uint256 validAfter)``; ``extra.facilitatorAddress`` is the
gateway's settlement key). ``maxTimeoutSeconds`` is the period plus a settlement window, since the
permit's deadline must outlast the period: the gateway settles what was consumed later (``upto``).

The 402 also declares three extensions: ``payment-identifier`` (optional: a payment that carries
``extensions["payment-identifier"].info.id`` is answered once per (wallet, id), see ``deployments``),
``sign-in-with-x`` (``siwx``: the challenge a payer signs later to manage what it paid for) and, for the
deploy, ``bazaar`` (``bazaar``: the resource's method, input and output with their JSON schemas).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from paddock_gateway import bazaar
from paddock_gateway.errors import InvalidPaymentSignature
from paddock_gateway.registry import TOKEN_NAMES, ChainSpec, Registry, TokenSpec

X402_VERSION = 2
SCHEME = "exact"
UPTO = "upto"
PAYMENT_REQUIRED = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE = "PAYMENT-RESPONSE"
#: Browsers may read a response header only if the server names it (x402 HTTP transport, CORS).
EXPOSE_HEADERS = {"Access-Control-Expose-Headers": f"{PAYMENT_REQUIRED}, {PAYMENT_RESPONSE}"}
MAX_TIMEOUT_S = 300
EIP3009 = "eip3009"
PERMIT2 = "permit2"
#: The tokens offered by EIP-3009 and their EIP-712 domain (name, version), as deployed on both chains.
EIP3009_DOMAINS: dict[str, tuple[str, str]] = {"usdc": ("USD Coin", "2")}
#: Permit2 and x402's exact Permit2 proxy: one address on every EVM chain (CREATE2), the one x402
#: clients sign for (Permit2 is the EIP-712 verifying contract, the proxy the permit's spender).
PERMIT2_ADDRESS = "0x000000000022D473030F116dDEE9F6B43aC78BA3"
X402_EXACT_PERMIT2_PROXY_ADDRESS = "0x402085c248EeA27D92E8b30b2C58ed07f9E20001"
#: x402's upto Permit2 proxy: the spender of an ``upto`` permit (it moves up to the permitted amount).
X402_UPTO_PERMIT2_PROXY_ADDRESS = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002"
#: The tokens offered by ``upto``.
UPTO_TOKENS = ("usdc",)
#: A header larger than this is not a payment payload (one holds well under 2 KiB).
MAX_HEADER_CHARS = 16_384

PAYMENT_IDENTIFIER = "payment-identifier"
#: x402's payment-identifier ``id``: 16–128 characters, alphanumeric, ``-`` and ``_``.
PAYMENT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
PAYMENT_ID_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "required": {"type": "boolean"},
        "id": {"type": "string", "minLength": 16, "maxLength": 128, "pattern": "^[a-zA-Z0-9_-]+$"},
    },
    "required": ["required"],
}

ADDRESS_RE = re.compile(r"^0x[0-9a-fA-F]{40}$")
NONCE_RE = re.compile(r"^0x[0-9a-fA-F]{64}$")
#: 64 bytes (EIP-2098) up to 2 KiB: an EOA's is 65, a smart wallet's (EIP-1271, an ERC-6492 wrapper) longer.
SIGNATURE_RE = re.compile(r"^0x(?:[0-9a-fA-F]{2}){64,2048}$")
UINT_RE = re.compile(r"^[0-9]{1,78}$")
UINT256_MAX = 2**256 - 1


def network_of(chain: ChainSpec) -> str:
    """The CAIP-2 id of a chain: ``eip155:<chain id>``."""
    return f"eip155:{chain.chain_id}"


@dataclass(frozen=True)
class UptoTerms:
    """What an ``upto`` offer adds: the facilitator that may settle it (the gateway's settlement key) and
    how long the permit must stay valid (the period asked plus the settlement window)."""

    facilitator: str
    max_timeout_s: int


@dataclass(frozen=True)
class Offer:
    """One requirement: a chain, a token and how it moves (``exact`` by ``eip3009`` with the token's
    EIP-712 domain, or by ``permit2``; ``upto``, always by ``permit2``)."""

    chain: ChainSpec
    token: TokenSpec
    method: str = EIP3009
    domain_name: str = ""
    domain_version: str = ""
    scheme: str = SCHEME
    upto: UptoTerms | None = None

    @property
    def network(self) -> str:
        return network_of(self.chain)

    def requirement(self, amount_raw: int) -> dict[str, Any]:
        extra: dict[str, str] = {"assetTransferMethod": self.method}
        if self.method == EIP3009:
            extra = {"name": self.domain_name, "version": self.domain_version, **extra}
        if self.upto is not None:
            extra["facilitatorAddress"] = self.upto.facilitator
        return {
            "scheme": self.scheme,
            "network": self.network,
            "amount": str(amount_raw),
            "asset": self.token.address,
            "payTo": self.chain.recipient,
            "maxTimeoutSeconds": self.upto.max_timeout_s if self.upto is not None else MAX_TIMEOUT_S,
            "extra": extra,
        }


def offers(registry: Registry) -> list[Offer]:
    """EIP-3009 (USDC) on every chain in the contract's order, then Permit2 for every token of every
    chain: a client that takes the first offer it can sign pays gaslessly and without an approval."""
    by_eip3009 = [
        Offer(chain=chain, token=chain.token(name), domain_name=domain[0], domain_version=domain[1])
        for chain in registry.ordered()
        for name, domain in EIP3009_DOMAINS.items()
        if name in chain.tokens
    ]
    by_permit2 = [
        Offer(chain=chain, token=chain.token(name), method=PERMIT2)
        for chain in registry.ordered()
        for name in TOKEN_NAMES
        if name in chain.tokens
    ]
    return by_eip3009 + by_permit2


def upto_offers(registry: Registry, terms: UptoTerms) -> list[Offer]:
    """``upto`` by Permit2 for every ``UPTO_TOKENS`` token of every chain, in the contract's order."""
    return [
        Offer(chain=chain, token=chain.token(name), method=PERMIT2, scheme=UPTO, upto=terms)
        for chain in registry.ordered()
        for name in UPTO_TOKENS
        if name in chain.tokens
    ]


def payment_required(
    registry: Registry,
    amount_raw: int,
    resource_url: str,
    error: str | None = None,
    extensions: dict[str, Any] | None = None,
    *,
    description: str = "Deploy an application on Paddock",
    discovery: bool = True,
    upto: UptoTerms | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "x402Version": X402_VERSION,
        "resource": {
            "url": resource_url,
            "description": description,
            "mimeType": "application/json",
        },
        "accepts": [
            offer.requirement(amount_raw)
            for offer in offers(registry) + (upto_offers(registry, upto) if upto is not None else [])
        ],
        "extensions": {
            PAYMENT_IDENTIFIER: {"info": {"required": False}, "schema": PAYMENT_ID_SCHEMA},
            **({bazaar.BAZAAR: bazaar.deploy_discovery()} if discovery else {}),
            **(extensions or {}),
        },
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

    method = EIP3009

    @property
    def nonce_key(self) -> str:
        return self.nonce


@dataclass(frozen=True)
class Permit2Authorization:
    """A Permit2 ``PermitWitnessTransferFrom`` for x402's exact proxy, or (``facilitator`` set, from
    ``witness.facilitator``) its upto proxy; addresses lowercase.

    ``value`` is ``permitted.amount`` (the exact proxy moves exactly that, the upto proxy at most that),
    ``to`` is ``witness.to`` and ``deadline`` the upper bound of the window whose lower bound is
    ``witness.validAfter``."""

    payer: str
    token: str
    value: int
    spender: str
    nonce: int
    deadline: int
    to: str
    valid_after: int
    facilitator: str | None = None

    method = PERMIT2

    @property
    def nonce_key(self) -> str:
        """The nonce as the 32-byte hex word the claim table keys on."""
        return f"0x{self.nonce:064x}"


@dataclass(frozen=True)
class SignedPayment:
    """A parsed ``PAYMENT-SIGNATURE``: the offer the client says it accepted, and what it signed."""

    scheme: str
    network: str
    asset: str  # lowercase
    pay_to: str  # lowercase
    amount: str
    authorization: Authorization | Permit2Authorization
    signature: bytes  # an EOA's 65 bytes r ‖ s ‖ v, or a smart wallet's (EIP-1271, ERC-6492)
    method: str = EIP3009  # extra.assetTransferMethod of the accepted offer, from the payload's shape
    #: The client's ``payment-identifier`` id, if it sent one.
    payment_id: str | None = None
    #: sha256 of what is paid, by whom: the accepted offer's terms and the payer. A retry that signs the
    #: same payment afresh (new nonce, deadline, signature) has the same terms.
    terms: str = ""


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
    authorization: Authorization | Permit2Authorization
    if "permit2Authorization" in inner:  # x402's Permit2 payload (assetTransferMethod "permit2")
        _object(inner.get("permit2Authorization"), "payload.permit2Authorization")
        signature = _string(inner, "signature", "payload", SIGNATURE_RE)
        authorization = parse_permit2_authorization(inner)
    else:
        _object(inner.get("authorization"), "payload.authorization")
        signature = _string(inner, "signature", "payload", SIGNATURE_RE)
        authorization = parse_eip3009_authorization(inner)
    scheme = _string(accepted, "scheme", "accepted")
    network = _string(accepted, "network", "accepted")
    asset = _string(accepted, "asset", "accepted", ADDRESS_RE).lower()
    pay_to = _string(accepted, "payTo", "accepted", ADDRESS_RE).lower()
    amount = _string(accepted, "amount", "accepted", UINT_RE)
    terms = [scheme, network, asset, pay_to, amount, authorization.method, authorization.payer]
    return SignedPayment(
        scheme=scheme,
        network=network,
        asset=asset,
        pay_to=pay_to,
        amount=amount,
        authorization=authorization,
        signature=bytes.fromhex(signature[2:]),
        method=authorization.method,
        payment_id=payment_identifier(payload),
        terms=hashlib.sha256(json.dumps(terms).encode()).hexdigest(),
    )


def payment_identifier(payload: dict[str, Any]) -> str | None:
    """``extensions["payment-identifier"].info.id``: None when absent, 400 when malformed."""
    extensions = payload.get("extensions")
    if extensions is None:
        return None
    extension = _object(extensions, "extensions").get(PAYMENT_IDENTIFIER)
    if extension is None:
        return None
    field = f"extensions.{PAYMENT_IDENTIFIER}"
    info = _object(_object(extension, field).get("info", {}), f"{field}.info")
    if info.get("id") is None:
        return None
    return _string(info, "id", f"{field}.info", PAYMENT_ID_RE)


def parse_eip3009_authorization(inner: dict[str, Any]) -> Authorization:
    field = "payload.authorization"
    auth = _object(inner.get("authorization"), field)
    return Authorization(
        payer=_string(auth, "from", field, ADDRESS_RE).lower(),
        to=_string(auth, "to", field, ADDRESS_RE).lower(),
        value=_uint(auth, "value", field),
        valid_after=_uint(auth, "validAfter", field),
        valid_before=_uint(auth, "validBefore", field),
        nonce=_string(auth, "nonce", field, NONCE_RE).lower(),
    )


def parse_permit2_authorization(inner: dict[str, Any]) -> Permit2Authorization:
    field = "payload.permit2Authorization"
    auth = _object(inner.get("permit2Authorization"), field)
    permitted = _object(auth.get("permitted"), f"{field}.permitted")
    witness = _object(auth.get("witness"), f"{field}.witness")
    return Permit2Authorization(
        payer=_string(auth, "from", field, ADDRESS_RE).lower(),
        token=_string(permitted, "token", f"{field}.permitted", ADDRESS_RE).lower(),
        value=_uint(permitted, "amount", f"{field}.permitted"),
        spender=_string(auth, "spender", field, ADDRESS_RE).lower(),
        nonce=_uint(auth, "nonce", field),
        deadline=_uint(auth, "deadline", field),
        to=_string(witness, "to", f"{field}.witness", ADDRESS_RE).lower(),
        valid_after=_uint(witness, "validAfter", f"{field}.witness"),
        facilitator=(
            _string(witness, "facilitator", f"{field}.witness", ADDRESS_RE).lower()
            if "facilitator" in witness
            else None
        ),
    )
