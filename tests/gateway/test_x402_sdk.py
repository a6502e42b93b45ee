"""The project's own client pays by x402: ``GatewayClient.deploy(pay_with="x402")`` against a real gateway
on real anvil chains — no RPC URL, no gas, no transaction of the wallet's own, and a lost answer retried
with the same authorization is never paid twice."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import paddock
from paddock._errors import InsufficientFundsError
from paddock_gateway import devchain
from tests.gateway.conftest import RECIPIENT, Gateway, Wallet, new_wallet, rpc, unique_name
from tests.ports import free_port
from tests.sdk.test_gateway_client import PRICE_RAW, Tap
from tests.sdk.test_gateway_client import client as sdk_client

pytestmark = [pytest.mark.chain, pytest.mark.slow]


def site(tmp_path: Path, text: str) -> Path:
    directory = tmp_path / "site"
    directory.mkdir(exist_ok=True)
    (directory / "index.html").write_text(text)
    return directory


def client(
    gw: Gateway, wallet: Wallet, tmp_path: Path, transport: httpx.BaseTransport
) -> paddock.GatewayClient:
    return sdk_client(gw, wallet, tmp_path, rpc_urls={}, transport=transport)  # x402 needs no RPC


async def sent_transactions(url: str, address: str) -> int:
    return int(await rpc(url, "eth_getTransactionCount", [address, "latest"]), 16)


async def test_the_sdk_pays_by_signature_and_the_site_serves(
    x402_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    gw, arbitrum = x402_gateway, x402_gateway.chains["arbitrum"]
    before = await arbitrum.token_balance("usdc", RECIPIENT)
    stages: list[str] = []
    tap = Tap(lambda request, forward: forward())
    port = free_port()
    with client(gw, paying_wallet, tmp_path, tap) as gateway:
        deployment = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "<h1>signed, not sent</h1>"),
            unique_name=unique_name("sdk402"),
            settings={"port": port},
            chain="arbitrum",
            pay_with="x402",
            on_progress=lambda stage, detail: stages.append(stage),
        )
    assert deployment.status == "ready" and deployment.url == f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        assert "signed, not sent" in (await http.get(deployment.url + "/index.html")).text
    receipt = await arbitrum.receipt(str(deployment.tx_hash))
    assert receipt is not None and receipt["from"].lower() == devchain.SETTLEMENT_ADDRESS.lower()
    assert await arbitrum.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert await sent_transactions(arbitrum.rpc_url, paying_wallet.address) == 0
    assert stages[:4] == ["upload", "quote", "payment", "confirmation"] and stages[-1] == "ready"
    [paying] = [r for r in tap.requests if "payment-signature" in r.headers]
    accepted = json.loads(base64.b64decode(paying.headers["payment-signature"]))["accepted"]
    assert accepted["network"] == f"eip155:{arbitrum.chain_id}" and accepted["amount"] == str(PRICE_RAW)


async def test_a_lost_answer_is_retried_with_the_same_authorization_and_paid_once(
    x402_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    gw, base = x402_gateway, x402_gateway.chains["base"]
    before = await base.token_balance("usdc", RECIPIENT)
    sent: list[str] = []

    def lose_first_paid_answer(
        request: httpx.Request, forward: Callable[[], httpx.Response]
    ) -> httpx.Response:
        response = forward()
        if "payment-signature" in request.headers:
            sent.append(request.headers["payment-signature"])
            if len(sent) == 1:
                raise httpx.ReadError("connection reset after the request was processed", request=request)
        return response

    port = free_port()
    with client(gw, paying_wallet, tmp_path, Tap(lose_first_paid_answer)) as gateway:
        deployment = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "once"),
            unique_name=unique_name("lost402"),
            settings={"port": port},
            pay_with="x402",
        )
    assert deployment.status == "ready" and deployment.url == f"http://127.0.0.1:{port}"
    assert len(sent) == 2 and len(set(sent)) == 1  # the retry carried the same authorization
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert len((await gw.projects(paying_wallet))["projects"]) == 1


async def test_a_wallet_without_usdc_pays_nothing(x402_gateway: Gateway, tmp_path: Path) -> None:
    broke = new_wallet()
    with (
        client(x402_gateway, broke, tmp_path, Tap(lambda request, forward: forward())) as gateway,
        pytest.raises(InsufficientFundsError),
    ):
        await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "x"),
            unique_name=unique_name(),
            settings={"port": free_port()},
            pay_with="x402",
        )
    assert (await x402_gateway.projects(broke))["count"] == 0
