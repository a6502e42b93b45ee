"""Wallet-paid sandboxes (``POST /agent/sandboxes``) against real anvil chains and a live control plane with a
host agent (``tests/live.py``): an agent with only a funded wallet pays with coinbase's unchanged ``x402``
client, gets a sandbox access token, and runs a command through the control plane's token routes.

Time: the gateway's clock is frozen and moved by the test (``FrozenClock``), so "N seconds of running" is
exactly N. Price: the control plane's per-second compute price of the shape, rounded up to whole 10^-6 USD
(``s-1vcpu-1gb``: 1850 micro-credits a second = 18.5 → 19 raw units)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact.register import register_exact_evm_client

import paddock
from paddock_gateway import devchain
from paddock_gateway.adapters.control_plane import rate_raw
from paddock_hostagent.images import ImageStore
from tests.gateway.conftest import (
    RECIPIENT,
    Chain,
    Gateway,
    Wallet,
    chain_overrides,
    gateway_settings,
    new_wallet,
    running_gateway,
    static_site,
    unique_name,
)
from tests.gateway.test_siwx import proof
from tests.gateway.test_x402 import decode
from tests.gateway.test_x402_permit2 import approve_permit2
from tests.gateway.test_x402_upto import WINDOW_S, FrozenClock, upto_client
from tests.hostagent.conftest import guest_binary_dir, image_cache
from tests.live import LivePlatform, start_platform
from tests.ports import free_port

__all__ = ["guest_binary_dir"]

pytestmark = [pytest.mark.root, pytest.mark.chain, pytest.mark.slow]

ROOTFS = "devbox:1"
SHAPE = "s-1vcpu-1gb"
RATE = 19  # ceil((1 vCPU × 1400 + 1 GiB × 450) micro-credits / 100 per raw unit)


@pytest.fixture(scope="module")
def live(guest_binary_dir: Path) -> Iterator[LivePlatform]:
    ImageStore(image_cache()).build(ROOTFS)
    platform = start_platform(guest_binary_dir)
    try:
        yield platform
    finally:
        platform.stop()


@pytest.fixture
async def gw(tmp_path: Path, devchains: dict[str, Chain], live: LivePlatform) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        tmp_path,
        controlplane_url=live.url,
        api_key=live.api_key(plan="pro", credits=100_000),
        sandbox_rootfs=ROOTFS,
        sandbox_shape=SHAPE,
        settlement_private_key=devchain.SETTLEMENT_PRIVATE_KEY,
        public_url="https://gateway.example",
        upto_settle_window_s=WINDOW_S,
        rate_limit_requests=1_000,
        **chain_overrides(devchains),
    )
    async with running_gateway(settings, tmp_path, chains=devchains, clock=FrozenClock()) as gateway:
        yield gateway


def exact_client(wallet: Wallet, chain: Chain) -> x402Client:
    """Coinbase's client, EIP-3009 ``exact`` in USDC on this chain."""
    network = f"eip155:{chain.chain_id}"
    client = x402Client()
    register_exact_evm_client(client, wallet.account, networks=network)

    def exact_usdc(version: int, offers: list[Any]) -> list[Any]:
        return [
            o
            for o in offers
            if o.scheme == "exact"
            and o.network == network
            and o.asset.lower() == chain.tokens["usdc"].lower()
            and (o.get_extra() or {}).get("assetTransferMethod", "eip3009") == "eip3009"
        ]

    return client.register_policy(exact_usdc)


async def run_with_token(live: LivePlatform, sandbox_id: str, token: str) -> str:
    async with paddock.AsyncClient(base_url=live.url, api_key=token) as client:
        sandbox = await client.sandboxes.get(sandbox_id)
        result = await sandbox.run("echo", ["hi"])
        return str(result.stdout)


async def test_a_gateway_without_a_control_plane_key_has_no_sandboxes_to_rent(gateway: Gateway) -> None:
    response = await gateway.http.post("/agent/sandboxes", json={})
    assert response.status_code == 404 and response.json()["code"] == "sandboxes_disabled", response.text


async def test_a_wallet_without_payment_gets_402_and_no_sandbox(gw: Gateway, live: LivePlatform) -> None:
    wallet = new_wallet()
    response = await gw.http.post("/agent/sandboxes", json={"shape": "s-0.25vcpu-512mb", "seconds": 60})
    assert response.status_code == 402, response.text
    required = decode(response.headers["PAYMENT-REQUIRED"])
    assert {(o["scheme"], o["amount"]) for o in required["accepts"]} >= {("exact", "360"), ("upto", "360")}
    assert required["resource"]["url"] == "https://gateway.example/agent/sandboxes"
    listed = await gw.http.get("/agent/sandboxes", headers=gw.auth(wallet))
    assert listed.status_code == 200 and listed.json() == {"sandboxes": []}


def test_the_price_is_the_control_planes_per_second_price_rounded_up() -> None:
    assert rate_raw(1, None, 1024) == RATE
    assert rate_raw(1, 25, 512) == 6  # 575 micro-credits a second
    assert rate_raw(2, None, 4096) == 46  # 2 × 1400 + 4 × 450 = 4600


async def test_a_wallet_pays_exact_runs_a_command_with_the_token_and_only_it_manages_it(
    gw: Gateway, devchains: dict[str, Chain], live: LivePlatform
) -> None:
    chain = devchains["base"]
    wallet = new_wallet()
    await wallet.fund(chain)

    # Unpaid: 402 with x402 exact and upto offers for seconds × the shape's price.
    unpaid = await gw.http.post("/agent/sandboxes", json={"seconds": 600})
    assert unpaid.status_code == 402, unpaid.text
    assert unpaid.json()["amount_token"] == str(600 * RATE)
    assert "PAYMENT-REQUIRED" in unpaid.headers
    bad = await gw.http.post("/agent/sandboxes", json={"seconds": 0})
    assert bad.status_code == 400 and "seconds" in bad.text
    bad = await gw.http.post("/agent/sandboxes", json={"shape": "s-nope"})
    assert bad.status_code == 400 and "shape" in bad.text

    before = await chain.token_balance("usdc", RECIPIENT)
    transport = x402AsyncTransport(exact_client(wallet, chain), transport=httpx.AsyncHTTPTransport())
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=240) as http:
        created = await http.post("/agent/sandboxes", json={"seconds": 600})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["payment"]["scheme"] == "exact" and body["control_plane_url"] == live.url.rstrip("/")
    assert await chain.token_balance("usdc", RECIPIENT) == before + 600 * RATE

    assert await run_with_token(live, body["sandbox_id"], body["access_token"]) == "hi\n"
    # The settlement paid for the sandbox: sent again as a deploy's X-Payment-Tx it is not credited again.
    tx_hash = body["payment"]["transaction"]
    replay = await gw.deploy(
        wallet, static_site(unique_name(), "x", port=free_port()), **{"X-Payment-Tx": tx_hash}
    )
    assert replay.status_code == 409, replay.text

    listed = await gw.http.get("/agent/sandboxes", headers=gw.auth(wallet))
    assert listed.status_code == 200
    [entry] = listed.json()["sandboxes"]
    assert entry["sandbox_id"] == body["sandbox_id"] and entry["state"] == "running"

    other = new_wallet()
    refused = await gw.http.delete(f"/agent/sandboxes/{body['sandbox_id']}", headers=gw.auth(other))
    assert refused.status_code == 403, refused.text
    assert await run_with_token(live, body["sandbox_id"], body["access_token"]) == "hi\n"

    # Paused time is free; the block runs out after 600 s of running, then the worker pauses it.
    gw.clock.advance(seconds=100)
    paused = await gw.http.post(f"/agent/sandboxes/{body['sandbox_id']}/pause", headers=gw.auth(wallet))
    assert paused.status_code == 200 and paused.json()["running_seconds"] == 100, paused.text
    gw.clock.advance(seconds=10_000)
    resumed = await gw.http.post(f"/agent/sandboxes/{body['sandbox_id']}/resume", headers=gw.auth(wallet))
    assert resumed.status_code == 200 and resumed.json()["remaining_seconds"] == 500, resumed.text
    gw.clock.advance(seconds=501)
    metering = gw.services.metering
    assert metering is not None
    report = await metering.run_once()
    assert report.paused == [body["sandbox_id"]]
    again = await gw.http.post(f"/agent/sandboxes/{body['sandbox_id']}/resume", headers=gw.auth(wallet))
    assert again.status_code == 409 and again.json()["code"] == "sandbox_spent"

    deleted = await gw.http.delete(f"/agent/sandboxes/{body['sandbox_id']}", headers=gw.auth(wallet))
    assert deleted.status_code == 200 and deleted.json()["state"] == "deleted", deleted.text
    with pytest.raises(paddock.PaddockError):
        await run_with_token(live, body["sandbox_id"], body["access_token"])


async def test_upto_settles_the_running_seconds_once(
    gw: Gateway, devchains: dict[str, Chain], live: LivePlatform
) -> None:
    chain = devchains["base"]
    wallet = new_wallet()
    await wallet.fund(chain)
    await approve_permit2(wallet, chain, "usdc")
    before = await chain.token_balance("usdc", RECIPIENT)
    transport = x402AsyncTransport(upto_client(wallet, chain), transport=httpx.AsyncHTTPTransport())
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=240) as http:
        created = await http.post("/agent/sandboxes", json={"seconds": 3600})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["payment"]["scheme"] == "upto" and body["payment"]["authorized_raw"] == 3600 * RATE
    assert await chain.token_balance("usdc", RECIPIENT) == before  # nothing moves until settled
    assert await run_with_token(live, body["sandbox_id"], body["access_token"]) == "hi\n"

    n = 42
    gw.clock.advance(seconds=30)
    paused = await gw.http.post(f"/agent/sandboxes/{body['sandbox_id']}/pause", headers=gw.auth(wallet))
    assert paused.status_code == 200, paused.text
    gw.clock.advance(seconds=500)  # paused: free
    resumed = await gw.http.post(f"/agent/sandboxes/{body['sandbox_id']}/resume", headers=gw.auth(wallet))
    assert resumed.status_code == 200, resumed.text
    gw.clock.advance(seconds=n - 30)
    metering = gw.services.metering
    assert metering is not None
    assert (await metering.run_once()).settled == []

    # Managed by SIWx: an upto payer has authorised, not paid, and signs in all the same.
    listed = await gw.http.get(
        "/agent/sandboxes",
        headers={"SIGN-IN-WITH-X": await proof(gw, wallet.account, path="/agent/sandboxes")},
    )
    assert listed.status_code == 200, listed.text
    [entry] = listed.json()["sandboxes"]
    assert (entry["sandbox_id"], entry["running_seconds"]) == (body["sandbox_id"], n)
    path = f"/agent/sandboxes/{body['sandbox_id']}"
    other = new_wallet()
    refused = await gw.http.delete(path, headers=gw.auth(other))
    assert refused.status_code == 403, refused.text
    header = await proof(gw, wallet.account, path=path, method="DELETE")
    deleted = await gw.http.delete(path, headers={"SIGN-IN-WITH-X": header})
    assert deleted.status_code == 200, deleted.text
    [settled] = (await metering.run_once()).settled
    assert settled.amount_raw == n * RATE and settled.reason == "deleted"
    assert await chain.token_balance("usdc", RECIPIENT) == before + n * RATE
    assert (await metering.run_once()).settled == []  # exactly once
    assert await chain.token_balance("usdc", RECIPIENT) == before + n * RATE
