"""Paddock's own client rents wallet-paid sandboxes (``GatewayClient.create_wallet_sandbox`` and ``paddock
wallet-sandbox``) from a real gateway on anvil with a live control plane and host agent: by ``upto``, the
SDK gets a sandbox and a token, runs ``echo hi`` through the control plane with it, and the settlement is
exactly the running seconds × the price; by ``exact`` in USDT through Permit2, the CLI does the same in
``--json`` and manages the sandbox.

Time: the gateway's clock is frozen and moved by the test (tests/gateway/test_live_agent_sandboxes.py's
``gw``); the SDK signs its management requests with real time, so the test moves the clock by less than
the gateway's timestamp skew (60 s) in all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import paddock
from tests.gateway.conftest import RECIPIENT, Chain, Gateway, Wallet, new_wallet
from tests.gateway.test_live_agent_sandboxes import RATE, gw, live
from tests.hostagent.conftest import guest_binary_dir
from tests.live import LivePlatform

__all__ = ["guest_binary_dir", "gw", "live"]

pytestmark = [pytest.mark.root, pytest.mark.chain, pytest.mark.slow]


def wallet_client(
    gw: Gateway, wallet: Wallet, tmp_path: Path, chain: Chain | None = None
) -> paddock.GatewayClient:
    return paddock.GatewayClient(
        gw.url,
        "0x" + bytes(wallet.account.key).hex(),
        rpc_urls={"base": chain.rpc_url} if chain is not None else {},
        payments_file=tmp_path / "payments.json",
    )


def echo_hi(sandbox: paddock.WalletSandbox) -> str:
    with sandbox.client() as client:
        return str(client.sandboxes.get(sandbox.sandbox_id).run("echo", ["hi"]).stdout)


async def test_the_sdk_rents_by_upto_runs_a_command_and_pays_the_running_seconds(
    gw: Gateway, devchains: dict[str, Chain], live: LivePlatform, tmp_path: Path
) -> None:
    chain = devchains["base"]
    wallet = new_wallet()
    await wallet.fund(chain)
    before = await chain.token_balance("usdc", RECIPIENT)
    with wallet_client(gw, wallet, tmp_path, chain) as gateway:  # approves Permit2 for USDC first
        sandbox = await asyncio.to_thread(gateway.create_wallet_sandbox, seconds=3600, scheme="upto")
        assert sandbox.scheme == "upto" and sandbox.transaction is None
        assert sandbox.authorized_raw == 3600 * RATE and sandbox.price_per_second_raw == RATE
        assert sandbox.control_plane_url == live.url.rstrip("/")
        assert "access_token" not in repr(sandbox) and sandbox.access_token.startswith("sbt_")
        assert await chain.token_balance("usdc", RECIPIENT) == before  # authorised, nothing moved
        assert await asyncio.to_thread(echo_hi, sandbox) == "hi\n"

        gw.clock.advance(seconds=20)
        paused = await asyncio.to_thread(gateway.pause_wallet_sandbox, sandbox.sandbox_id)
        assert (paused["state"], paused["running_seconds"]) == ("paused", 20)
        gw.clock.advance(seconds=30)  # paused: free
        resumed = await asyncio.to_thread(gateway.resume_wallet_sandbox, sandbox.sandbox_id)
        assert resumed["state"] == "running"
        gw.clock.advance(seconds=7)
        [listed] = await asyncio.to_thread(gateway.wallet_sandboxes)
        assert (listed["sandbox_id"], listed["running_seconds"]) == (sandbox.sandbox_id, 27)
        deleted = await asyncio.to_thread(gateway.delete_wallet_sandbox, sandbox.sandbox_id)
        assert deleted["state"] == "deleted"

    metering = gw.services.metering
    assert metering is not None
    [settled] = (await metering.run_once()).settled
    assert settled.amount_raw == 27 * RATE and settled.reason == "deleted"
    assert await chain.token_balance("usdc", RECIPIENT) == before + 27 * RATE
    assert (await metering.run_once()).settled == []
    with pytest.raises(paddock.PaddockError):
        await asyncio.to_thread(echo_hi, sandbox)


async def wallet_sandbox_cli(
    gw: Gateway, wallet: Wallet, chain: Chain, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_WALLET_KEY": "0x" + bytes(wallet.account.key).hex(),
            "PADDOCK_GATEWAY_URL": gw.url,
            "PADDOCK_RPC_URL_BASE": chain.rpc_url,
        }
    )
    command = [sys.executable, "-m", "paddock_cli.main", "wallet-sandbox", *args]
    return await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=240
    )


async def test_the_cli_rents_by_exact_in_usdt_and_manages_the_sandbox(
    gw: Gateway, devchains: dict[str, Chain], live: LivePlatform
) -> None:
    chain = devchains["base"]
    wallet = new_wallet()
    await wallet.fund(chain)
    before = await chain.token_balance("usdt", RECIPIENT)
    ran = await wallet_sandbox_cli(gw, wallet, chain, "create", "--seconds", "120", "--asset", "USDT",
                                   "--rpc-url", chain.rpc_url, "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    made = json.loads(ran.stdout)
    assert made["scheme"] == "exact" and made["amount_raw"] == 120 * RATE
    assert await chain.token_balance("usdt", RECIPIENT) == before + 120 * RATE
    sandbox = paddock.WalletSandbox.from_api(made)  # --json prints the SDK's WalletSandbox
    assert await asyncio.to_thread(echo_hi, sandbox) == "hi\n"
    # As create's hint says: the token is the API key of the ordinary sandbox commands.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update({"PADDOCK_BASE_URL": made["control_plane_url"], "PADDOCK_API_KEY": made["access_token"]})
    command = [
        sys.executable,
        "-m",
        "paddock_cli.main",
        "sandbox",
        "exec",
        made["sandbox_id"],
        "--",
        "echo",
        "hi",
    ]
    hi = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=120
    )
    assert (hi.returncode, hi.stdout) == (0, "hi\n"), hi.stderr

    listed = await wallet_sandbox_cli(gw, wallet, chain, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [s["sandbox_id"] for s in json.loads(listed.stdout)] == [made["sandbox_id"]]
    paused = await wallet_sandbox_cli(gw, wallet, chain, "pause", made["sandbox_id"], "--json")
    assert paused.returncode == 0 and json.loads(paused.stdout)["state"] == "paused", paused.stderr
    resumed = await wallet_sandbox_cli(gw, wallet, chain, "resume", made["sandbox_id"], "--json")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["state"] == "running", resumed.stderr
    removed = await wallet_sandbox_cli(gw, wallet, chain, "rm", made["sandbox_id"])
    assert removed.returncode == 0 and removed.stdout == f"{made['sandbox_id']} deleted\n", removed.stderr

    refused = await wallet_sandbox_cli(gw, wallet, chain, "create", "--asset", "dai", "--json")
    assert refused.returncode == 2 and "does not offer exact DAI on eip155:8453" in refused.stderr
    assert refused.stdout == ""
