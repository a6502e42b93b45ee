"""x402 ``upto`` for runtime against real anvil chains, with the dev chain's Permit2 and x402's upto proxy at
their canonical addresses: coinbase's PyPI ``x402`` client, unchanged, authorises a maximum for a deploy in
USDC; the gateway settles what the project consumed (by the second, at the gateway's price) when it is
deleted or its period ends, exactly once, never more than authorised; the status shows authorised vs
settled. The bad authorisations are signed here with eth-account over x402's own ``upto`` types and
addresses, and each is refused with x402's reason.

Time: the gateway's clock is frozen and moved by the test (``FrozenClock``), so "N seconds of runtime" is
exactly N; a month is 3600 s (``upto_month_s``) and the price 3.6 USD a month, 1000 raw units a second."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from sqlalchemy import func, select
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.constants import (
    PERMIT2_ADDRESS,
    UPTO_PERMIT2_WITNESS_TYPES,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
)
from x402.mechanisms.evm.upto import UptoEvmClientScheme

from paddock_gateway import upto
from paddock_gateway.models import X402Authorization, X402Upto
from paddock_gateway.settings import GatewaySettings
from paddock_gateway.settlement import Settler
from tests.gateway.conftest import (
    RECIPIENT,
    Chain,
    Clock,
    Gateway,
    Wallet,
    new_wallet,
    running_gateway,
    static_site,
    unique_name,
    x402_settings,
)
from tests.gateway.test_smart_wallets import SmartWallet, SmartWalletAuth, SmartWalletSigner, deploy_factory
from tests.gateway.test_x402 import SETTLER, credit_balance, decode, encode, nonce_of
from tests.gateway.test_x402_permit2 import Recording, approve_permit2
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]

MONTH_S = 3600
PRICE_RAW = 3_600_000  # 3.6 USD for one month of 3600 s
PER_SECOND_RAW = PRICE_RAW // MONTH_S  # 1000
WINDOW_S = 900


class FrozenClock(Clock):
    """Time stands still until the test moves it (``advance``)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.start + self.offset


def upto_settings(
    tmp_path: Path, chains: dict[str, Chain], database_url: str | None = None
) -> GatewaySettings:
    overrides: dict[str, Any] = {
        "static_monthly_usd": Decimal("3.6"),
        "upto_month_s": MONTH_S,
        "upto_settle_window_s": WINDOW_S,
    }
    if database_url is not None:
        overrides["database_url"] = database_url
    return x402_settings(tmp_path, chains).model_copy(update=overrides)


@pytest.fixture
async def upto_gateway(tmp_path: Path, devchains: dict[str, Chain]) -> AsyncIterator[Gateway]:
    settings = upto_settings(tmp_path, devchains)
    async with running_gateway(settings, tmp_path, chains=devchains, clock=FrozenClock()) as gw:
        yield gw


class WalletAuth(httpx.AsyncBaseTransport):
    """The gateway's wallet auth on every request, at the gateway's (frozen) time."""

    def __init__(self, wallet: Wallet, clock: Clock) -> None:
        self.wallet, self.clock = wallet, clock
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers.update(self.wallet.auth(self.clock.now_ms()))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def upto_client(wallet: Wallet, chain: Chain) -> x402Client:
    """Coinbase's client with its ``upto`` scheme for this chain, and a policy that picks it in USDC."""
    network = f"eip155:{chain.chain_id}"
    # Its default cap is $1 a payment; a user raises it for the 3.6 USD a month these deploys authorise.
    client = x402Client().set_spend_controls({"max_amount_per_payment": "$10"})
    client.register(network, UptoEvmClientScheme(wallet.account))

    def upto_in_usdc(version: int, offers: list[Any]) -> list[Any]:
        return [o for o in offers if o.scheme == "upto" and o.asset.lower() == chain.tokens["usdc"].lower()]

    return client.register_policy(upto_in_usdc)


async def deploy_by_upto(gw: Gateway, wallet: Wallet, chain: Chain) -> tuple[dict[str, Any], str]:
    """Coinbase's client pays a deploy by ``upto``; returns the 200 body and the header it sent."""
    recording = Recording(WalletAuth(wallet, gw.clock))
    transport = x402AsyncTransport(upto_client(wallet, chain), transport=recording)
    body = static_site(unique_name("upto"), "<h1>paid by the second</h1>", port=free_port())
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        response = await http.post("/agent/deploy", json=body)
    assert response.status_code == 200, response.text
    [header] = recording.sent
    return response.json(), header


async def status(gw: Gateway, wallet: Wallet, accepted: dict[str, Any]) -> dict[str, Any]:
    response = await gw.status(wallet, accepted["projectId"], accepted["deploymentId"])
    assert response.status_code == 200, response.text
    return dict(response.json())


async def upto_row(gw: Gateway, project_id: str) -> X402Upto:
    [row] = await upto.ledger(gw.services.sessions, project_id)
    return row


async def test_the_pypi_x402_client_authorises_upto_and_the_gateway_settles_only_what_was_consumed(
    upto_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, chain = upto_gateway, devchains["base"]
    await approve_permit2(paying_wallet, chain, "usdc")
    recipient_before = await chain.token_balance("usdc", RECIPIENT)
    payer_before = await chain.token_balance("usdc", paying_wallet.address)
    settler_nonce = await nonce_of(chain, SETTLER)

    # The 402 offers upto in USDC on both chains, after the exact offers, as coinbase's client reads it.
    quote = await gw.deploy(paying_wallet, static_site(unique_name(), "x", port=free_port()))
    offered = [o for o in decode(quote.headers["PAYMENT-REQUIRED"])["accepts"] if o["scheme"] == "upto"]
    assert [o["network"] for o in offered] == [
        f"eip155:{devchains[n].chain_id}" for n in ("base", "arbitrum")
    ]
    assert offered[0] == {
        "scheme": "upto",
        "network": f"eip155:{chain.chain_id}",
        "amount": str(PRICE_RAW),
        "asset": chain.tokens["usdc"],
        "payTo": RECIPIENT,
        "maxTimeoutSeconds": MONTH_S + WINDOW_S,
        "extra": {"assetTransferMethod": "permit2", "facilitatorAddress": SETTLER},
    }

    accepted, header = await deploy_by_upto(gw, paying_wallet, chain)
    signed = decode(header)
    assert signed["accepted"]["scheme"] == "upto"
    permit = signed["payload"]["permit2Authorization"]
    assert permit["spender"] == X402_UPTO_PERMIT2_PROXY_ADDRESS
    assert permit["permitted"]["amount"] == str(PRICE_RAW)
    assert permit["witness"]["facilitator"] == SETTLER
    # Authorised, nothing moved, nothing credited: the status shows the authorisation open.
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before
    assert await credit_balance(gw, paying_wallet) == 0
    [entry] = (await status(gw, paying_wallet, accepted))["upto"]
    assert (entry["state"], entry["authorized_raw"], entry.get("settled_raw")) == (
        "open",
        str(PRICE_RAW),
        None,
    )
    final = await gw.wait_terminal(paying_wallet, accepted["projectId"], accepted["deploymentId"])
    assert final["status"] == "ready", final

    # N seconds of runtime; a pass before the period's end settles nothing and keeps the project live
    # (on the authorisation, not on credits, of which the wallet has none).
    n = 42
    gw.clock.advance(seconds=n)
    metering = gw.services.metering
    assert metering is not None
    report = await metering.run_once()
    assert report.settled == [] and report.paused == []

    # Delete: consumption stops now, and the next pass settles N × the per-second price, once.
    deleted = await gw.http.delete(f"/agent/projects/{accepted['projectId']}", headers=gw.auth(paying_wallet))
    assert deleted.status_code == 200, deleted.text
    report = await metering.run_once()
    [settled] = report.settled
    assert settled.amount_raw == n * PER_SECOND_RAW and settled.reason == "deleted"
    assert settled.amount_raw < PRICE_RAW  # what was consumed, not the maximum
    receipt = await chain.receipt(settled.tx_hash or "")
    assert receipt is not None and receipt["status"] == "0x1"
    assert receipt["from"].lower() == SETTLER.lower()
    assert receipt["to"].lower() == X402_UPTO_PERMIT2_PROXY_ADDRESS.lower()
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + n * PER_SECOND_RAW
    assert await chain.token_balance("usdc", paying_wallet.address) == payer_before - n * PER_SECOND_RAW
    assert await nonce_of(chain, SETTLER) == settler_nonce + 1
    [entry] = (await status(gw, paying_wallet, accepted))["upto"]
    assert entry["state"] == "settled" and entry["reason"] == "deleted"
    assert (entry["authorized_raw"], entry["settled_raw"]) == (str(PRICE_RAW), str(n * PER_SECOND_RAW))
    assert entry["consumed_seconds"] == n and entry["tx_hash"] == settled.tx_hash

    # A second settlement attempt settles nothing, however late.
    gw.clock.advance(seconds=MONTH_S * 2)
    assert (await metering.run_once()).settled == []
    row = await upto_row(gw, accepted["projectId"])
    assert metering.billing is not None
    assert await metering.billing.settle(row.id) is None
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + n * PER_SECOND_RAW
    assert await nonce_of(chain, SETTLER) == settler_nonce + 1

    # The same authorisation again (an upto settled once, replayed): 409, nothing moves.
    gw.clock.offset = dt.timedelta()  # back inside the permit's window, so only the replay is wrong
    replay = await gw.deploy(
        paying_wallet, static_site(unique_name(), "x", port=free_port()), **{"PAYMENT-SIGNATURE": header}
    )
    assert replay.status_code == 409, replay.text
    assert replay.json()["code"] == "payment_already_processed"
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + n * PER_SECOND_RAW


async def test_at_the_period_end_it_settles_the_period_and_pauses_a_project_without_credits(
    upto_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, chain = upto_gateway, devchains["base"]
    await approve_permit2(paying_wallet, chain, "usdc")
    recipient_before = await chain.token_balance("usdc", RECIPIENT)
    accepted, _ = await deploy_by_upto(gw, paying_wallet, chain)
    metering = gw.services.metering
    assert metering is not None
    gw.clock.advance(seconds=MONTH_S - 1)
    assert (await metering.run_once()).settled == []  # one second before the end: nothing due
    gw.clock.advance(seconds=1 + 600)  # the pass runs 10 minutes late: still one period, not more
    report = await metering.run_once()
    [settled] = report.settled
    assert settled.amount_raw == PRICE_RAW and settled.reason == "period_end"
    assert report.paused == [accepted["projectId"]]  # the authorisation is spent and there are no credits
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + PRICE_RAW
    [entry] = (await status(gw, paying_wallet, accepted))["upto"]
    assert (entry["state"], entry["settled_raw"], entry["consumed_seconds"]) == (
        "settled",
        str(PRICE_RAW),
        MONTH_S,
    )
    assert await credit_balance(gw, paying_wallet) == 0  # billed from the period's end on credits: none


async def test_twenty_concurrent_settlements_of_one_authorisation_settle_exactly_once(
    tmp_path: Path, database_url: str, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """Twenty workers (each with its own settlement key handle, as separate gateway processes would
    have) settle one due authorisation at once: one settles, nineteen settle nothing, on both engines."""
    chain = devchains["base"]
    settings = upto_settings(tmp_path, devchains, database_url)
    async with running_gateway(settings, tmp_path, chains=devchains, clock=FrozenClock()) as gw:
        await approve_permit2(paying_wallet, chain, "usdc")
        accepted, _ = await deploy_by_upto(gw, paying_wallet, chain)
        gw.clock.advance(seconds=7)
        deleted = await gw.http.delete(
            f"/agent/projects/{accepted['projectId']}", headers=gw.auth(paying_wallet)
        )
        assert deleted.status_code == 200, deleted.text
        row = await upto_row(gw, accepted["projectId"])
        recipient_before = await chain.token_balance("usdc", RECIPIENT)
        settler_nonce = await nonce_of(chain, SETTLER)
        services = gw.services
        workers = [
            upto.UptoBilling(
                services.sessions,
                gw.clock,
                settings,
                services.registry,
                services.chains,
                Settler(settings.settlement_private_key),
            )
            for _ in range(20)
        ]
        results = await asyncio.gather(*(worker.settle(row.id) for worker in workers))
        done = [r for r in results if r is not None]
        assert len(done) == 1, results
        assert done[0].amount_raw == 7 * PER_SECOND_RAW
        assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + 7 * PER_SECOND_RAW
        assert await nonce_of(chain, SETTLER) == settler_nonce + 1  # one transaction, not twenty
        async with services.sessions() as session:
            stored = await session.get(X402Upto, row.id)
            claim = await session.get(
                X402Authorization, (row.network, PERMIT2_ADDRESS.lower(), row.payer, row.nonce)
            )
        assert stored is not None and stored.state == "settled" and stored.settled_raw == 7 * PER_SECOND_RAW
        assert claim is not None and claim.state == "settled" and claim.tx_hash == done[0].tx_hash


def sign_upto(
    wallet: Wallet,
    requirement: dict[str, Any],
    chain_id: int,
    *,
    amount: int | None = None,
    spender: str = X402_UPTO_PERMIT2_PROXY_ADDRESS,
    facilitator: str | None = None,
    deadline: int | None = None,
    to: str | None = None,
) -> dict[str, Any]:
    """A ``PaymentPayload`` for an ``upto`` requirement as x402's client shapes it, signed over x402's
    own upto types and Permit2 domain."""
    authorization = {
        "from": wallet.address,
        "permitted": {"token": requirement["asset"], "amount": str(amount or int(requirement["amount"]))},
        "spender": spender,
        "nonce": str(int.from_bytes(os.urandom(32), "big")),
        "deadline": str(deadline or int(time.time()) + requirement["maxTimeoutSeconds"]),
        "witness": {
            "to": to or requirement["payTo"],
            "facilitator": facilitator or requirement["extra"]["facilitatorAddress"],
            "validAfter": "0",
        },
    }
    typed = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            **UPTO_PERMIT2_WITNESS_TYPES,
        },
        "primaryType": "PermitWitnessTransferFrom",
        "domain": {"name": "Permit2", "chainId": chain_id, "verifyingContract": PERMIT2_ADDRESS},
        "message": {
            "permitted": {
                "token": authorization["permitted"]["token"],
                "amount": int(authorization["permitted"]["amount"]),
            },
            "spender": authorization["spender"],
            "nonce": int(authorization["nonce"]),
            "deadline": int(authorization["deadline"]),
            "witness": {
                "to": authorization["witness"]["to"],
                "facilitator": authorization["witness"]["facilitator"],
                "validAfter": 0,
            },
        },
    }
    signature = Account.sign_message(encode_typed_data(full_message=typed), wallet.account.key).signature
    return {
        "x402Version": 2,
        "accepted": requirement,
        "payload": {"permit2Authorization": authorization, "signature": "0x" + bytes(signature).hex()},
    }


async def test_bad_upto_authorisations_are_refused_with_the_x402_reason_and_take_nothing(
    upto_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, chain = upto_gateway, devchains["base"]
    await approve_permit2(paying_wallet, chain, "usdc")
    body = static_site(unique_name(), "x", port=free_port())
    quote = await gw.deploy(paying_wallet, body)
    requirement = next(
        o
        for o in decode(quote.headers["PAYMENT-REQUIRED"])["accepts"]
        if o["scheme"] == "upto" and o["network"] == f"eip155:{chain.chain_id}"
    )

    async def reason(payload: dict[str, Any]) -> str:
        response = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": encode(payload)})
        assert response.status_code == 402, response.text
        assert decode(response.headers["PAYMENT-RESPONSE"])["success"] is False
        return str(response.json()["reason"])

    def signed(**kwargs: Any) -> dict[str, Any]:
        return sign_upto(paying_wallet, requirement, chain.chain_id, **kwargs)

    other = new_wallet().address
    assert await reason(signed(facilitator=other)) == "upto_facilitator_mismatch"  # someone else settles
    assert await reason(signed(amount=PRICE_RAW - 1)) == "permit2_amount_mismatch"  # below the period's price
    assert await reason(signed(spender=X402_EXACT_PERMIT2_PROXY_ADDRESS)) == "invalid_permit2_spender"
    assert await reason(signed(to=other)) == "invalid_permit2_recipient_mismatch"
    short = int(time.time()) + 300  # a permit that expires before the period ends
    assert await reason(signed(deadline=short)) == "permit2_deadline_expired"
    forged = signed()
    forged["payload"]["permit2Authorization"]["permitted"]["amount"] = str(PRICE_RAW * 10)
    assert await reason(forged) == "invalid_permit2_signature"
    # An upto payload offered as exact is not an exact payment.
    as_exact = signed()
    as_exact["accepted"] = {**requirement, "scheme": "exact"}
    assert await reason(as_exact) == "invalid_permit2_spender"
    # Nothing was taken on: no claim, no authorisation, no credits, no project.
    async with gw.services.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(X402Upto)) == 0
        assert await session.scalar(select(func.count()).select_from(X402Authorization)) == 0
    assert await credit_balance(gw, paying_wallet) == 0
    assert (await gw.projects(paying_wallet))["count"] == 0
    # And a good one still goes through afterwards.
    ok = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": encode(signed())})
    assert ok.status_code == 200, ok.text


def test_the_consumption_never_exceeds_the_maximum() -> None:
    assert upto.consumed_raw(42, PRICE_RAW, MONTH_S, PRICE_RAW) == 42_000
    assert upto.consumed_raw(MONTH_S, PRICE_RAW, MONTH_S, PRICE_RAW) == PRICE_RAW
    assert upto.consumed_raw(MONTH_S * 5, PRICE_RAW, MONTH_S, PRICE_RAW) == PRICE_RAW
    assert upto.consumed_raw(-3, PRICE_RAW, MONTH_S, PRICE_RAW) == 0
    assert upto.consumed_raw(10**9, 7, 3, 11) == 11


async def test_a_top_up_by_upto_funds_a_project_on_credits_by_the_second(
    upto_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """A project deployed on credits is extended by ``upto``: its runtime from then is billed against the
    authorisation (no hourly debit of the credits), and its deletion settles the seconds consumed. A second
    ``upto`` while the first funds the project is 409 ``upto_already_open``."""
    gw, chain = upto_gateway, devchains["base"]
    await approve_permit2(paying_wallet, chain, "usdc")
    await gw.grant_credits(paying_wallet, Decimal("10"))
    deployed = await gw.deploy(paying_wallet, static_site(unique_name("credits"), "x", port=free_port()))
    assert deployed.status_code == 200, deployed.text
    project_id = deployed.json()["projectId"]
    credits_before = await credit_balance(gw, paying_wallet)
    recipient_before = await chain.token_balance("usdc", RECIPIENT)

    recording = Recording(WalletAuth(paying_wallet, gw.clock))
    transport = x402AsyncTransport(upto_client(paying_wallet, chain), transport=recording)
    path = f"/agent/projects/{project_id}/extend"
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        extended = await http.post(path, json={"months": 2})
    assert extended.status_code == 200, extended.text
    assert extended.json()["amount_usd"] == 0.0  # authorised, not charged
    assert await credit_balance(gw, paying_wallet) == credits_before
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before

    # Nearly two hours on the authorisation (of two months of 3600 s): no hour is debited from the credits.
    metering = gw.services.metering
    assert metering is not None
    runtime_s = 2 * MONTH_S - 100
    gw.clock.advance(seconds=runtime_s)
    report = await metering.run_once()
    assert report.hours_billed == 0 and report.settled == []
    assert await credit_balance(gw, paying_wallet) == credits_before

    # Another upto for the same project while this one is open: refused before anything is signed for.
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        again = await http.post(path, json={"months": 1})
    assert again.status_code == 409, again.text
    assert again.json()["code"] == "upto_already_open"

    deleted = await gw.http.delete(f"/agent/projects/{project_id}", headers=gw.auth(paying_wallet))
    assert deleted.status_code == 200, deleted.text
    [settled] = (await metering.run_once()).settled
    consumed = runtime_s * PER_SECOND_RAW
    assert settled.amount_raw == consumed and settled.reason == "deleted"
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + consumed
    assert await credit_balance(gw, paying_wallet) == credits_before


async def test_a_settlement_whose_worker_died_before_sending_is_recovered_and_settled_once(
    upto_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """A worker took the row (``settling``) and died before sending: after the stale period, a pass sees
    the Permit2 nonce unused on chain, reopens it and settles it, once."""
    gw, chain = upto_gateway, devchains["base"]
    await approve_permit2(paying_wallet, chain, "usdc")
    accepted, _ = await deploy_by_upto(gw, paying_wallet, chain)
    gw.clock.advance(seconds=5)
    deleted = await gw.http.delete(f"/agent/projects/{accepted['projectId']}", headers=gw.auth(paying_wallet))
    assert deleted.status_code == 200, deleted.text
    row = await upto_row(gw, accepted["projectId"])
    async with gw.services.sessions() as session, session.begin():
        stored = await session.get(X402Upto, row.id)
        assert stored is not None
        stored.state, stored.updated_at = "settling", gw.clock()
    recipient_before = await chain.token_balance("usdc", RECIPIENT)
    metering = gw.services.metering
    assert metering is not None
    assert (await metering.run_once()).settled == []  # not stale yet: its worker may still be sending
    gw.clock.advance(seconds=601)
    [settled] = (await metering.run_once()).settled
    assert settled.amount_raw == 5 * PER_SECOND_RAW
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + 5 * PER_SECOND_RAW
    assert (await metering.run_once()).settled == []


async def test_a_smart_wallet_authorises_upto_by_eip1271_and_is_charged_its_runtime(
    upto_gateway: Gateway, devchains: dict[str, Chain]
) -> None:
    """An EIP-1271 wallet (owner EOA) pays a deploy by ``upto`` through coinbase's client: the gateway
    accepts the owner's signature through the wallet's ``isValidSignature``, the proxy's Permit2 does too,
    and the wallet is charged exactly its runtime."""
    gw, chain = upto_gateway, devchains["base"]
    wallet = await SmartWallet.at(chain, await deploy_factory(chain))
    await wallet.deploy()
    await wallet.fund_and_approve_permit2("usdc")
    recipient_before = await chain.token_balance("usdc", RECIPIENT)
    wallet_before = await chain.token_balance("usdc", wallet.address)

    client = x402Client().set_spend_controls({"max_amount_per_payment": "$10"})
    client.register(f"eip155:{chain.chain_id}", UptoEvmClientScheme(SmartWalletSigner(wallet)))
    usdc = chain.tokens["usdc"].lower()
    client.register_policy(
        lambda version, offers: [o for o in offers if o.scheme == "upto" and o.asset.lower() == usdc]
    )
    transport = x402AsyncTransport(client, transport=SmartWalletAuth(wallet, gw.clock))
    body = static_site(unique_name("upto1271"), "x", port=free_port())
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        response = await http.post("/agent/deploy", json=body)
    assert response.status_code == 200, response.text
    project_id = response.json()["projectId"]

    gw.clock.advance(seconds=9)
    deleted = await gw.http.delete(f"/agent/projects/{project_id}", headers=wallet.auth(gw.clock.now_ms()))
    assert deleted.status_code == 200, deleted.text
    metering = gw.services.metering
    assert metering is not None
    [settled] = (await metering.run_once()).settled
    assert settled.amount_raw == 9 * PER_SECOND_RAW
    assert await chain.token_balance("usdc", RECIPIENT) == recipient_before + 9 * PER_SECOND_RAW
    assert await chain.token_balance("usdc", wallet.address) == wallet_before - 9 * PER_SECOND_RAW
