"""The SDK's choice among a 402's x402 offers and its signatures, without a chain: the offers are the
gateway's own ``PAYMENT-REQUIRED`` (``paddock_gateway.x402.payment_required``), and what the SDK signs
is read back by the gateway's own parser and recovered under the typed data of coinbase's ``x402``
package (its ``PERMIT2_WITNESS_TYPES`` / ``UPTO_PERMIT2_WITNESS_TYPES``), the reference a facilitator
checks against. The whole flow against a real gateway and anvil is tests/gateway/test_x402_sdk_permit2.py."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from x402.mechanisms.evm.constants import (
    PERMIT2_ADDRESS,
    PERMIT2_WITNESS_TYPES,
    UPTO_PERMIT2_WITNESS_TYPES,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
)

from paddock import permit2
from paddock import x402 as sdk_x402
from paddock_gateway import devchain
from paddock_gateway import x402 as gw_x402
from paddock_gateway.settings import GatewaySettings

FACILITATOR = devchain.SETTLEMENT_ADDRESS
USDT_BASE = "0xfde4C96c8593536E31F229EA8f37b2ADa2699bb2"
USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"


def required(tmp_path: Path, amount: int = 1_813_947) -> dict[str, Any]:
    settings = GatewaySettings(
        data_dir=tmp_path, recipient=devchain.RECIPIENT_ADDRESS, static_monthly_usd=Decimal("1.813947")
    )
    terms = gw_x402.UptoTerms(facilitator=FACILITATOR, max_timeout_s=2_628_900)
    return gw_x402.payment_required(
        settings.registry(), amount, "https://gateway.example/agent/deploy", upto=terms
    )


def test_the_sdk_reads_every_offer_the_gateway_makes(tmp_path: Path) -> None:
    offers = sdk_x402.parse_offers(required(tmp_path))
    assert [o.describe() for o in offers] == [
        "exact USDC by eip3009 on eip155:8453",
        "exact USDC by eip3009 on eip155:42161",
        "exact USDC by permit2 on eip155:8453",
        "exact USDT by permit2 on eip155:8453",
        "exact USDC by permit2 on eip155:42161",
        "exact USDT by permit2 on eip155:42161",
        "upto USDC by permit2 on eip155:8453",
        "upto USDC by permit2 on eip155:42161",
    ]


@pytest.mark.parametrize(
    ("preference", "chosen"),
    [
        ({}, "exact USDC by eip3009 on eip155:8453"),  # no approval needed: EIP-3009 first
        ({"asset": "USDT"}, "exact USDT by permit2 on eip155:8453"),  # USDT has only Permit2
        ({"asset": "usdc", "method": "permit2"}, "exact USDC by permit2 on eip155:8453"),
        ({"scheme": "upto"}, "upto USDC by permit2 on eip155:8453"),
        ({"asset": USDT_BASE.lower()}, "exact USDT by permit2 on eip155:8453"),  # an address works too
        ({"asset": "usdt", "chain_id": 42161}, "exact USDT by permit2 on eip155:42161"),
    ],
)
def test_the_preference_picks_the_offer(tmp_path: Path, preference: dict[str, Any], chosen: str) -> None:
    offers = sdk_x402.parse_offers(required(tmp_path))
    assert sdk_x402.choose(offers, **{"chain_id": 8453, **preference}).describe() == chosen


@pytest.mark.parametrize(
    ("preference", "named"),
    [
        ({"asset": "dai"}, "exact DAI on eip155:8453"),
        ({"asset": "usdt", "scheme": "upto"}, "upto USDT on eip155:8453"),
        ({"asset": "usdt", "method": "eip3009"}, "exact USDT by eip3009 on eip155:8453"),
    ],
)
def test_an_offer_the_402_does_not_make_is_named_and_nothing_is_signed(
    tmp_path: Path, preference: dict[str, Any], named: str
) -> None:
    offers = sdk_x402.parse_offers(required(tmp_path))
    with pytest.raises(sdk_x402.OfferNotFoundError) as caught:
        sdk_x402.choose(offers, chain_id=8453, **preference)
    message = str(caught.value)
    assert f"does not offer {named}" in message and "exact USDT by permit2 on eip155:8453" in message
    assert "nothing was signed" in message


@pytest.mark.parametrize(
    ("preference", "message"),
    [
        ({"scheme": "later"}, "scheme must be one of exact, upto"),
        ({"method": "permit3"}, "method must be one of eip3009, permit2"),
        ({"scheme": "upto", "method": "eip3009"}, "upto is paid by permit2 only"),
    ],
)
def test_a_preference_that_can_never_match_is_a_value_error(preference: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sdk_x402.choose([], **preference)


def recovered(typed: dict[str, Any], signature: bytes) -> str:
    return str(Account.recover_message(encode_typed_data(full_message=typed), signature=signature))


@pytest.mark.parametrize("scheme", ["exact", "upto"])
def test_a_permit2_payment_is_what_the_gateway_parses_and_x402_would_recover(
    tmp_path: Path, scheme: str
) -> None:
    account = Account.create()
    asset = "usdt" if scheme == "exact" else "usdc"
    offers = sdk_x402.parse_offers(required(tmp_path))
    offer = sdk_x402.choose(offers, asset=asset, scheme=scheme, chain_id=8453)
    payload = sdk_x402.sign(account, offer, {"url": "https://gateway.example/agent/deploy"}, now_s=1_000)

    parsed = gw_x402.parse_payment_signature(sdk_x402.encode_header(payload))
    auth = parsed.authorization
    assert isinstance(auth, gw_x402.Permit2Authorization)
    assert (parsed.scheme, parsed.method, auth.payer) == (scheme, "permit2", account.address.lower())
    assert auth.token == (USDT_BASE if asset == "usdt" else USDC_BASE).lower()
    assert auth.value == 1_813_947 and auth.to == devchain.RECIPIENT_ADDRESS.lower()
    assert auth.deadline == 1_000 + offer.max_timeout_s and auth.valid_after == 0
    proxy = X402_EXACT_PERMIT2_PROXY_ADDRESS if scheme == "exact" else X402_UPTO_PERMIT2_PROXY_ADDRESS
    assert (
        auth.spender
        == proxy.lower()
        == (permit2.EXACT_PROXY_ADDRESS if scheme == "exact" else permit2.UPTO_PROXY_ADDRESS).lower()
    )
    assert auth.facilitator == (FACILITATOR.lower() if scheme == "upto" else None)

    # x402's own types over the same values: the signature recovers to the payer
    witness_types = PERMIT2_WITNESS_TYPES if scheme == "exact" else UPTO_PERMIT2_WITNESS_TYPES
    witness: dict[str, Any] = {"to": devchain.RECIPIENT_ADDRESS, "validAfter": 0}
    if scheme == "upto":
        witness = {"to": devchain.RECIPIENT_ADDRESS, "facilitator": FACILITATOR, "validAfter": 0}
    reference = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            **witness_types,
        },
        "primaryType": "PermitWitnessTransferFrom",
        "domain": {"name": "Permit2", "chainId": 8453, "verifyingContract": PERMIT2_ADDRESS},
        "message": {
            "permitted": {"token": offer.asset, "amount": auth.value},
            "spender": proxy,
            "nonce": auth.nonce,
            "deadline": auth.deadline,
            "witness": witness,
        },
    }
    assert recovered(reference, parsed.signature) == account.address


def test_an_eip3009_payment_is_what_the_gateway_parses(tmp_path: Path) -> None:
    account = Account.create()
    offer = sdk_x402.choose(sdk_x402.parse_offers(required(tmp_path)), chain_id=42161)
    parsed = gw_x402.parse_payment_signature(sdk_x402.encode_header(sdk_x402.sign(account, offer, None)))
    assert parsed.method == "eip3009" and parsed.network == "eip155:42161"
    assert parsed.authorization.payer == account.address.lower() and parsed.authorization.value == 1_813_947


def test_the_approve_and_allowance_calls_name_permit2() -> None:
    assert (
        permit2.approve_calldata(5) == "0x095ea7b3" + PERMIT2_ADDRESS.lower()[2:].rjust(64, "0") + f"{5:064x}"
    )
    owner = "0x" + "ab" * 20
    assert permit2.allowance_calldata(owner) == (
        "0xdd62ed3e" + owner[2:].rjust(64, "0") + PERMIT2_ADDRESS.lower()[2:].rjust(64, "0")
    )
