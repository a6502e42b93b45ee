"""Every payment verification failure of §7.2 against real chains, overpayment, and resubmission."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import Gateway, Wallet, new_wallet, static_site, unique_name
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]
PRICE_RAW = 1_813_947


def site() -> dict[str, Any]:
    return static_site(unique_name("pay"), "<p>paid</p>", port=free_port())


async def submit(gw: Gateway, wallet: Wallet, tx_hash: str, **headers: str) -> dict[str, Any]:
    response = await gw.deploy(wallet, site(), **{"X-Payment-Tx": tx_hash, **headers})
    assert response.status_code == 402, response.text
    body = dict(response.json())
    assert body["code"] == "payment_verification_failed"
    assert body["error"] == "Payment verification failed"
    assert body["tx_hash"] == tx_hash.lower()
    return body


async def test_underpayment_fails_with_both_amounts(chain_gateway: Gateway, paying_wallet: Wallet) -> None:
    tx = await paying_wallet.transfer(chain_gateway.chains["base"], "usdc", 1_000_000)
    body = await submit(chain_gateway, paying_wallet, tx)
    assert body["reason"] == "amount_insufficient"
    assert body["required_amount_token"] == str(PRICE_RAW) and body["received_amount_token"] == "1000000"
    assert body["chain"] == "base" and body["token"] == "usdc"


async def test_wrong_token_is_no_matching_transfer(chain_gateway: Gateway, paying_wallet: Wallet) -> None:
    tx = await paying_wallet.transfer(chain_gateway.chains["base"], "usdt", PRICE_RAW)
    body = await submit(chain_gateway, paying_wallet, tx)  # X-Payment-Token defaults to usdc
    assert body["reason"] == "no_matching_transfer"
    ok = await chain_gateway.deploy(paying_wallet, site(), **{"X-Payment-Tx": tx, "X-Payment-Token": "USDT"})
    assert ok.status_code == 200, ok.text  # V10: nothing was recorded, the corrected retry passes


async def test_wrong_recipient_is_no_matching_transfer(chain_gateway: Gateway, paying_wallet: Wallet) -> None:
    tx = await paying_wallet.transfer(
        chain_gateway.chains["base"], "usdc", PRICE_RAW, to=new_wallet().address
    )
    assert (await submit(chain_gateway, paying_wallet, tx))["reason"] == "no_matching_transfer"


async def test_someone_elses_payment_cannot_be_claimed(chain_gateway: Gateway, paying_wallet: Wallet) -> None:
    payer = new_wallet()
    await payer.fund(chain_gateway.chains["base"])
    tx = await payer.transfer(chain_gateway.chains["base"], "usdc", PRICE_RAW)
    assert (await submit(chain_gateway, paying_wallet, tx))["reason"] == "sender_mismatch"


async def test_reverted_transfer(chain_gateway: Gateway) -> None:
    broke = new_wallet()
    base = chain_gateway.chains["base"]
    await broke.fund(base, tokens_raw=1)  # ETH for gas, but nowhere near the price in tokens
    tx = await broke.transfer(base, "usdc", PRICE_RAW)
    assert (await base.mined(tx))["status"] == "0x0"
    assert (await submit(chain_gateway, broke, tx))["reason"] == "tx_reverted"


async def test_payment_on_another_chain_is_not_found_here(
    chain_gateway: Gateway, paying_wallet: Wallet
) -> None:
    tx = await paying_wallet.transfer(chain_gateway.chains["arbitrum"], "usdc", PRICE_RAW)
    assert (await submit(chain_gateway, paying_wallet, tx))["reason"] == "tx_not_found"  # default chain: base
    ok = await chain_gateway.deploy(
        paying_wallet, site(), **{"X-Payment-Tx": tx, "X-Payment-Chain": "Arbitrum"}
    )
    assert ok.status_code == 200, ok.text


async def test_pending_transaction_then_mined(chain_gateway: Gateway, paying_wallet: Wallet) -> None:
    base = chain_gateway.chains["base"]
    await base.set_automine(False)
    try:
        tx = await paying_wallet.send(
            base,
            base.tokens["usdc"],
            "0xa9059cbb" + "70997970c51812dc3a010c7d01b50e0d17dc79c8".rjust(64, "0") + f"{PRICE_RAW:064x}",
        )
        assert (await submit(chain_gateway, paying_wallet, tx))["reason"] == "tx_pending"
        await base.mine()
    finally:
        await base.set_automine(True)
    ok = await chain_gateway.deploy(paying_wallet, site(), **{"X-Payment-Tx": tx})
    assert ok.status_code == 200, ok.text


async def test_unknown_hash(chain_gateway: Gateway, paying_wallet: Wallet) -> None:
    assert (await submit(chain_gateway, paying_wallet, "0x" + "ab" * 32))["reason"] == "tx_not_found"


async def test_overpayment_is_credited_in_full(chain_gateway: Gateway, paying_wallet: Wallet) -> None:
    tx = await paying_wallet.transfer(chain_gateway.chains["base"], "usdc", 5_000_000)
    ok = await chain_gateway.deploy(paying_wallet, site(), **{"X-Payment-Tx": tx})
    assert ok.status_code == 200, ok.text
    quote = await chain_gateway.deploy(paying_wallet, site())
    assert quote.status_code == 402  # case C: credits are enough, but one project is active
    assert quote.json()["current_credit_balance_usd"] == 5.0
    assert quote.json()["active_projects"] == 1 and "warning" in quote.json()


async def test_rpc_down_is_502_and_records_nothing(tmp_path: Any, paying_wallet: Wallet) -> None:
    from tests.gateway.conftest import gateway_settings, running_gateway

    async with running_gateway(gateway_settings(tmp_path), tmp_path) as gw:  # RPCs unreachable
        response = await gw.deploy(paying_wallet, site(), **{"X-Payment-Tx": "0x" + "cd" * 32})
    assert response.status_code == 502
    assert response.json()["code"] == "upstream_unavailable"
