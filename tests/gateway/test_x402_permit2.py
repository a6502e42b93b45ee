"""x402 ``exact`` by Permit2 against real anvil chains, with the dev chain's Permit2 and x402 proxy at their
canonical addresses: coinbase's PyPI ``x402`` client pays a deploy unchanged (in USDT and USDC, on both
chains), the recipient gets exactly the price, and a replayed payload, a reused Permit2 nonce, a short
amount and every other bad permit are refused with x402's reason and credit nothing.

The refusals are signed here with eth-account over the types and addresses that x402's own package
exports (``PERMIT2_WITNESS_TYPES``, ``PERMIT2_ADDRESS``, ``X402_EXACT_PERMIT2_PROXY_ADDRESS``), not the
gateway's: the client's idea of the message is the reference."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_utils.crypto import keccak
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.constants import (
    PERMIT2_ADDRESS,
    PERMIT2_WITNESS_TYPES,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
)
from x402.mechanisms.evm.exact.register import register_exact_evm_client

from paddock_gateway import devchain, x402
from paddock_gateway.models import Payment
from tests.gateway.conftest import (
    RECIPIENT,
    Chain,
    Gateway,
    Wallet,
    new_wallet,
    rpc,
    running_gateway,
    static_site,
    unique_name,
    x402_settings,
)
from tests.gateway.test_x402 import (
    PRICE_RAW,
    SETTLER,
    WalletAuth,
    credit_balance,
    decode,
    encode,
    eth_balance,
    nonce_of,
    rejected,
)
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]

APPROVE = keccak(text="approve(address,uint256)")[:4].hex()
INVALIDATE_NONCES = keccak(text="invalidateUnorderedNonces(uint256,uint256)")[:4].hex()


def word(value: int | str) -> str:
    if isinstance(value, str):
        return value.lower().removeprefix("0x").rjust(64, "0")
    return f"{value:064x}"


async def approve_permit2(wallet: Wallet, chain: Chain, token: str) -> None:
    """The payer's one transaction before its first Permit2 payment in a token: approve Permit2."""
    tx = await wallet.send(
        chain, chain.tokens[token], "0x" + APPROVE + word(PERMIT2_ADDRESS) + word(2**256 - 1)
    )
    assert (await chain.mined(tx))["status"] == "0x1"


class Recording(httpx.AsyncBaseTransport):
    """Keeps every ``PAYMENT-SIGNATURE`` the x402 client sent, then passes the request on."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.sent: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if "payment-signature" in request.headers:
            self.sent.append(request.headers["payment-signature"])
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def coinbase_client(wallet: Wallet, chain: Chain, token: str) -> x402Client:
    """Coinbase's client as a user configures it: this chain, this token (USDT is not one of its default
    assets, so it is allowed explicitly, with a cap in raw units), and a policy that picks Permit2."""
    network = f"eip155:{chain.chain_id}"
    asset = chain.tokens[token]
    client = x402Client().set_spend_controls(
        {
            "max_amount_per_payment": "$5",
            "allowed_assets": [{"network": network, "asset": asset, "max_amount_per_payment": "5000000"}],
        }
    )
    register_exact_evm_client(client, wallet.account, networks=network)

    def permit2_in_token(version: int, offers: list[Any]) -> list[Any]:
        return [
            offer
            for offer in offers
            if offer.asset.lower() == asset.lower()
            and (offer.get_extra() or {}).get("assetTransferMethod") == "permit2"
        ]

    return client.register_policy(permit2_in_token)


@pytest.mark.parametrize(
    ("chain_name", "token"), [("base", "usdt"), ("arbitrum", "usdt"), ("base", "usdc"), ("arbitrum", "usdc")]
)
async def test_the_pypi_x402_client_pays_a_deploy_by_permit2(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain], chain_name: str, token: str
) -> None:
    gw, chain = x402_gateway, devchains[chain_name]
    await approve_permit2(paying_wallet, chain, token)
    port = free_port()
    body = static_site(unique_name("permit2"), "<h1>paid through Permit2</h1>", port=port)
    recipient_before = await chain.token_balance(token, RECIPIENT)
    payer_before = await chain.token_balance(token, paying_wallet.address)
    payer_eth_before = await eth_balance(chain, paying_wallet.address)
    payer_nonce = await nonce_of(chain, paying_wallet.address)
    settler_nonce = await nonce_of(chain, SETTLER)

    recording = Recording(WalletAuth(paying_wallet, gw.clock))
    transport = x402AsyncTransport(coinbase_client(paying_wallet, chain, token), transport=recording)
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        response = await http.post("/agent/deploy", json=body)

    assert response.status_code == 200, response.text
    accepted = response.json()
    assert accepted["status"] == "deploying"
    [header] = recording.sent
    signed = decode(header)
    assert signed["accepted"]["asset"] == chain.tokens[token]
    assert signed["accepted"]["extra"]["assetTransferMethod"] == "permit2"
    assert signed["payload"]["permit2Authorization"]["spender"] == X402_EXACT_PERMIT2_PROXY_ADDRESS
    settled = decode(response.headers["PAYMENT-RESPONSE"])
    assert settled["success"] is True and settled["network"] == f"eip155:{chain.chain_id}"
    assert settled["payer"] == paying_wallet.address
    receipt = await chain.receipt(settled["transaction"])
    assert receipt is not None and receipt["status"] == "0x1"
    assert receipt["from"].lower() == SETTLER.lower()  # the gateway's key sent it and paid its gas
    assert receipt["to"].lower() == X402_EXACT_PERMIT2_PROXY_ADDRESS.lower()  # through x402's proxy

    assert await chain.token_balance(token, RECIPIENT) == recipient_before + PRICE_RAW
    assert await chain.token_balance(token, paying_wallet.address) == payer_before - PRICE_RAW
    assert await eth_balance(chain, paying_wallet.address) == payer_eth_before  # no gas for the payment
    assert await nonce_of(chain, paying_wallet.address) == payer_nonce  # no transaction of its own
    assert await nonce_of(chain, SETTLER) == settler_nonce + 1
    assert await credit_balance(gw, paying_wallet) == PRICE_RAW * 100
    async with gw.services.sessions() as session:
        payment = await session.get(Payment, settled["transaction"])
    assert payment is not None and (payment.chain, payment.token) == (chain_name, token)

    final = await gw.wait_terminal(paying_wallet, accepted["projectId"], accepted["deploymentId"])
    assert final["status"] == "ready", final
    async with httpx.AsyncClient() as http:
        assert "paid through Permit2" in (await http.get(final["endpoint"] + "/index.html")).text

    # The same payload again (a replay, with fresh wallet auth and a new body): 409, nothing moves.
    replay = await gw.deploy(
        paying_wallet, static_site(unique_name(), "x", port=free_port()), **{"PAYMENT-SIGNATURE": header}
    )
    assert replay.status_code == 409, replay.text
    assert replay.json() == {
        "error": "Payment already processed",
        "code": "payment_already_processed",
        "tx_hash": settled["transaction"],
    }
    # The settlement is an ordinary Transfer from the payer: as X-Payment-Tx it is spent too.
    again = await gw.deploy(
        paying_wallet,
        static_site(unique_name(), "x", port=free_port()),
        **{"X-Payment-Tx": settled["transaction"], "X-Payment-Chain": chain_name, "X-Payment-Token": token},
    )
    assert again.status_code == 409, again.text
    assert await chain.token_balance(token, RECIPIENT) == recipient_before + PRICE_RAW
    assert await credit_balance(gw, paying_wallet) == PRICE_RAW * 100
    assert len((await gw.projects(paying_wallet))["projects"]) == 1


def sign_permit(
    wallet: Wallet,
    requirement: dict[str, Any],
    chain_id: int,
    *,
    nonce: int | None = None,
    amount: int | None = None,
    token: str | None = None,
    to: str | None = None,
    spender: str = X402_EXACT_PERMIT2_PROXY_ADDRESS,
    deadline: int | None = None,
    valid_after: int = 0,
    signer: Wallet | None = None,
) -> dict[str, Any]:
    """A ``PaymentPayload`` for a Permit2 ``requirement``, shaped as x402's client shapes it and signed
    over x402's own types and Permit2 domain."""
    authorization = {
        "from": wallet.address,
        "permitted": {
            "token": token or requirement["asset"],
            "amount": str(int(requirement["amount"]) if amount is None else amount),
        },
        "spender": spender,
        "nonce": str(int.from_bytes(os.urandom(32), "big") if nonce is None else nonce),
        "deadline": str(int(time.time()) + 300 if deadline is None else deadline),
        "witness": {"to": to or requirement["payTo"], "validAfter": str(valid_after)},
    }
    typed = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            **PERMIT2_WITNESS_TYPES,
        },
        "primaryType": "PermitWitnessTransferFrom",
        "domain": {"name": "Permit2", "chainId": chain_id, "verifyingContract": PERMIT2_ADDRESS},
        "message": {
            "permitted": {
                "token": authorization["permitted"]["token"],
                "amount": int(authorization["permitted"]["amount"]),
            },
            "spender": spender,
            "nonce": int(authorization["nonce"]),
            "deadline": int(authorization["deadline"]),
            "witness": {"to": authorization["witness"]["to"], "validAfter": valid_after},
        },
    }
    signature = (signer or wallet).account.sign_typed_data(full_message=typed).signature
    return {
        "x402Version": 2,
        "accepted": requirement,
        "payload": {"permit2Authorization": authorization, "signature": "0x" + bytes(signature).hex()},
    }


async def permit2_offer(
    gw: Gateway, wallet: Wallet, body: dict[str, Any], chain: Chain, token: str
) -> dict[str, Any]:
    quote = await gw.deploy(wallet, body)
    assert quote.status_code == 402, quote.text
    return next(
        item
        for item in decode(quote.headers["PAYMENT-REQUIRED"])["accepts"]
        if item["network"] == f"eip155:{chain.chain_id}"
        and item["asset"] == chain.tokens[token]
        and item["extra"]["assetTransferMethod"] == "permit2"
    )


async def test_a_reused_permit2_nonce_is_refused_and_credits_nothing(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """A new signature over a nonce that already paid (a different deadline, so a different payload) is
    409 before anything is read from the chain; a nonce the payer spent on chain itself (Permit2's
    ``invalidateUnorderedNonces``) is x402's ``permit2_invalid_nonce``."""
    gw, base = x402_gateway, devchains["base"]
    await approve_permit2(paying_wallet, base, "usdt")
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await permit2_offer(gw, paying_wallet, body, base, "usdt")
    nonce = int.from_bytes(os.urandom(32), "big")
    deadline = int(time.time()) + 300
    first = sign_permit(paying_wallet, requirement, base.chain_id, nonce=nonce, deadline=deadline)
    paid = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": encode(first)})
    assert paid.status_code == 200, paid.text
    recipient_after = await base.token_balance("usdt", RECIPIENT)
    credited = await credit_balance(gw, paying_wallet)
    assert credited == PRICE_RAW * 100

    reused = sign_permit(paying_wallet, requirement, base.chain_id, nonce=nonce, deadline=deadline + 60)
    assert reused["payload"]["signature"] != first["payload"]["signature"]
    refused = await gw.deploy(
        paying_wallet,
        static_site(unique_name(), "x", port=free_port()),
        **{"PAYMENT-SIGNATURE": encode(reused)},
    )
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "payment_already_processed"

    # A nonce spent on chain outside this gateway: Permit2 flips the bit, the gateway reads it.
    burnt = int.from_bytes(os.urandom(32), "big")
    tx = await paying_wallet.send(
        base, PERMIT2_ADDRESS, "0x" + INVALIDATE_NONCES + word(burnt >> 8) + word(1 << (burnt & 0xFF))
    )
    assert (await base.mined(tx))["status"] == "0x1"
    stale = sign_permit(paying_wallet, requirement, base.chain_id, nonce=burnt)
    response = await gw.deploy(
        paying_wallet,
        static_site(unique_name(), "x", port=free_port()),
        **{"PAYMENT-SIGNATURE": encode(stale)},
    )
    assert response.status_code == 402, response.text
    assert response.json()["reason"] == "permit2_invalid_nonce"
    assert decode(response.headers["PAYMENT-RESPONSE"])["errorReason"] == "permit2_invalid_nonce"

    assert await base.token_balance("usdt", RECIPIENT) == recipient_after
    assert await credit_balance(gw, paying_wallet) == credited


async def test_every_bad_permit_is_a_402_with_the_x402_reason_and_credits_nothing(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, arbitrum = x402_gateway, devchains["arbitrum"]
    await approve_permit2(paying_wallet, arbitrum, "usdt")
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await permit2_offer(gw, paying_wallet, body, arbitrum, "usdt")
    recipient_before = await arbitrum.token_balance("usdt", RECIPIENT)
    now = int(time.time())

    def signed(**kwargs: Any) -> dict[str, Any]:
        return sign_permit(paying_wallet, requirement, arbitrum.chain_id, **kwargs)

    async def reason(payload: dict[str, Any], wallet: Wallet = paying_wallet) -> str:
        return await rejected(gw, wallet, body, payload)

    assert await reason(signed(amount=PRICE_RAW - 1)) == "permit2_amount_mismatch"  # short value
    assert await reason(signed(to=new_wallet().address)) == "invalid_permit2_recipient_mismatch"
    assert await reason(signed(spender=new_wallet().address)) == "invalid_permit2_spender"
    assert await reason(signed(deadline=now - 1)) == "permit2_deadline_expired"
    assert await reason(signed(valid_after=now + 600)) == "permit2_not_yet_valid"
    assert await reason(signed(token=arbitrum.tokens["usdc"])) == "permit2_token_mismatch"
    assert await reason(signed(signer=new_wallet())) == "invalid_permit2_signature"
    tampered = signed()
    tampered["payload"]["permit2Authorization"]["permitted"]["amount"] = str(PRICE_RAW * 2)
    assert await reason(tampered) == "invalid_permit2_signature"
    stranger = new_wallet()
    assert await reason(sign_permit(stranger, requirement, arbitrum.chain_id)) == "sender_mismatch"
    # USDT offered by Permit2 only: a USDT payment shaped as EIP-3009 answers no offer.
    eip3009_shaped = signed()
    eip3009_shaped["accepted"] = {**requirement, "extra": {"assetTransferMethod": "eip3009"}}
    eip3009_shaped["payload"] = {
        "signature": eip3009_shaped["payload"]["signature"],
        "authorization": {
            "from": paying_wallet.address,
            "to": RECIPIENT,
            "value": str(PRICE_RAW),
            "validAfter": "0",
            "validBefore": str(now + 300),
            "nonce": "0x" + os.urandom(32).hex(),
        },
    }
    assert await reason(eip3009_shaped) == "invalid_exact_evm_failed_to_get_asset_info"

    # A funded wallet that never approved Permit2, and one that holds no USDT at all.
    unapproved = new_wallet()
    await unapproved.fund(arbitrum)
    assert (
        await reason(sign_permit(unapproved, requirement, arbitrum.chain_id), unapproved)
        == "permit2_allowance_required"
    )
    broke = new_wallet()
    await rpc(arbitrum.rpc_url, "anvil_setBalance", [broke.address, hex(10**18)])
    await approve_permit2(broke, arbitrum, "usdt")
    assert (
        await reason(sign_permit(broke, requirement, arbitrum.chain_id), broke)
        == "invalid_exact_evm_insufficient_balance"
    )

    assert await arbitrum.token_balance("usdt", RECIPIENT) == recipient_before  # nothing moved
    assert len((await gw.projects(paying_wallet))["projects"]) == 0


@pytest.mark.db
async def test_twenty_concurrent_requests_with_one_permit_settle_exactly_once(
    tmp_path: Path, database_url: str, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """On SQLite and on PostgreSQL: the claim on (network, Permit2, payer, nonce) decides, not timing."""
    base = devchains["base"]
    await approve_permit2(paying_wallet, base, "usdt")
    settings = x402_settings(tmp_path, devchains).model_copy(update={"database_url": database_url})
    async with running_gateway(settings, tmp_path, chains=devchains) as gw:
        body = static_site(unique_name(), "x", port=free_port())
        header = encode(
            sign_permit(
                paying_wallet, await permit2_offer(gw, paying_wallet, body, base, "usdt"), base.chain_id
            )
        )
        before = await base.token_balance("usdt", RECIPIENT)
        settler_nonce = await nonce_of(base, SETTLER)
        bodies = [static_site(unique_name(), "x", port=free_port()) for _ in range(20)]
        responses = await asyncio.gather(
            *(gw.deploy(paying_wallet, each, **{"PAYMENT-SIGNATURE": header}) for each in bodies)
        )
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200] + [409] * 19, [r.text for r in responses if r.status_code not in (200, 409)]
        assert await base.token_balance("usdt", RECIPIENT) == before + PRICE_RAW
        assert await nonce_of(base, SETTLER) == settler_nonce + 1
        assert await credit_balance(gw, paying_wallet) == PRICE_RAW * 100


def test_the_devchain_contracts_sit_where_x402_expects_them() -> None:
    assert x402.PERMIT2_ADDRESS == PERMIT2_ADDRESS
    assert x402.X402_EXACT_PERMIT2_PROXY_ADDRESS == X402_EXACT_PERMIT2_PROXY_ADDRESS
    assert x402.X402_UPTO_PERMIT2_PROXY_ADDRESS == X402_UPTO_PERMIT2_PROXY_ADDRESS
    assert set(devchain.PERMIT2_ARTIFACTS) == {
        PERMIT2_ADDRESS,
        X402_EXACT_PERMIT2_PROXY_ADDRESS,
        X402_UPTO_PERMIT2_PROXY_ADDRESS,
    }
