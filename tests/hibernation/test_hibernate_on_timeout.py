"""A timeout and an idle pause that hibernate (issues #33, #34), on SQLite and PostgreSQL with the fake
host (the unit seam; tests/e2b/test_api_hibernate.py runs a timeout that hibernates on a real host):
``on_timeout: hibernate`` at create and through the timeout route, ``on_idle: hibernate`` at create and by PATCH, each hibernating
the sandbox at its moment (the host asked to hibernate, not to freeze); a VM host's sandbox refused with
a 409 naming the field; a hibernation its host turns down at the moment becomes a frozen pause."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import update

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Host
from paddock_controlplane.sandboxes import lifecycle
from paddock_controlplane.workers import reconciler
from paddock_core.db import transaction
from tests.controlplane.conftest import Clocked, clocked, cp_settings
from tests.hibernation.test_hibernation_records import SHAPE, _sandbox, setup

__all__ = ["clocked", "cp_settings", "setup"]

pytestmark = pytest.mark.db

Setup = tuple[Clocked, httpx.AsyncClient]


async def _create(http: httpx.AsyncClient, **fields: object) -> str:
    made = await http.post("/v1/sandboxes", json={"shape": SHAPE, **fields})
    assert made.status_code == 200, made.text
    return str(made.json()["data"]["id"])


async def _view(http: httpx.AsyncClient, sandbox_id: str) -> dict[str, object]:
    answer = await http.get(f"/v1/sandboxes/{sandbox_id}")
    assert answer.status_code == 200, answer.text
    data: dict[str, object] = answer.json()["data"]
    return data


async def _on_the_vm_tier(clocked: Clocked, runtime: str = "qemu") -> None:
    async with transaction(clocked.services.sessions) as session:
        await session.execute(
            update(Host).values(labels={"paddock.io/isolation": "vm", "paddock.io/runtime": runtime})
        )


async def test_a_timeout_that_hibernates(setup: Setup) -> None:
    clocked, http = setup
    at_create = await _create(http, timeout_s=60, on_timeout="hibernate")
    assert (await _view(http, at_create))["on_timeout"] == "hibernate"
    later = await _sandbox(http)
    answer = await http.post(
        f"/v1/sandboxes/{later}/timeout", json={"timeout_s": 90, "on_timeout": "hibernate"}
    )
    assert answer.status_code == 200 and answer.json()["data"]["on_timeout"] == "hibernate", answer.text

    clocked.clock.advance(61)
    await clocked.reconcile(lifecycle.expire_pass)
    view = await _view(http, at_create)
    assert view["status"] == "paused" and view["hibernated"] is True and "end_at" not in view
    assert (await _view(http, later))["status"] == "running"
    clocked.clock.advance(30)
    await clocked.reconcile(lifecycle.expire_pass)
    assert (await _view(http, later))["hibernated"] is True
    for sandbox_id in (at_create, later):
        assert ("hibernate", sandbox_id) in clocked.host.calls
        assert ("pause", sandbox_id) not in clocked.host.calls  # not frozen: only its disk is kept
    pauses = [e for e in await clocked.events_of("sandbox.pause") if e["sandbox_id"] == at_create]
    assert [(e.get("hibernated"), e.get("reason")) for e in pauses] == [(True, "timeout")]

    # Woken, it runs again with its lifetime's choice kept (the E2B connect sets a new end).
    assert (await http.post(f"/v1/sandboxes/{at_create}/resume")).status_code == 200
    assert (await _view(http, at_create))["on_timeout"] == "hibernate"


async def test_an_idle_pause_that_hibernates(setup: Setup) -> None:
    clocked, http = setup
    at_create = await _create(http, auto_pause_after_seconds=60, on_idle="hibernate")
    assert (await _view(http, at_create))["on_idle"] == "hibernate"
    frozen = await _create(http, auto_pause_after_seconds=60)
    assert "on_idle" not in await _view(http, frozen)
    patched = await _create(http, auto_pause_after_seconds=60)
    answer = await http.patch(f"/v1/sandboxes/{patched}", json={"on_idle": "hibernate"})
    assert answer.status_code == 200 and answer.json()["data"]["on_idle"] == "hibernate", answer.text

    clocked.clock.advance(61)
    await clocked.reconcile(reconciler.idle_pass)
    for sandbox_id in (at_create, patched):
        view = await _view(http, sandbox_id)
        assert view["status"] == "paused" and view["hibernated"] is True, view
        assert ("pause", sandbox_id) not in clocked.host.calls
    view = await _view(http, frozen)  # no on_idle: the frozen pause it always was
    assert view["status"] == "paused" and "hibernated" not in view
    assert ("pause", frozen) in clocked.host.calls and ("hibernate", frozen) not in clocked.host.calls
    pauses = [e for e in await clocked.events_of("sandbox.pause") if e["sandbox_id"] == at_create]
    assert [(e.get("hibernated"), e.get("reason")) for e in pauses] == [(True, "idle")]


async def test_bad_values_are_400_naming_the_field(setup: Setup) -> None:
    _, http = setup
    for body, field in (
        ({"timeout_s": 60, "on_timeout": "sleep"}, "on_timeout"),
        ({"on_idle": "freeze"}, "on_idle"),
        ({"on_idle": True}, "on_idle"),
    ):
        answer = await http.post("/v1/sandboxes", json={"shape": SHAPE, **body})
        assert answer.status_code == 400 and field in answer.text, (body, answer.text)
    sandbox_id = await _sandbox(http)
    answer = await http.patch(f"/v1/sandboxes/{sandbox_id}", json={"on_idle": "sleep"})
    assert answer.status_code == 400 and "on_idle" in answer.text, answer.text


async def test_a_host_that_cannot_hibernate_refuses_it_naming_the_field(setup: Setup) -> None:
    clocked, http = setup
    running = await _sandbox(http)
    await _on_the_vm_tier(clocked)  # QEMU hibernates a VM with its memory (docs/hibernation.md)
    answer = await http.post(
        "/v1/sandboxes", json={"shape": SHAPE, "timeout_s": 60, "on_timeout": "hibernate"}
    )
    assert answer.status_code == 200, answer.text
    await _on_the_vm_tier(clocked, "firecracker")  # a runtime the control plane does not know to hibernate
    listed = (await http.get("/v1/sandboxes")).json()["data"]
    for body, field in (
        ({"timeout_s": 60, "on_timeout": "hibernate"}, "on_timeout"),
        ({"auto_pause_after_seconds": 60, "on_idle": "hibernate"}, "on_idle"),
    ):
        answer = await http.post("/v1/sandboxes", json={"shape": SHAPE, **body})
        assert answer.status_code == 409, answer.text
        message = answer.json()["data"]["message"]
        assert message.startswith(f"{field}:") and "vm isolation tier" in message, message
    assert (await http.get("/v1/sandboxes")).json()["data"] == listed  # nothing was made
    answer = await http.post(
        f"/v1/sandboxes/{running}/timeout", json={"timeout_s": 60, "on_timeout": "hibernate"}
    )
    assert answer.status_code == 409 and answer.json()["data"]["message"].startswith("on_timeout:"), (
        answer.text
    )
    answer = await http.patch(f"/v1/sandboxes/{running}", json={"on_idle": "hibernate"})
    assert answer.status_code == 409 and answer.json()["data"]["message"].startswith("on_idle:"), answer.text
    assert "on_timeout" not in await _view(http, running)
    # A frozen pause at the timeout stays open to it.
    answer = await http.post(
        f"/v1/sandboxes/{running}/timeout", json={"timeout_s": 60, "on_timeout": "pause"}
    )
    assert answer.status_code == 200, answer.text


async def test_a_hibernation_turned_down_at_the_moment_is_a_frozen_pause(setup: Setup) -> None:
    clocked, http = setup
    sandbox_id = await _create(http, timeout_s=60, on_timeout="hibernate")

    async def refuse(sandbox_id: str) -> None:  # as a gVisor host that has since mounted an S3 disk
        clocked.host.calls.append(("hibernate", sandbox_id))
        raise hostlink.TierRefusedError("hibernating a sandbox with S3 disks is not supported on gVisor")

    clocked.host.hibernate = refuse  # type: ignore[attr-defined]
    clocked.clock.advance(61)
    await clocked.reconcile(lifecycle.expire_pass)
    view = await _view(http, sandbox_id)
    assert view["status"] == "paused" and "hibernated" not in view, view
    assert ("hibernate", sandbox_id) in clocked.host.calls and ("pause", sandbox_id) in clocked.host.calls
