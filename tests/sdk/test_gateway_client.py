"""``GatewayClient.deploy`` against a real gateway on 127.0.0.1 and real anvil chains: quotes, real
ERC-20 transfers, and every failure after paying — without ever paying twice.

The gateway's hosting provider is the local fake of tests/gateway (serves the upload on a port); the
payment path (signatures, 402, chain verification, ledgers) is the real gateway's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import paddock
from paddock._payments import PaymentLedger
from paddock_gateway import credits
from tests.gateway.conftest import RECIPIENT, Gateway, Wallet, new_wallet, rpc, unique_name
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]

PRICE_RAW = 1_813_947  # the fixtures' static price: 1.813947 USD a month


class Tap(httpx.BaseTransport):
    """The real HTTP transport, with a hook that may replace what happens to each request."""

    def __init__(self, hook: Callable[[httpx.Request, Callable[[], httpx.Response]], httpx.Response]) -> None:
        self.inner = httpx.HTTPTransport()
        self.hook = hook
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)

        def forward() -> httpx.Response:
            response = self.inner.handle_request(request)
            response.read()
            return response

        return self.hook(request, forward)


def site(tmp_path: Path, text: str) -> Path:
    directory = tmp_path / "site"
    directory.mkdir(exist_ok=True)
    (directory / "index.html").write_text(text)
    (directory / ".git").mkdir(exist_ok=True)
    (directory / ".git" / "config").write_text("never uploaded")
    return directory


def client(gw: Gateway, wallet: Wallet, tmp_path: Path, **options: Any) -> paddock.GatewayClient:
    options.setdefault("rpc_urls", {name: chain.rpc_url for name, chain in gw.chains.items()})
    return paddock.GatewayClient(
        gw.url,
        "0x" + bytes(wallet.account.key).hex(),
        payments_file=tmp_path / "payments.json",
        poll_interval_s=0.3,
        **options,
    )


async def sent_transactions(gw: Gateway, wallet: Wallet) -> int:
    return int(
        await rpc(gw.chains["base"].rpc_url, "eth_getTransactionCount", [wallet.address, "latest"]), 16
    )


async def test_deploy_quotes_pays_once_and_the_site_serves(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    gw, base = chain_gateway, chain_gateway.chains["base"]
    before = await base.token_balance("usdc", RECIPIENT)
    stages: list[str] = []
    tap = Tap(lambda request, forward: forward())
    port = free_port()
    with client(gw, paying_wallet, tmp_path, transport=tap) as gateway:
        deployment = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "<h1>paid by the SDK</h1>"),
            unique_name=unique_name("sdk"),
            settings={"port": port},
            on_progress=lambda stage, detail: stages.append(stage),
        )
        assert deployment.status == "ready" and deployment.url == f"http://127.0.0.1:{port}"
        assert deployment.tx_hash and deployment.amount_usd == 1.813947
        async with httpx.AsyncClient() as http:
            page = await http.get(deployment.url + "/index.html")
            hidden = await http.get(deployment.url + "/.git/config")
        assert "paid by the SDK" in page.text and hidden.status_code == 404
        projects = await asyncio.to_thread(gateway.projects)
        assert [p["id"] for p in projects] == [deployment.project_id]

    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert await sent_transactions(gw, paying_wallet) == 1
    assert stages[:4] == ["upload", "quote", "payment", "confirmation"] and stages[-1] == "ready"
    assert set(stages[4:-1]) == {"build"}
    signed = [r for r in tap.requests if "x-signature" in r.headers]
    nonces = [r.headers["x-nonce"] for r in signed]
    assert len(signed) >= 3 and len(set(nonces)) == len(nonces)  # a fresh nonce on every request
    assert all(r.headers["x-wallet-address"] == paying_wallet.address for r in signed)
    [payment] = PaymentLedger(tmp_path / "payments.json").all()
    assert payment.tx_hash == deployment.tx_hash and payment.state == "resolved"


async def test_an_answer_lost_after_paying_is_not_paid_again(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    """The paying call reaches the gateway (it deploys), the answer is lost: the retry resubmits the
    same hash (409), goes on with the credits, finds its own project by name and waits for it."""
    gw, base = chain_gateway, chain_gateway.chains["base"]
    before = await base.token_balance("usdc", RECIPIENT)
    lost: list[str] = []

    def lose_first_paid_answer(
        request: httpx.Request, forward: Callable[[], httpx.Response]
    ) -> httpx.Response:
        response = forward()
        if "x-payment-tx" in request.headers and not lost:
            lost.append(request.headers["x-payment-tx"])
            raise httpx.ReadError("connection reset after the request was processed", request=request)
        return response

    port = free_port()
    with client(gw, paying_wallet, tmp_path, transport=Tap(lose_first_paid_answer)) as gateway:
        deployment = await asyncio.to_thread(
            gateway.deploy, site(tmp_path, "once"), unique_name=unique_name("lost"), settings={"port": port}
        )
    assert lost and deployment.status == "ready" and deployment.url == f"http://127.0.0.1:{port}"
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert await sent_transactions(gw, paying_wallet) == 1
    assert len((await gw.projects(paying_wallet))["projects"]) == 1


async def test_a_crash_after_paying_resumes_with_the_recorded_hash(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    """The gateway is unreachable after the transfer: deploy gives up with the payment on record; a
    new client (a new process) resubmits that hash instead of paying again."""
    gw, base = chain_gateway, chain_gateway.chains["base"]
    before = await base.token_balance("usdc", RECIPIENT)

    def unreachable_when_paying(
        request: httpx.Request, forward: Callable[[], httpx.Response]
    ) -> httpx.Response:
        if "x-payment-tx" in request.headers:
            raise httpx.ConnectError("connection refused", request=request)
        return forward()

    name = unique_name("crash")
    port = free_port()
    first = client(gw, paying_wallet, tmp_path, transport=Tap(unreachable_when_paying), max_submits=2)
    with first, pytest.raises(paddock.PaymentError) as gave_up:
        await asyncio.to_thread(first.deploy, site(tmp_path, "x"), unique_name=name, settings={"port": port})
    assert gave_up.value.tx_hash and "resubmits it" in str(gave_up.value)
    [kept] = PaymentLedger(tmp_path / "payments.json").all()
    assert kept.state == "mined" and kept.tx_hash == gave_up.value.tx_hash

    with client(gw, paying_wallet, tmp_path) as second:
        deployment = await asyncio.to_thread(
            second.deploy, site(tmp_path, "x"), unique_name=name, settings={"port": port}
        )
    assert deployment.status == "ready" and deployment.tx_hash == kept.tx_hash
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert await sent_transactions(gw, paying_wallet) == 1
    assert PaymentLedger(tmp_path / "payments.json").all()[0].state == "resolved"


async def test_a_failed_topup_is_resubmitted_with_the_same_hash(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_top_up = credits.top_up
    failures: list[int] = []

    async def fails_once(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(1)
            raise RuntimeError("database hiccup")
        return await real_top_up(*args, **kwargs)

    monkeypatch.setattr(credits, "top_up", fails_once)
    answers: list[str] = []

    def note(request: httpx.Request, forward: Callable[[], httpx.Response]) -> httpx.Response:
        response = forward()
        if "x-payment-tx" in request.headers:
            answers.append(f"{response.status_code} {response.json().get('code', '')}".strip())
        return response

    with client(chain_gateway, paying_wallet, tmp_path, transport=Tap(note)) as gateway:
        deployment = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "t"),
            unique_name=unique_name("topup"),
            settings={"port": free_port()},
        )
    assert answers == ["500 topup_failed", "200"] and deployment.status == "ready"
    assert await sent_transactions(chain_gateway, paying_wallet) == 1


async def test_deploy_failed_after_topup_goes_on_with_the_credits(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path
) -> None:
    gw = chain_gateway
    answers: list[str] = []

    def note(request: httpx.Request, forward: Callable[[], httpx.Response]) -> httpx.Response:
        if "x-payment-tx" in request.headers:
            gw.provider.unavailable = True  # the hosting platform is down for the paying call only
        response = forward()
        gw.provider.unavailable = False
        if request.url.path == "/agent/deploy":
            answers.append(f"{response.status_code} {response.json().get('code', '')}".strip())
        return response

    with client(gw, paying_wallet, tmp_path, transport=Tap(note)) as gateway:
        deployment = await asyncio.to_thread(
            gateway.deploy,
            site(tmp_path, "c"),
            unique_name=unique_name("credit"),
            settings={"port": free_port()},
        )
    assert answers == ["402 payment_required", "500 deploy_failed_after_topup", "200"]
    assert deployment.status == "ready" and await sent_transactions(gw, paying_wallet) == 1


async def test_a_short_wallet_pays_nothing(chain_gateway: Gateway, tmp_path: Path) -> None:
    poor = new_wallet()
    await rpc(chain_gateway.chains["base"].rpc_url, "anvil_setBalance", [poor.address, hex(10**18)])
    with (
        client(chain_gateway, poor, tmp_path) as gateway,
        pytest.raises(paddock.InsufficientFundsError, match="quote is 1813947"),
    ):
        await asyncio.to_thread(
            gateway.deploy, {"index.html": "x"}, unique_name=unique_name("poor"), settings={"port": 1}
        )
    base_only = {"base": chain_gateway.chains["base"].rpc_url}
    with (
        client(chain_gateway, poor, tmp_path, rpc_urls=base_only) as gateway,
        pytest.raises(paddock.PaymentError, match="no RPC URL"),
    ):
        await asyncio.to_thread(
            gateway.deploy,
            {"index.html": "x"},
            unique_name=unique_name("poor"),
            chain="arbitrum",
            settings={"port": 1},
        )
    assert await sent_transactions(chain_gateway, poor) == 0
    assert PaymentLedger(tmp_path / "payments.json").all() == []


async def test_a_crash_between_signing_and_broadcast_rebroadcasts_the_same_transfer(
    chain_gateway: Gateway, paying_wallet: Wallet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transfer is on record but never left the machine: the next deploy broadcasts exactly that
    signed transaction (same nonce, same hash), so at most one payment can ever land."""
    gw, base = chain_gateway, chain_gateway.chains["base"]
    before = await base.token_balance("usdc", RECIPIENT)
    real_record = PaymentLedger.record

    def record_then_crash(self: PaymentLedger, payment: Any) -> None:
        real_record(self, payment)
        raise KeyboardInterrupt("the process dies right after writing the payment down")

    monkeypatch.setattr(PaymentLedger, "record", record_then_crash)
    name, port = unique_name("bcast"), free_port()
    with client(gw, paying_wallet, tmp_path) as first, pytest.raises(KeyboardInterrupt):
        await asyncio.to_thread(first.deploy, site(tmp_path, "b"), unique_name=name, settings={"port": port})
    monkeypatch.setattr(PaymentLedger, "record", real_record)
    [signed] = PaymentLedger(tmp_path / "payments.json").all()
    assert signed.state == "signed" and await sent_transactions(gw, paying_wallet) == 0
    assert await base.receipt(signed.tx_hash) is None

    with client(gw, paying_wallet, tmp_path) as second:
        deployment = await asyncio.to_thread(
            second.deploy, site(tmp_path, "b"), unique_name=name, settings={"port": port}
        )
    assert deployment.status == "ready" and deployment.tx_hash == signed.tx_hash
    assert await sent_transactions(gw, paying_wallet) == 1
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
