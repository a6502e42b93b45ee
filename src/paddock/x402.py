"""x402 v2 as ``GatewayClient`` pays it: read the offers of a 402's ``PAYMENT-REQUIRED``, choose one by
the caller's preference, and sign it.

A preference is an asset (``usdc``, ``usdt`` or a token address), a scheme (``exact``: exactly the
amount, now; ``upto``: at most the amount, settled later for what was used) and optionally a method
(``eip3009``: the token's own ``TransferWithAuthorization``, USDC only; ``permit2``: a Permit2
``PermitWitnessTransferFrom``, any ERC-20, after one ``approve`` of Permit2). Without a method,
``exact`` takes EIP-3009 where the token has it (no approval needed) and Permit2 otherwise; ``upto`` is
always Permit2. An offer that does not match is never signed: ``choose`` raises ``OfferNotFoundError``
naming the preference and listing what the gateway does offer, before any key is used.

    offers = parse_offers(response.headers["PAYMENT-REQUIRED"])
    offer = choose(offers, asset="usdt", scheme="exact", chain_id=8453)
    header = encode_header(sign(account, offer, resource))

Pure apart from the signer: no HTTP, no RPC.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from paddock import eip3009, permit2
from paddock._errors import PaymentError

X402_VERSION = 2
EXACT, UPTO = "exact", "upto"
EIP3009, PERMIT2 = "eip3009", "permit2"
SCHEMES = (EXACT, UPTO)
METHODS = (EIP3009, PERMIT2)
#: A ``PAYMENT-REQUIRED`` header longer than this is not read (the gateway's are ~3 KiB).
MAX_HEADER_CHARS = 65_536

#: The symbols of the tokens the gateway's chains take, by CAIP-2 network and lowercase address (the
#: dev chain deploys its test tokens at these same addresses).
KNOWN_ASSETS: dict[tuple[str, str], str] = {
    ("eip155:8453", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"): "usdc",
    ("eip155:8453", "0xfde4c96c8593536e31f229ea8f37b2ada2699bb2"): "usdt",
    ("eip155:42161", "0xaf88d065e77c8cc2239327c5edb3a432268e5831"): "usdc",
    ("eip155:42161", "0xfd086bc7cd5c481dcc9c85ebe478a1c0b69fcbb9"): "usdt",
}


class OfferNotFoundError(PaymentError, ValueError):
    """The 402 offers nothing that matches the caller's preference; nothing was signed."""


@dataclass(frozen=True)
class Offer:
    """One entry of ``accepts``: what to pay (``amount`` raw units of ``asset`` to ``pay_to`` on
    ``network``), by which ``scheme`` and ``method``; ``symbol`` is ``usdc``/``usdt`` when known."""

    scheme: str
    network: str
    amount: int
    asset: str
    pay_to: str
    max_timeout_s: int
    method: str
    extra: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)

    @property
    def chain_id(self) -> int:
        return int(self.network.removeprefix("eip155:"))

    @property
    def symbol(self) -> str:
        return KNOWN_ASSETS.get((self.network, self.asset.lower()), self.asset)

    def describe(self) -> str:
        """e.g. ``exact USDT by permit2 on eip155:8453``."""
        symbol = self.symbol.upper() if self.symbol != self.asset else self.asset
        return f"{self.scheme} {symbol} by {self.method} on {self.network}"


def decode_header(value: str) -> dict[str, Any]:
    """A base64 JSON object (``PAYMENT-REQUIRED``, ``PAYMENT-RESPONSE``), else ``PaymentError``."""
    if len(value) > MAX_HEADER_CHARS:
        raise PaymentError(f"unreadable x402 header: longer than {MAX_HEADER_CHARS} characters")
    try:
        decoded = json.loads(base64.b64decode(value, validate=True))
    except ValueError as exc:
        raise PaymentError(f"unreadable x402 header: {exc}") from None
    if not isinstance(decoded, dict):
        raise PaymentError("unreadable x402 header: not a JSON object")
    return decoded


def encode_header(value: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode("ascii")


def parse_offers(required: dict[str, Any]) -> list[Offer]:
    """The EVM offers of a decoded ``PaymentRequired``, in its order; entries this client cannot read
    (another network family, a missing field) are left out."""
    offers = []
    for item in required.get("accepts") or []:
        if not isinstance(item, dict):
            continue
        found = item.get("extra")
        extra: dict[str, Any] = found if isinstance(found, dict) else {}
        try:
            network = str(item["network"])
            if not network.startswith("eip155:"):
                continue
            offers.append(
                Offer(
                    scheme=str(item["scheme"]),
                    network=network,
                    amount=int(item["amount"]),
                    asset=str(item["asset"]),
                    pay_to=str(item["payTo"]),
                    max_timeout_s=int(item.get("maxTimeoutSeconds") or 300),
                    method=str(extra.get("assetTransferMethod") or EIP3009),
                    extra=dict(extra),
                    raw=item,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return offers


def check_preference(asset: str, scheme: str, method: str | None) -> None:
    """A preference that could never match: ``ValueError`` naming the argument."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if scheme == UPTO and method == EIP3009:
        raise ValueError("upto is paid by permit2 only, not eip3009")
    if not asset:
        raise ValueError("asset must be a token symbol (usdc, usdt) or a token address")


def choose(
    offers: Sequence[Offer],
    *,
    asset: str = "usdc",
    scheme: str = EXACT,
    method: str | None = None,
    chain_id: int | None = None,
) -> Offer:
    """The offer to sign for this preference. ``asset`` is a symbol (case-insensitive) or an address;
    without ``method``, EIP-3009 wins over Permit2 for ``exact``. ``OfferNotFoundError`` names what was
    asked and lists what is offered."""
    check_preference(asset, scheme, method)
    wanted = asset.lower()

    def matches(offer: Offer) -> bool:
        return (
            offer.scheme == scheme
            and wanted in (offer.symbol.lower(), offer.asset.lower())
            and (method is None or offer.method == method)
            and (chain_id is None or offer.chain_id == chain_id)
        )

    candidates = [offer for offer in offers if matches(offer)]
    if not candidates:
        asked = f"{scheme} {asset.upper() if not asset.startswith('0x') else asset}"
        asked += f" by {method}" if method else ""
        asked += f" on eip155:{chain_id}" if chain_id is not None else ""
        offered = "; ".join(offer.describe() for offer in offers) or "nothing"
        raise OfferNotFoundError(
            f"the gateway does not offer {asked} (it offers: {offered}); nothing was signed"
        )
    rank = {EIP3009: 0, PERMIT2: 1}
    return min(candidates, key=lambda offer: rank.get(offer.method, 2))


def sign(
    account: Any,
    offer: Offer,
    resource: Any,
    *,
    now_s: int | None = None,
    extensions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``PaymentPayload`` for ``offer``, signed by ``account`` (an eth-account ``LocalAccount``): an
    EIP-3009 authorization, or a Permit2 permit for x402's exact or upto proxy, of ``offer.amount`` to
    ``offer.pay_to``, valid from now for the offer's ``maxTimeoutSeconds``."""
    now = int(time.time()) if now_s is None else now_s
    until = now + offer.max_timeout_s
    payer = str(account.address)
    inner: dict[str, Any]
    if offer.method == EIP3009 and offer.scheme == EXACT:
        nonce = os.urandom(32)
        typed = eip3009.transfer_with_authorization(
            name=str(offer.extra.get("name", "")),
            version=str(offer.extra.get("version", "")),
            chain_id=offer.chain_id,
            verifying_contract=offer.asset,
            sender=payer,
            to=offer.pay_to,
            value=offer.amount,
            valid_after=0,
            valid_before=until,
            nonce=nonce,
        )
        inner = {
            "authorization": {
                "from": payer,
                "to": offer.pay_to,
                "value": str(offer.amount),
                "validAfter": "0",
                "validBefore": str(until),
                "nonce": "0x" + nonce.hex(),
            }
        }
    elif offer.method == PERMIT2:
        facilitator = None
        if offer.scheme == UPTO:
            facilitator = offer.extra.get("facilitatorAddress")
            if not isinstance(facilitator, str) or not facilitator:
                raise PaymentError("the upto offer names no facilitatorAddress; not signing")
        nonce_int = int.from_bytes(os.urandom(32), "big")
        typed = permit2.permit_witness_transfer_from(
            chain_id=offer.chain_id,
            token=offer.asset,
            amount=offer.amount,
            nonce=nonce_int,
            deadline=until,
            to=offer.pay_to,
            facilitator=facilitator,
        )
        message = typed["message"]
        inner = {
            "permit2Authorization": {
                "from": payer,
                "permitted": {"token": offer.asset, "amount": str(offer.amount)},
                "spender": message["spender"],
                "nonce": str(nonce_int),
                "deadline": str(until),
                "witness": {k: str(v) if k == "validAfter" else v for k, v in message["witness"].items()},
            }
        }
    else:
        raise PaymentError(f"cannot sign {offer.describe()}")
    signature = bytes(account.sign_typed_data(full_message=typed).signature)
    payload: dict[str, Any] = {
        "x402Version": X402_VERSION,
        "resource": resource,
        "accepted": offer.raw,
        "payload": {"signature": "0x" + signature.hex(), **inner},
    }
    if extensions:
        payload["extensions"] = extensions
    return payload


def nonce_of(payload: dict[str, Any]) -> str:
    """The signed payload's nonce as shown in progress reports."""
    inner = payload["payload"]
    if "authorization" in inner:
        return str(inner["authorization"]["nonce"])
    return hex(int(inner["permit2Authorization"]["nonce"]))


__all__ = [
    "EIP3009",
    "EXACT",
    "PERMIT2",
    "UPTO",
    "Offer",
    "OfferNotFoundError",
    "choose",
    "decode_header",
    "encode_header",
    "parse_offers",
    "sign",
]
