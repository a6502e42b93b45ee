"""The control plane's side of hibernation on SQLite and PostgreSQL, with the fake host (the unit seam;
tests/hibernation/test_hibernation_live.py drives the same paths on a real host): what the row, the view
and the webhook outbox say after a hibernate and a wake, the reconciler's auto-hibernate, and a
hibernate whose host died mid-way settled from what the host holds."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.workers import reconciler
from tests.controlplane.conftest import Clocked, clocked, cp_settings, user_client

__all__ = ["clocked", "cp_settings"]

pytestmark = pytest.mark.db

SHAPE = "s-1vcpu-1gb"


@pytest.fixture
async def setup(clocked: Clocked) -> AsyncIterator[tuple[Clocked, httpx.AsyncClient]]:
    host = clocked.host
    woken: list[str] = []

    async def hibernate(sandbox_id: str) -> None:
        host.calls.append(("hibernate", sandbox_id))
        if getattr(host, "lose_hibernate", False):
            raise hostlink.HostLostError("connection reset")

    async def wake(sandbox_id: str) -> hostlink.Booted:
        host.calls.append(("wake", sandbox_id))
        woken.append(sandbox_id)
        return hostlink.Booted(ip=f"10.0.9.{len(woken)}", spawn_ms=50.0)

    host.hibernate = hibernate  # type: ignore[attr-defined]
    host.wake = wake  # type: ignore[attr-defined]
    user_id, http = await user_client(clocked)
    await clocked.subscribe(user_id, "sandbox.pause", "sandbox.resume")
    async with http:
        yield clocked, http


async def _sandbox(http: httpx.AsyncClient) -> str:
    made = await http.post("/v1/sandboxes", json={"shape": SHAPE})
    assert made.status_code == 200, made.text
    return str(made.json()["data"]["id"])


async def test_a_hibernate_and_a_wake_on_the_row_the_view_and_the_events(
    setup: tuple[Clocked, httpx.AsyncClient],
) -> None:
    clocked, http = setup
    sandbox_id = await _sandbox(http)
    paused = await http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": False})
    assert paused.status_code == 200, paused.text
    view = paused.json()["data"]
    assert view["status"] == "paused" and view["hibernated"] is True
    assert ("hibernate", sandbox_id) in clocked.host.calls and ("pause", sandbox_id) not in clocked.host.calls

    resumed = await http.post(f"/v1/sandboxes/{sandbox_id}/resume")
    assert resumed.status_code == 200, resumed.text
    view = resumed.json()["data"]
    assert view["status"] == "running" and "hibernated" not in view and view["ip"] == "10.0.9.1"
    assert ("wake", sandbox_id) in clocked.host.calls and ("resume", sandbox_id) not in clocked.host.calls

    # A pause with no body is the frozen pause, and its resume no wake.
    assert (await http.post(f"/v1/sandboxes/{sandbox_id}/pause")).json()["data"].get("hibernated") is None
    assert (await http.post(f"/v1/sandboxes/{sandbox_id}/resume")).status_code == 200
    assert clocked.host.calls.count(("wake", sandbox_id)) == 1

    pauses = [e for e in await clocked.events_of("sandbox.pause") if e["sandbox_id"] == sandbox_id]
    assert [e.get("hibernated") for e in pauses] == [True, None]
    resumes = [e for e in await clocked.events_of("sandbox.resume") if e["sandbox_id"] == sandbox_id]
    assert [e.get("hibernated") for e in resumes] == [True, None]


async def test_a_frozen_pause_asked_to_is_hibernated_by_the_reconciler(
    setup: tuple[Clocked, httpx.AsyncClient],
) -> None:
    clocked, http = setup
    sandbox_id = await _sandbox(http)
    too_soon = await http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"hibernate_after_seconds": 5})
    assert too_soon.status_code == 400 and "hibernate_after_seconds" in too_soon.text
    paused = await http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"hibernate_after_seconds": 600})
    assert paused.json()["data"]["auto_hibernate_after_seconds"] == 600
    clocked.clock.advance(599)
    await clocked.reconcile(reconciler.auto_hibernate_pass)
    assert ("hibernate", sandbox_id) not in clocked.host.calls
    clocked.clock.advance(2)
    await clocked.reconcile(reconciler.auto_hibernate_pass)
    view = (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
    assert view["status"] == "paused" and view["hibernated"] is True
    assert "auto_hibernate_after_seconds" not in view
    assert (await http.post(f"/v1/sandboxes/{sandbox_id}/resume")).status_code == 200


async def test_a_hibernate_whose_host_died_is_settled_from_what_the_host_holds(
    setup: tuple[Clocked, httpx.AsyncClient],
) -> None:
    clocked, http = setup
    sandbox_id = await _sandbox(http)
    clocked.host.lose_hibernate = True  # type: ignore[attr-defined]
    answer = await http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": False})
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["status"] == "pausing"  # not known yet: the reconciler asks the host
    clocked.host.held[sandbox_id] = hostlink.Held(status="paused", ip="", hibernated=True)
    orphans = reconciler.OrphanedTransitions()
    await clocked.reconcile(orphans)
    clocked.clock.advance(reconciler.ORPHAN_AFTER_S + 1)
    await clocked.reconcile(orphans)
    view = (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
    assert view["status"] == "paused" and view["hibernated"] is True
    assert ("pause", sandbox_id) not in clocked.host.calls  # it was not frozen on top


async def test_keep_memory_must_be_a_boolean(setup: tuple[Clocked, httpx.AsyncClient]) -> None:
    _, http = setup
    sandbox_id = await _sandbox(http)
    for body in (
        {"keep_memory": "false"},
        {"keep_memory": 0},
        {"keep_memory": None, "hibernate_after_seconds": "x"},
    ):
        answer = await http.post(f"/v1/sandboxes/{sandbox_id}/pause", json=body)
        assert answer.status_code == 400, answer.text
    bad = await http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": "no"})
    assert bad.json()["status"] == "fail" and "keep_memory" in json.dumps(bad.json()["data"])
    assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "running"
