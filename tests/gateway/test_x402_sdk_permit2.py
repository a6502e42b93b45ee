"""The project's own client pays by Permit2 and by preference: ``GatewayClient.deploy(pay_with="x402",
token="USDT")`` and ``paddock deploy --x402 --asset USDT`` against a real gateway on real anvil chains,
with the dev chain's Permit2 and x402 proxies at their canonical addresses. The recipient gains exactly
the price; a wallet without an allowance to Permit2 approves it first when it has an RPC URL, and is told
what to do when it has none; a preference the 402 does not offer is refused by name before anything is
signed or sent."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import paddock
from paddock import permit2
from paddock_gateway import devchain
from tests.gateway.conftest import RECIPIENT, Chain, Gateway, Wallet, new_wallet, rpc, unique_name
from tests.gateway.test_x402_sdk import site
from tests.gateway.test_x402_upto import PER_SECOND_RAW, upto_gateway
from tests.ports import free_port
from tests.sdk.test_gateway_client import PRICE_RAW, Tap
from tests.sdk.test_gateway_client import client as sdk_client

__all__ = ["upto_gateway"]

pytestmark = [pytest.mark.chain, pytest.mark.slow]


async def allowance(chain: Chain, owner: str, token: str) -> int:
    data = permit2.allowance_calldata(owner)
    return int(
        await rpc(chain.rpc_url, "eth_call", [{"to": chain.tokens[token], "data": data}, "latest"]), 16
    )


async def sent_transactions(chain: Chain, address: str) -> int:
    return int(await rpc(chain.rpc_url, "eth_getTransactionCount", [address, "latest"]), 16)


def paid_with(tap: Tap) -> list[dict[str, object]]:
    """The ``accepted`` offer of every ``PAYMENT-SIGNATURE`` the client sent."""
    return [
        json.loads(base64.b64decode(r.headers["payment-signature"]))["accepted"]
        for r in tap.requests
        if "payment-signature" in r.headers
    ]


async def test_the_sdk_pays_permit2_exact_in_usdt_and_the_recipient_gains_exactly_the_price(
    x402_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    gw, base = x402_gateway, x402_gateway.chains["base"]
    assert await allowance(base, paying_wallet.address, "usdt") == 0
    recipient_before = await base.token_balance("usdt", RECIPIENT)
    payer_before = await base.token_balance("usdt", paying_wallet.address)
    usdc_before = await base.token_balance("usdc", RECIPIENT)
    stages: list[tuple[str, dict[str, object]]] = []
    tap = Tap(lambda request, forward: forward())
    port = free_port()
    with sdk_client(gw, paying_wallet, tmp_path, transport=tap) as gateway:  # an RPC URL per chain
        deployment = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "<h1>paid in USDT through Permit2</h1>"),
            unique_name=unique_name("sdkusdt"),
            settings={"port": port},
            token="USDT",
            pay_with="x402",
            on_progress=lambda stage, detail: stages.append((stage, detail)),
        )
    assert deployment.status == "ready" and deployment.url == f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        assert "paid in USDT" in (await http.get(deployment.url + "/index.html")).text
    assert await base.token_balance("usdt", RECIPIENT) == recipient_before + PRICE_RAW
    assert await base.token_balance("usdt", paying_wallet.address) == payer_before - PRICE_RAW
    assert await base.token_balance("usdc", RECIPIENT) == usdc_before
    receipt = await base.receipt(str(deployment.tx_hash))
    assert receipt is not None and receipt["from"].lower() == devchain.SETTLEMENT_ADDRESS.lower()
    assert receipt["to"].lower() == permit2.EXACT_PROXY_ADDRESS.lower()
    # The wallet's one transaction: approve(Permit2), made because its allowance was short.
    assert await sent_transactions(base, paying_wallet.address) == 1
    assert await allowance(base, paying_wallet.address, "usdt") == permit2.UINT256_MAX  # unlimited: kept
    [approval] = [detail for stage, detail in stages if stage == "approval"]
    assert approval["asset"] == "usdt"
    [accepted] = paid_with(tap)
    assert accepted["asset"] == base.tokens["usdt"] and accepted["scheme"] == "exact"
    assert accepted["extra"] == {"assetTransferMethod": "permit2"}

    # A second payment finds the allowance and sends nothing of its own.
    with sdk_client(gw, paying_wallet, tmp_path) as gateway:
        again = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "again"),
            unique_name=unique_name("sdkusdt"),
            settings={"port": free_port()},
            token="usdt",
            pay_with="x402",
        )
    assert again.status == "ready"
    assert await sent_transactions(base, paying_wallet.address) == 1
    assert await base.token_balance("usdt", RECIPIENT) == recipient_before + 2 * PRICE_RAW


async def test_without_an_rpc_url_a_short_allowance_is_named_and_nothing_is_paid(
    x402_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    gw, base = x402_gateway, x402_gateway.chains["base"]
    before = await base.token_balance("usdt", RECIPIENT)
    with (
        sdk_client(gw, paying_wallet, tmp_path, rpc_urls={}) as gateway,
        pytest.raises(paddock.PaymentVerificationError) as caught,
    ):
        await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "x"),
            unique_name=unique_name(),
            settings={"port": free_port()},
            token="usdt",
            pay_with="x402",
        )
    assert caught.value.reason == "permit2_allowance_required"
    assert "approve" in str(caught.value) and permit2.PERMIT2_ADDRESS in str(caught.value)
    assert await base.token_balance("usdt", RECIPIENT) == before
    assert (await gw.projects(paying_wallet))["count"] == 0


@pytest.mark.parametrize(
    ("preference", "named"),
    [({"token": "dai"}, "exact DAI"), ({"token": "usdt", "scheme": "upto"}, "upto USDT")],
)
async def test_a_preference_the_402_does_not_offer_is_refused_by_name_before_signing(
    x402_gateway: Gateway, tmp_path: Path, preference: dict[str, str], named: str
) -> None:
    wallet = new_wallet()  # no tokens, no gas: nothing could be paid anyway, and nothing is tried
    tap = Tap(lambda request, forward: forward())
    with (
        sdk_client(x402_gateway, wallet, tmp_path, transport=tap) as gateway,
        pytest.raises(paddock.OfferNotFoundError, match=f"does not offer {named} on eip155:8453") as caught,
    ):
        await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "x"),
            unique_name=unique_name(),
            settings={"port": free_port()},
            pay_with="x402",
            **preference,
        )
    assert "exact USDT by permit2 on eip155:8453" in str(caught.value)  # what is offered instead
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, paddock.PaymentError)
    assert paid_with(tap) == []  # no PAYMENT-SIGNATURE ever left
    assert [r.url.path for r in tap.requests if r.method == "POST"] == ["/agent/deploy"]  # only the quote


async def test_the_sdk_authorises_upto_for_a_deploy_and_pays_the_seconds_consumed(
    upto_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    """The gateway's clock is frozen and moved by the test; the SDK signs with real time, so the clock
    moves by less than the gateway's timestamp skew (60 s)."""
    gw, base = upto_gateway, upto_gateway.chains["base"]
    before = await base.token_balance("usdc", RECIPIENT)
    tap = Tap(lambda request, forward: forward())
    with sdk_client(gw, paying_wallet, tmp_path, transport=tap) as gateway:
        deployment = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "by the second"),
            unique_name=unique_name("sdkupto"),
            settings={"port": free_port()},
            scheme="upto",
            pay_with="x402",
        )
        assert deployment.status == "ready" and deployment.tx_hash is None  # authorised, not settled
        assert await base.token_balance("usdc", RECIPIENT) == before
        [accepted] = paid_with(tap)
        assert accepted["scheme"] == "upto" and accepted["asset"] == base.tokens["usdc"]
        n = 42
        gw.clock.advance(seconds=n)
        await asyncio.to_thread(gateway.delete_project, deployment.project_id)
    metering = gw.services.metering
    assert metering is not None
    [settled] = (await metering.run_once()).settled
    assert settled.amount_raw == n * PER_SECOND_RAW and settled.reason == "deleted"
    assert await base.token_balance("usdc", RECIPIENT) == before + n * PER_SECOND_RAW
    assert (await metering.run_once()).settled == []


async def paddock_cli(
    gw: Gateway, wallet: Wallet, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_WALLET_KEY": "0x" + bytes(wallet.account.key).hex(),
            "PADDOCK_GATEWAY_URL": gw.url,
            "PADDOCK_RPC_URL_BASE": gw.chains["base"].rpc_url,
            "PADDOCK_PAYMENTS_FILE": str(tmp_path / "payments.json"),
        }
    )
    command = [sys.executable, "-m", "paddock_cli.main", *args]
    return await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=180
    )


async def test_the_cli_deploys_paying_usdt_by_permit2(
    x402_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    gw, base = x402_gateway, x402_gateway.chains["base"]
    app = tmp_path / "usdt-site"
    app.mkdir()
    (app / "index.html").write_text("<p>USDT from the CLI</p>")
    port = free_port()
    before = await base.token_balance("usdt", RECIPIENT)
    ran = await paddock_cli(gw, paying_wallet, tmp_path, "deploy", str(app), "--x402", "--asset", "USDT",
                            "--scheme", "exact", "--port", str(port), "--poll-interval", "0.3", "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    deployment = json.loads(ran.stdout)
    assert deployment["status"] == "ready" and deployment["url"] == f"http://127.0.0.1:{port}"
    assert "approval" in ran.stderr and "x402 authorization signed: exact USDT by permit2" in ran.stderr
    assert await base.token_balance("usdt", RECIPIENT) == before + PRICE_RAW
    async with httpx.AsyncClient() as http:
        assert "USDT from the CLI" in (await http.get(f"http://127.0.0.1:{port}/index.html")).text

    refused = await paddock_cli(gw, paying_wallet, tmp_path, "deploy", str(app), "--x402", "--asset", "usdt",
                                "--scheme", "upto", "--port", str(free_port()))  # fmt: skip
    assert refused.returncode == 2 and "does not offer upto USDT on eip155:8453" in refused.stderr
    assert "payment" not in refused.stderr.split("does not offer")[0]  # refused before any signature
    assert await base.token_balance("usdt", RECIPIENT) == before + PRICE_RAW
