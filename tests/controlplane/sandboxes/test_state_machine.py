"""The sandbox state machine: statuses on the wire, outcomes recorded only where a transition left the
row, and background work that is let go of once it ends (issue #13)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from paddock_controlplane.app import create_app
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import states
from paddock_controlplane.records.services import BackgroundTasks, Services
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.settings import ControlPlaneSettings
from tests.conftest import LiveServer
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, fake_hosts
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink

SHAPE = "s-1vcpu-1gb"


@dataclass
class Plane:
    api: httpx.AsyncClient
    services: Services
    host: FakeHostLink


@pytest.fixture
async def plane(cp_settings: ControlPlaneSettings, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Plane]:
    link = fake_hosts(monkeypatch)
    app = create_app(cp_settings)
    async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        beat = await http.post(
            "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
        )
        assert beat.status_code == 200
        _, key = await ControlPlane(url=server.url, settings=cp_settings, http=http).new_user("pro")
        http.headers["X-Api-Key"] = key
        yield Plane(http, app.state.services, link)


def test_statuses_are_the_wire_strings() -> None:
    assert json.dumps({"status": SandboxStatus.RUNNING}) == '{"status": "running"}'
    assert f"sandbox is {SandboxStatus.PAUSED}" == "sandbox is paused"
    assert SandboxStatus.DESTROYED == "destroyed" and "destroyed" in states.TERMINAL
    named = (states.TERMINAL, states.CLOSED, states.TRANSITIONAL, states.ON_HOST, states.BOOTED)
    assert all(set(group) <= set(states.ALL) for group in named)
    assert not set(states.TERMINAL) & set(states.TRANSITIONAL)


async def test_a_task_is_let_go_of_when_it_ends_whatever_the_outcome() -> None:
    tasks = BackgroundTasks()

    async def fails() -> None:
        raise RuntimeError("boom")

    async def succeeds() -> None:
        await asyncio.sleep(0)

    failing, passing = tasks.spawn(fails(), name="fails"), tasks.spawn(succeeds(), name="succeeds")
    assert tasks.running == {failing, passing}
    await tasks.drain()
    assert tasks.running == set()
    assert isinstance(failing.exception(), RuntimeError)


@pytest.mark.db
async def test_a_failed_boot_leaves_no_task_behind(plane: Plane) -> None:
    plane.host.fail_boot = True
    resp = await plane.api.post("/v1/sandboxes", json={"shape": SHAPE})
    assert resp.status_code == 500, resp.text
    await plane.services.tasks.drain()
    failed = (await plane.api.get("/v1/sandboxes", params={"status": "failed"})).json()["data"]["data"]
    assert len(failed) == 1
    # The cleanup ran (the host was asked to forget the sandbox) and its task is gone with it.
    assert ("destroy", failed[0]["id"]) in plane.host.calls
    assert plane.services.tasks.running == set()


@pytest.mark.db
async def test_a_destroy_that_overtakes_a_pause_wins(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = (await plane.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]["id"]
    at_host, release = asyncio.Event(), asyncio.Event()

    async def slow_pause(sandbox_id: str) -> None:
        plane.host.calls.append(("pause", sandbox_id))
        at_host.set()
        await release.wait()

    monkeypatch.setattr(plane.host, "pause", slow_pause)
    pausing = asyncio.create_task(plane.api.post(f"/v1/sandboxes/{sid}/pause"))
    await asyncio.wait_for(at_host.wait(), 10)
    assert (await plane.api.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "pausing"
    assert (await plane.api.delete(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "destroying"
    release.set()
    paused = (await pausing).json()["data"]
    # The pause's outcome is not written over the destroy: no paused_at, never "paused" again.
    assert paused["status"] in ("destroying", "destroyed") and "paused_at" not in paused
    await plane.services.tasks.drain()
    final = (await plane.api.get(f"/v1/sandboxes/{sid}")).json()["data"]
    assert final["status"] == "destroyed" and "paused_at" not in final


@pytest.mark.db
async def test_concurrent_pauses_call_the_host_once(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pause claims the row with one conditional UPDATE (transition.claim): of pauses racing for one
    # running sandbox exactly one gets it and calls the host; the others are told what it is now.
    sid = (await plane.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]["id"]
    at_host, release = asyncio.Event(), asyncio.Event()

    async def slow_pause(sandbox_id: str) -> None:
        plane.host.calls.append(("pause", sandbox_id))
        at_host.set()
        await release.wait()

    monkeypatch.setattr(plane.host, "pause", slow_pause)
    first = asyncio.create_task(plane.api.post(f"/v1/sandboxes/{sid}/pause"))
    await asyncio.wait_for(at_host.wait(), 10)
    others = await asyncio.gather(*(plane.api.post(f"/v1/sandboxes/{sid}/pause") for _ in range(3)))
    assert [r.status_code for r in others] == [409, 409, 409]
    assert {r.json()["data"]["message"] for r in others} == {
        "sandbox is pausing; only a running sandbox can be paused"
    }
    release.set()
    assert (await first).json()["data"]["status"] == "paused"
    assert plane.host.calls.count(("pause", sid)) == 1
    resumed = await asyncio.gather(*(plane.api.post(f"/v1/sandboxes/{sid}/resume") for _ in range(3)))
    assert sorted(r.status_code for r in resumed) == [200, 409, 409]
    assert plane.host.calls.count(("resume", sid)) == 1


@pytest.mark.db
async def test_a_host_failure_is_recorded_with_its_reason(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = (await plane.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]["id"]

    async def no_room(sandbox_id: str, *, disk_mib: int) -> None:
        raise hostlink.CapacityError("host is full")

    async def broken(sandbox_id: str, *, disk_mib: int = 0) -> None:
        raise hostlink.HostError("runtime exploded")

    # Resume refused for capacity: 503, and the sandbox stays paused, intact.
    assert (await plane.api.post(f"/v1/sandboxes/{sid}/pause")).status_code == 200
    monkeypatch.setattr(plane.host, "resume", no_room)
    refused = await plane.api.post(f"/v1/sandboxes/{sid}/resume")
    assert refused.status_code == 503, refused.text
    assert (await plane.api.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "paused"
    # Any other failure of the host: the sandbox is in error, and says why.
    monkeypatch.setattr(plane.host, "resume", broken)
    failed = (await plane.api.post(f"/v1/sandboxes/{sid}/resume")).json()["data"]
    assert failed["status"] == "error" and failed["status_reason"] == "resume failed on the host"
    other = (await plane.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]["id"]
    monkeypatch.setattr(plane.host, "pause", broken)
    failed = (await plane.api.post(f"/v1/sandboxes/{other}/pause")).json()["data"]
    assert failed["status"] == "error" and failed["status_reason"] == "pause failed on the host"
    assert (await plane.api.get(f"/v1/sandboxes/{other}")).json()["data"]["status"] == "error"


@pytest.mark.db
async def test_a_resize_the_host_has_no_disk_for_is_a_retryable_503_that_changes_nothing(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = (await plane.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]["id"]
    before = (await plane.api.get(f"/v1/sandboxes/{sid}")).json()["data"]["disk_mib"]

    async def no_disk(sandbox_id: str, disk_mib: int) -> None:
        raise hostlink.CapacityError("1596 MiB requested, 1382 MiB free (disk: ...)")

    monkeypatch.setattr(plane.host, "resize", no_disk)
    refused = await plane.api.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": before + 1024})
    assert refused.status_code == 503, refused.text
    assert refused.headers.get("retry-after"), refused.headers
    assert "1382 MiB free" in refused.json()["message"]
    view = (await plane.api.get(f"/v1/sandboxes/{sid}")).json()["data"]
    assert view["status"] == "running" and view["disk_mib"] == before
