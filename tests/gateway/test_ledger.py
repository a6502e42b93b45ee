"""The payment ledger under concurrency (§8), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.gateway.conftest import (
    Chain,
    Wallet,
    chain_overrides,
    gateway_settings,
    running_gateway,
    static_site,
    unique_name,
)
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.db, pytest.mark.slow]


async def test_one_hash_fifty_concurrent_requests_one_deploy(
    tmp_path: Path, database_url: str, devchains: dict[str, Chain], paying_wallet: Wallet
) -> None:
    # The suite's 3 s RPC timeout is for tests of a dead RPC: here fifty receipt reads at once on a
    # loaded box took anvil longer, and three requests were an honest 502 (CI).
    settings = gateway_settings(
        tmp_path, database_url, rate_limit_requests=1000, rpc_timeout_s=30.0, **chain_overrides(devchains)
    )
    async with running_gateway(settings, tmp_path, chains=devchains) as gw:
        tx = await paying_wallet.transfer(devchains["base"], "usdc", 1_813_947)
        responses = await asyncio.gather(
            *(
                gw.deploy(
                    paying_wallet,
                    static_site(unique_name("race"), "race", port=free_port()),
                    **{"X-Payment-Tx": tx.upper().replace("0X", "0x")},
                )
                for _ in range(50)
            )
        )
        statuses = sorted(r.status_code for r in responses)
        others = [(r.status_code, r.text) for r in responses if r.status_code not in (200, 409)]
        assert statuses.count(200) == 1, others
        assert statuses.count(409) == 49, others
        assert all(r.json()["code"] == "payment_already_processed" for r in responses if r.status_code == 409)

        listing = await gw.projects(paying_wallet)
        assert listing["count"] == 1
        quote = await gw.deploy(paying_wallet, static_site(unique_name(), "x", port=free_port()))
        assert quote.json()["current_credit_balance_usd"] == 1.813947  # credited once
