"""Hourly metering with an injected clock: credits drain, projects pause at zero and resume on top-up."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from paddock_gateway.metering import hour_cost_micro
from tests.gateway.conftest import (
    Gateway,
    Wallet,
    gateway_settings,
    new_wallet,
    running_gateway,
    static_site,
    unique_name,
)
from tests.ports import free_port

pytestmark = [pytest.mark.slow]


async def balance_usd(gw: Gateway, wallet: Wallet) -> float:
    quote = await gw.deploy(wallet, static_site(unique_name("probe"), "x", port=free_port(), months=120))
    assert quote.status_code == 402, quote.text
    return float(quote.json()["current_credit_balance_usd"])


async def answers(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=1.0) as http:
            return (await http.get(url)).status_code == 200
    except httpx.HTTPError:
        return False


async def test_credits_drain_hourly_and_projects_pause_at_zero(tmp_path: Path) -> None:
    settings = gateway_settings(tmp_path, static_monthly_usd=Decimal("7.30"))  # 0.01 USD = 1 credit per hour
    async with running_gateway(settings, tmp_path) as gw:
        metering = gw.services.metering
        assert metering is not None
        wallet = new_wallet()
        await gw.grant_credits(wallet, Decimal("7.30"))
        started = (
            await gw.deploy(wallet, static_site(unique_name("meter"), "<b>metered</b>", port=free_port()))
        ).json()
        ready = await gw.wait_terminal(wallet, started["projectId"], started["deploymentId"])
        assert ready["status"] == "ready" and await answers(ready["endpoint"])

        gw.clock.advance(minutes=59)
        assert (await metering.run_once()).hours_billed == 0
        gw.clock.advance(minutes=1)
        assert (await metering.run_once()).hours_billed == 1
        assert await balance_usd(gw, wallet) == 7.29

        gw.clock.advance(hours=9, minutes=30)
        report = await metering.run_once()
        assert report.hours_billed == 9 and report.micro_credits == 9 * 1_000_000
        assert await balance_usd(gw, wallet) == 7.20
        assert (await metering.run_once()).hours_billed == 0  # re-running a pass charges nothing

        gw.clock.advance(hours=800)
        report = await metering.run_once()
        assert report.hours_billed == 720 and report.paused == [started["projectId"]]
        assert await balance_usd(gw, wallet) == 0
        assert not await answers(ready["endpoint"])  # the sandbox is paused
        listed = (await gw.projects(wallet))["projects"]
        assert [p["id"] for p in listed] == [started["projectId"]]

        gw.clock.advance(hours=5)
        assert (await metering.run_once()).hours_billed == 0  # paused hours are not billed

        await gw.grant_credits(wallet, Decimal("1"))  # a top-up
        report = await metering.run_once()
        assert report.resumed == [started["projectId"]]
        assert await answers(ready["endpoint"])
        gw.clock.advance(hours=1)
        assert (await metering.run_once()).hours_billed == 1
        assert await balance_usd(gw, wallet) == 0.99


async def test_failed_deployments_are_not_billed(gateway: Gateway) -> None:
    wallet = new_wallet()
    await gateway.grant_credits(wallet, Decimal("5"))
    body = static_site(unique_name("broken"), "x", port=free_port())
    body["settings"]["hasDockerfile"] = True
    started = (await gateway.deploy(wallet, body)).json()
    assert (await gateway.wait_terminal(wallet, started["projectId"], started["deploymentId"]))[
        "status"
    ] == "failed"
    gateway.clock.advance(hours=3)
    assert gateway.services.metering is not None
    assert (await gateway.services.metering.run_once()).hours_billed == 0


def test_hourly_costs_sum_to_exactly_one_month() -> None:
    monthly_raw = 1_813_947
    total = sum(hour_cost_micro(monthly_raw, hour, 730) for hour in range(1, 731))
    assert total == monthly_raw * 100  # micro-credits
