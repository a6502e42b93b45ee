"""Per-second billing, credit exhaustion and idle auto-pause, with the control plane's clock moved by hand.

The host is the fake seam (these are the control plane's rules); tests/integration shows the same
lifecycle on real sandboxes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from paddock_controlplane import accounts, hostlink, reconciler
from paddock_controlplane.app import create_app
from paddock_controlplane.services import Services
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.db import make_engine, make_sessionmaker, transaction
from tests.conftest import LiveServer
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink
from tests.controlplane.webhook_support import FakeClock

pytestmark = pytest.mark.db

# s-1vcpu-1gb: 1 vCPU at 0.0504 USD/h + 1 GiB at 0.0162 USD/h, 100 credits per USD.
PER_SECOND_MICRO = 1400 + 450


@dataclass
class Clocked:
    cp: ControlPlane
    clock: FakeClock
    services: Services
    host: FakeHostLink

    async def balance(self, user_id: str) -> int:
        engine = make_engine(self.cp.settings.database_url)
        try:
            async with make_sessionmaker(engine)() as session:
                return await accounts.balance_micro(session, user_id)
        finally:
            await engine.dispose()

    async def reconcile(self, step: Any) -> None:
        """One reconciler pass now (the background loop also runs them; the outcome is the same), and
        what it set off (an auto-pause runs as a task) carried out before this returns: what a test reads
        next is the pass's whole outcome, with no sleep to guess how long that takes."""
        self.services.billing_last = 0.0
        tasks = self.services.tasks.running
        before = set(tasks)
        async with transaction(self.services.sessions) as session:
            await step(session, self.services)
        await asyncio.gather(*(set(tasks) - before))

    async def status(self, http: httpx.AsyncClient, sandbox_id: str, wanted: str) -> dict[str, Any]:
        for _ in range(100):
            view = (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
            if view["status"] == wanted:
                return dict(view)
            await asyncio.sleep(0.05)
        raise AssertionError(f"{sandbox_id} is {view['status']}, wanted {wanted}")


@pytest.fixture
async def clocked(
    cp_settings: ControlPlaneSettings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Clocked]:
    link = FakeHostLink()

    async def for_host(services: object, host_id: str | None) -> FakeHostLink:
        return link

    monkeypatch.setattr(hostlink, "for_host", for_host)
    clock = FakeClock(start=None)
    settings = cp_settings.model_copy(update={"host_dead_after_s": 10**9})
    app = create_app(settings, clock=clock)
    async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        beat = await http.post(
            "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
        )
        assert beat.status_code == 200
        cp = ControlPlane(url=server.url, settings=settings, http=http)
        yield Clocked(cp, clock, app.state.services, link)


async def user_client(clocked: Clocked, credits: int = 500) -> tuple[str, httpx.AsyncClient]:
    user_id, key = await clocked.cp.new_user("pro", credits=credits)
    return user_id, httpx.AsyncClient(base_url=clocked.cp.url, headers={"X-API-Key": key}, timeout=30)


async def test_running_time_is_billed_per_second_and_paused_time_is_free(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    async with http:
        start = await clocked.balance(user_id)
        assert start == 500 * accounts.MICRO
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        clocked.clock.advance(3600)
        assert (await http.post(f"/v1/sandboxes/{sid}/pause")).status_code == 200
        # One hour of 1 vCPU + 1 GiB: 0.0666 USD = 6.66 credits, to the micro-credit.
        assert start - await clocked.balance(user_id) == 6_660_000
        clocked.clock.advance(1000)
        await clocked.reconcile(reconciler.billing_pass)
        assert start - await clocked.balance(user_id) == 6_660_000, "nothing is charged while paused"
        assert (await http.post(f"/v1/sandboxes/{sid}/resume")).status_code == 200
        clocked.clock.advance(10)
        await clocked.reconcile(reconciler.billing_pass)
        assert start - await clocked.balance(user_id) == 6_660_000 + 10 * PER_SECOND_MICRO
        clocked.clock.advance(5)
        await http.delete(f"/v1/sandboxes/{sid}")
        assert start - await clocked.balance(user_id) == 6_660_000 + 15 * PER_SECOND_MICRO
        assert (await http.get("/v1/whoami")).json()["data"]["stats"]["running"] == 0


async def test_a_quota_shape_pays_for_its_share_of_a_cpu(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    async with http:
        start = await clocked.balance(user_id)
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-0.25vcpu-512mb"})).json()["data"]["id"]
        clocked.clock.advance(100)
        await http.post(f"/v1/sandboxes/{sid}/pause")
        # A quarter of a vCPU (350/s) and half a GiB (225/s).
        assert start - await clocked.balance(user_id) == 100 * (350 + 225)


async def test_running_out_of_credit_pauses_sandboxes_and_blocks_resume(clocked: Clocked) -> None:
    _, http = await user_client(clocked, credits=1)  # 1 credit lasts 540 s on s-1vcpu-1gb
    async with http:
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        clocked.clock.advance(500)
        await clocked.reconcile(reconciler.billing_pass)
        assert (await http.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "running"
        assert ("pause", sid) not in clocked.host.calls
        clocked.clock.advance(100)
        await clocked.reconcile(reconciler.billing_pass)
        await clocked.status(http, sid, "paused")
        refused = await http.post(f"/v1/sandboxes/{sid}/resume")
        assert refused.status_code == 402, refused.text
        create = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert create.status_code == 402, create.text


async def test_an_idle_sandbox_pauses_itself_and_activity_postpones_it(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        body = {"shape": "s-1vcpu-256mb", "auto_pause_after_seconds": 60}
        sid = (await http.post("/v1/sandboxes", json=body)).json()["data"]["id"]
        busy = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]
        clocked.clock.advance(50)
        assert (await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})).status_code == 200
        clocked.clock.advance(30)  # 80 s after creation, 30 s after the last command
        await clocked.reconcile(reconciler.idle_pass)
        # the clock stands still until the next advance, so no pass (ours or the loop's) pauses it now
        assert (await http.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "running"
        assert ("pause", sid) not in clocked.host.calls
        clocked.clock.advance(31)
        await clocked.reconcile(reconciler.idle_pass)
        await clocked.status(http, sid, "paused")
        assert (await http.get(f"/v1/sandboxes/{busy}")).json()["data"]["status"] == "running", (
            "no timeout set: never auto-paused"
        )
