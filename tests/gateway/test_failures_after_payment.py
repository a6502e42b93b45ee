"""§8.4: failures after a verified payment, and resuming a hash whose top-up never completed."""

from __future__ import annotations

from typing import Any

import pytest

from paddock_gateway import credits
from tests.gateway.conftest import Gateway, Wallet, static_site, unique_name
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]


def site() -> dict[str, Any]:
    return static_site(unique_name("after"), "<p>after</p>", port=free_port())


async def test_deploy_failure_after_topup_keeps_the_credits(
    chain_gateway: Gateway, paying_wallet: Wallet
) -> None:
    tx = await paying_wallet.transfer(chain_gateway.chains["base"], "usdc", 2_000_000)
    chain_gateway.provider.unavailable = True
    failed = await chain_gateway.deploy(paying_wallet, site(), **{"X-Payment-Tx": tx})
    assert failed.status_code == 500
    assert failed.json()["code"] == "deploy_failed_after_topup"
    assert failed.json()["tx_hash"] == tx and failed.json()["credited_usd"] == 2.0

    chain_gateway.provider.unavailable = False
    assert (await chain_gateway.deploy(paying_wallet, site(), **{"X-Payment-Tx": tx})).status_code == 409
    retry = await chain_gateway.deploy(paying_wallet, site(), **{"X-Use-Existing-Credits": "true"})
    assert retry.status_code == 200, retry.text  # case A on the credits the payment added


async def test_topup_failure_is_resumable_with_the_same_hash(
    chain_gateway: Gateway, paying_wallet: Wallet, monkeypatch: pytest.MonkeyPatch
) -> None:
    tx = await paying_wallet.transfer(chain_gateway.chains["base"], "usdc", 1_813_947)
    real_top_up = credits.top_up

    async def broken(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("database hiccup")

    monkeypatch.setattr(credits, "top_up", broken)
    failed = await chain_gateway.deploy(paying_wallet, site(), **{"X-Payment-Tx": tx})
    assert failed.status_code == 500
    assert failed.json() == {
        "error": "Credit top-up failed after the payment was verified; resubmit the same X-Payment-Tx",
        "code": "topup_failed",
        "tx_hash": tx,
    }
    monkeypatch.setattr(credits, "top_up", real_top_up)

    stranger = Wallet(__import__("eth_account").Account.create())
    other = await chain_gateway.deploy(stranger, site(), **{"X-Payment-Tx": tx})
    assert other.status_code == 409  # verified, but for another wallet

    resumed = await chain_gateway.deploy(paying_wallet, site(), **{"X-Payment-Tx": tx})
    assert resumed.status_code == 200, resumed.text
    quote = await chain_gateway.deploy(paying_wallet, site())
    assert quote.json()["current_credit_balance_usd"] == 1.813947  # credited exactly once
