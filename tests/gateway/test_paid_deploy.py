"""The two-call flow against real anvil chains: quote, ERC-20 transfer, deploy, the app serving."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import RECIPIENT, Gateway, Wallet, static_site, unique_name
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]


async def test_quote_pay_deploy_and_the_endpoint_serves_the_upload(
    chain_gateway: Gateway, paying_wallet: Wallet
) -> None:
    gw, base = chain_gateway, chain_gateway.chains["base"]
    port = free_port()
    body = static_site(unique_name("paid"), "<h1>hello from paddock</h1>", port=port)

    quote = await gw.deploy(paying_wallet, body)
    assert quote.status_code == 402
    q = quote.json()
    assert q["code"] == "payment_required" and q["error"] == "Payment required"
    assert q["amount_usd"] == 1.813947 and q["amount_token"] == "1813947"
    assert q["token"] == "usdc" and q["decimals"] == 6 and q["payment_chain"] == "base"
    assert q["pay_to"] == RECIPIENT
    assert q["current_credit_balance_usd"] == 0 and q["active_projects"] == 0
    assert "warning" not in q
    assert q["supported_chains"] == [
        {"chain": "base", "chain_id": 8453, "tokens": ["usdc", "usdt"]},
        {"chain": "arbitrum", "chain_id": 42161, "tokens": ["usdc", "usdt"]},
    ]

    before = await base.token_balance("usdc", RECIPIENT)
    tx_hash = await paying_wallet.transfer(base, "usdc", int(q["amount_token"]))
    assert await base.token_balance("usdc", RECIPIENT) == before + 1813947

    paid = await gw.deploy(paying_wallet, body, **{"X-Payment-Tx": tx_hash})
    assert paid.status_code == 200, paid.text
    accepted = paid.json()
    assert accepted["status"] == "deploying"

    final = await gw.wait_terminal(paying_wallet, accepted["projectId"], accepted["deploymentId"])
    assert final == {
        "status": "ready",
        "deployment_id": accepted["deploymentId"],
        "endpoint": f"http://127.0.0.1:{port}",
    }
    async with httpx.AsyncClient() as http:
        page = await http.get(final["endpoint"] + "/index.html")
    assert page.status_code == 200 and "hello from paddock" in page.text

    listing = await gw.projects(paying_wallet)
    assert listing["wallet"] == paying_wallet.address and listing["count"] == 1
    project = listing["projects"][0]
    assert project["id"] == accepted["projectId"] and project["name"] == body["uniqueName"]
    assert project["status"] == "active" and project["url"] == final["endpoint"]
    assert project["createdAt"].endswith("Z") and len(project["createdAt"]) == 24

    again = await gw.deploy(
        paying_wallet, static_site(unique_name(), "x", port=free_port()), **{"X-Payment-Tx": tx_hash}
    )
    assert again.status_code == 409
    assert again.json() == {
        "error": "Payment already processed",
        "code": "payment_already_processed",
        "tx_hash": tx_hash.lower(),
    }
