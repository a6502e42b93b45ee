"""The deploy decision table (§6) cases A–D, ownership of statuses, and deletion."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.gateway.conftest import Gateway, Wallet, new_wallet, static_site, unique_name
from tests.ports import free_port

pytestmark = [pytest.mark.slow]


async def test_case_d_no_credits_gets_a_plain_quote(gateway: Gateway) -> None:
    response = await gateway.deploy(new_wallet(), static_site(unique_name(), "d", port=free_port()))
    assert response.status_code == 402
    assert response.json()["code"] == "payment_required" and "warning" not in response.json()


async def test_case_d_short_credits_gets_a_plain_quote(gateway: Gateway) -> None:
    wallet = new_wallet()
    await gateway.grant_credits(wallet, Decimal("1.00"))
    response = await gateway.deploy(wallet, static_site(unique_name(), "d", port=free_port(), months=2))
    assert response.status_code == 402
    body = response.json()
    assert body["amount_usd"] == 3.627894 and body["amount_token"] == "3627894"
    assert body["current_credit_balance_usd"] == 1.0 and "warning" not in body


async def test_cases_a_c_b_then_a_again_after_delete(gateway: Gateway) -> None:
    wallet = new_wallet()
    await gateway.grant_credits(wallet, Decimal("10"))

    first = await gateway.deploy(wallet, static_site(unique_name("a"), "a", port=free_port()))
    assert first.status_code == 200, first.text  # A: enough credits, nothing active
    assert first.json()["message"] == "Deployment started. Poll status for updates."
    project_a = first.json()

    second_body = static_site(unique_name("c"), "c", port=free_port())
    quote = await gateway.deploy(wallet, second_body)
    assert quote.status_code == 402  # C: enough credits, one active project, no opt-in
    assert quote.json()["active_projects"] == 1 and quote.json()["current_credit_balance_usd"] == 10.0
    assert "X-Use-Existing-Credits" in quote.json()["warning"]

    shared = await gateway.deploy(wallet, second_body, **{"X-Use-Existing-Credits": "TRUE"})
    assert shared.status_code == 200, shared.text  # B
    assert "reduce runtime" in shared.json()["message"]

    for project in (project_a, shared.json()):
        deleted = await gateway.http.delete(
            f"/agent/projects/{project['projectId']}", headers=gateway.auth(wallet)
        )
        assert deleted.json() == {"projectId": project["projectId"], "status": "deleted"}
    assert (await gateway.projects(wallet))["count"] == 0

    again = await gateway.deploy(wallet, second_body)  # the name is free again, nothing active: A
    assert again.status_code == 200, again.text
    assert "reduce runtime" not in again.json()["message"]


async def test_status_of_another_wallets_deployment_is_403(gateway: Gateway) -> None:
    owner, other = new_wallet(), new_wallet()
    await gateway.grant_credits(owner, Decimal("5"))
    started = (await gateway.deploy(owner, static_site(unique_name(), "mine", port=free_port()))).json()

    response = await gateway.status(other, started["projectId"], started["deploymentId"])
    assert response.status_code == 403
    assert response.json() == {"error": "Forbidden: wallet is not the deployer", "code": "not_owner"}

    assert (await gateway.status(owner, started["projectId"], "nope")).status_code == 404
    assert (await gateway.status(owner, "nope", started["deploymentId"])).status_code == 404
    delete = await gateway.http.delete(f"/agent/projects/{started['projectId']}", headers=gateway.auth(other))
    assert delete.status_code == 403 and delete.json()["code"] == "not_owner"
    missing = await gateway.http.delete("/agent/projects/unknown", headers=gateway.auth(owner))
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


async def test_name_taken_before_any_quote(gateway: Gateway) -> None:
    wallet = new_wallet()
    await gateway.grant_credits(wallet, Decimal("5"))
    body = static_site(unique_name("taken"), "x", port=free_port())
    assert (await gateway.deploy(wallet, body)).status_code == 200
    body["uniqueName"] = body["uniqueName"].upper()
    response = await gateway.deploy(new_wallet(), body)
    assert response.status_code == 400 and response.json()["code"] == "name_taken"


async def test_platform_down_on_credit_path(gateway: Gateway) -> None:
    wallet = new_wallet()
    await gateway.grant_credits(wallet, Decimal("5"))
    gateway.provider.unavailable = True
    response = await gateway.deploy(wallet, static_site(unique_name(), "x", port=free_port()))
    assert response.status_code == 502 and response.json()["code"] == "upstream_unavailable"
    gateway.provider.unavailable = False
    assert (await gateway.projects(wallet))["count"] == 0


async def wait_ready(gateway: Gateway, wallet: Wallet, started: dict[str, str]) -> dict[str, object]:
    return await gateway.wait_terminal(wallet, started["projectId"], started["deploymentId"])
