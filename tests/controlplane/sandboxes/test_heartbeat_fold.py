"""A heartbeat's fold of a dense host (issue #36, bench/fleet_sim.py): the rows it leaves as they are
are read as plain columns, and only those it changes are loaded whole, so a host of many idle
sandboxes costs its beat little; what the fold does to a row is unchanged."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import event

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.sandboxes import host_reports
from tests.controlplane.conftest import Clocked, user_client
from tests.controlplane.fakehost import HOST_BEAT

pytestmark = pytest.mark.db


async def test_a_beat_loads_whole_only_the_rows_it_changes(clocked: Clocked) -> None:
    _, api = await user_client(clocked)
    async with api:
        made = [
            (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
            for _ in range(4)
        ]
        clocked.clock.advance(host_reports.REPORT_GRACE_S + 1)  # past the grace after their boots
        vanished = made[0]
        beat = {
            **HOST_BEAT,
            "sandboxes": [
                {"id": sandbox_id, "status": "running", "oom_kills": 0, "last_activity_at": 1.0}
                for sandbox_id in made[1:]
            ],
        }
        me = asyncio.current_task()
        loaded: list[str] = []

        def on_load(target: Sandbox, _: object) -> None:
            if asyncio.current_task() is me:  # not the reconciler's passes, running beside
                loaded.append(target.id)

        event.listen(Sandbox, "load", on_load)
        try:
            await host_reports.apply_host_report(clocked.services, beat)
        finally:
            event.remove(Sandbox, "load", on_load)
        assert loaded == [vanished]
        shown = {
            sandbox_id: (await api.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"]
            for sandbox_id in made
        }
    assert shown == {vanished: "error", **{sandbox_id: "running" for sandbox_id in made[1:]}}
    assert all(clocked.services.activity.last_seen_s[sandbox_id] >= 1.0 for sandbox_id in made[1:])


async def test_a_beat_that_may_predate_a_boot_or_a_resume_leaves_the_sandbox_as_it_is(
    clocked: Clocked,
) -> None:
    """Within ``REPORT_GRACE_S`` of a sandbox's latest transition a beat may have been made before it:
    one that omits the sandbox, or calls it stopped, changes nothing; the same beat after the grace
    errors it. On both engines (SQLite hands the times back naive, PostgreSQL aware)."""
    _, api = await user_client(clocked)
    async with api:
        old, resumed = [
            (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
            for _ in range(2)
        ]
        assert (await api.post(f"/v1/sandboxes/{resumed}/pause")).status_code == 200
        clocked.clock.advance(host_reports.REPORT_GRACE_S + 1)
        assert (await api.post(f"/v1/sandboxes/{resumed}/resume")).status_code == 200
        clocked.clock.advance(host_reports.REPORT_GRACE_S - 2)
        # `old` booted a grace and more ago, `resumed` was resumed within it; `new` is made now.
        new = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        beat = {**HOST_BEAT, "sandboxes": [{"id": resumed, "status": "stopped", "oom_kills": 0}]}

        async def shown() -> dict[str, str]:
            return {
                sandbox_id: (await api.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"]
                for sandbox_id in (old, resumed, new)
            }

        await host_reports.apply_host_report(clocked.services, beat)
        assert await shown() == {old: "error", resumed: "running", new: "running"}
        clocked.clock.advance(host_reports.REPORT_GRACE_S + 1)
        await host_reports.apply_host_report(clocked.services, beat)
        assert await shown() == {old: "error", resumed: "error", new: "error"}
