"""A create or fork whose control plane died before its host answered: once no live process could still
record it, the reconciler asks the host. A sandbox the host booted is adopted as the boot would have
recorded it; one it does not hold ends ``failed``, releases its slot, and whatever the host has of it is
destroyed.

The dead process is simulated by moving a booted row back to ``creating``/``forking`` with the columns
only its second transaction writes cleared (the state a process leaves when it dies between its two
transactions), and the clock past the boot deadline; the pass is run by this control plane, which never
saw the row before (as one started after the dead one). tests/multihost shows it with a control plane
really SIGKILLed mid-create.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select, update

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Host, Sandbox, WebhookDelivery
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_controlplane.workers import reconciler
from paddock_core.db import transaction
from tests.controlplane.conftest import Clocked, user_client

SHAPE = "s-1vcpu-256mb"


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # Webhook deliveries go to a closed loopback port; the tests read the outbox, not a receiver.
    return cp_settings.model_copy(update={"webhook_allow_private_targets": True})


async def _left_in(clocked: Clocked, sandbox_id: str, status: str, **values: object) -> None:
    """The row as a process that died before recording the boot leaves it."""
    unrecorded = {"ip": None, "running_at": None, "paused_at": None, "billed_until": None, "spawn_ms": None}
    async with transaction(clocked.services.sessions) as session:
        await session.execute(
            update(Sandbox).where(Sandbox.id == sandbox_id).values(status=status, **{**unrecorded, **values})
        )


async def _create(http: httpx.AsyncClient, **body: object) -> str:
    made = await http.post("/v1/sandboxes", json={"shape": SHAPE, **body})
    assert made.status_code == 200, made.text
    return str(made.json()["data"]["id"])


async def _events(clocked: Clocked, action: str, sandbox_id: str) -> int:
    async with clocked.services.sessions() as session:
        count = await session.scalar(
            select(func.count())
            .select_from(WebhookDelivery)
            .where(WebhookDelivery.event_action == action, WebhookDelivery.payload.contains(sandbox_id))
        )
    return int(count or 0)


def _past_the_deadline(clocked: Clocked) -> None:
    clocked.clock.advance(clocked.services.settings.boot_timeout_s + reconciler.ORPHAN_AFTER_S + 1)


async def test_a_boot_its_host_finished_is_adopted_as_the_boot_would_have_recorded_it(
    clocked: Clocked,
) -> None:
    _, http = await user_client(clocked)
    async with http:
        hook = await http.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"})
        assert hook.status_code == 200, hook.text
        created = await _create(http)
        paused = await _create(http, start_paused=True)
        forked = (await http.post(f"/v1/sandboxes/{created}/fork", json={})).json()["data"]["id"]
        await clocked.status(http, forked, "running")
        for sandbox_id, status in ((created, "creating"), (paused, "creating"), (forked, "forking")):
            await _left_in(clocked, sandbox_id, status)
        events_before = {s: await _events(clocked, "sandbox.create", s) for s in (created, paused, forked)}
        # A PUT while the boot ran is stored only: the adopted sandbox's host gets it then.
        put = await http.put(f"/v1/sandboxes/{created}/egress", json={"egress": ["10.1.2.3/32:443"]})
        assert put.status_code == 200, put.text
        _past_the_deadline(clocked)
        clocked.host.calls.clear()

        await clocked.reconcile(reconciler.OrphanedBoots())

        for sandbox_id, wanted in ((created, "running"), (paused, "paused"), (forked, "running")):
            view = (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
            assert view["status"] == wanted, view
            assert view["ip"] == clocked.host.held[sandbox_id].ip
        assert not [c for c in clocked.host.calls if c[0] == "destroy"]
        assert clocked.host.egress[created] == ["10.1.2.3/32:443"]
        # The create's event, written once; a fork's child had its sandbox.fork when it was answered.
        assert await _events(clocked, "sandbox.create", created) == events_before[created] + 1
        assert await _events(clocked, "sandbox.create", paused) == events_before[paused] + 1
        assert await _events(clocked, "sandbox.create", forked) == events_before[forked] == 0
        ran = await http.post(f"/v1/sandboxes/{created}/exec", json={"cmd": "echo", "args": ["adopted"]})
        assert ran.status_code == 200 and ran.json()["data"]["result"]["stdout"] == "echo adopted\n", ran.text

        # A second pass, or a second control plane, finds nothing left to settle.
        await clocked.reconcile(reconciler.OrphanedBoots())
        assert await _events(clocked, "sandbox.create", created) == events_before[created] + 1


async def test_a_boot_its_host_does_not_hold_ends_failed_releases_its_slot_and_is_destroyed(
    clocked: Clocked,
) -> None:
    _, key = await clocked.cp.new_user("free", credits=500)  # one sandbox at a time
    async with httpx.AsyncClient(base_url=clocked.cp.url, headers={"X-API-Key": key}, timeout=30) as http:
        lost = await _create(http)
        await _left_in(clocked, lost, "creating")
        stopped = clocked.host.held.pop(lost)
        refused = await http.post("/v1/sandboxes", json={"shape": SHAPE})
        assert refused.status_code == 403, refused.text  # the boot in flight holds the one slot
        _past_the_deadline(clocked)
        clocked.host.calls.clear()

        await clocked.reconcile(reconciler.OrphanedBoots())

        view = (await http.get(f"/v1/sandboxes/{lost}")).json()["data"]
        assert view["status"] == "failed", view
        assert view["status_reason"] == reconciler.ORPHANED_BOOT_REASON
        assert ("inspect", lost) in clocked.host.calls and ("destroy", lost) in clocked.host.calls
        again = await _create(http)  # the slot is free again

        # A host holding it stopped (its boot broke after the asker died) fails it the same way.
        await _left_in(clocked, again, "creating")
        clocked.host.held[again] = type(stopped)(status="stopped", ip=stopped.ip)
        _past_the_deadline(clocked)
        await clocked.reconcile(reconciler.OrphanedBoots())
        assert (await http.get(f"/v1/sandboxes/{again}")).json()["data"]["status"] == "failed"
        assert again not in clocked.host.held  # destroyed there


async def test_a_boot_is_left_alone_within_its_deadline_and_while_its_host_does_not_answer(
    clocked: Clocked,
) -> None:
    _, http = await user_client(clocked)
    async with http:
        sandbox_id = await _create(http)
        await _left_in(clocked, sandbox_id, "creating", created_at=clocked.clock())
        clocked.clock.advance(clocked.services.settings.boot_timeout_s)
        await clocked.reconcile(reconciler.OrphanedBoots())
        # Within its deadline a boot may still be recorded by the process that runs it: not even asked.
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "creating"
        assert ("inspect", sandbox_id) not in clocked.host.calls

        async def unreachable(sandbox_id: str) -> None:
            raise hostlink.HostError("connection refused")

        setattr(clocked.host, "inspect", unreachable)  # noqa: B010
        _past_the_deadline(clocked)
        await clocked.reconcile(reconciler.OrphanedBoots())
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "creating"
        delattr(clocked.host, "inspect")
        await clocked.reconcile(reconciler.OrphanedBoots())  # the host answers again: adopted
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "running"


async def test_a_template_boot_is_given_its_image_fetch_as_well(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        sandbox_id = await _create(http)
        await _left_in(clocked, sandbox_id, "creating", rootfs="tpl_0123456789abcdef")
        clocked.host.held.pop(sandbox_id)
        _past_the_deadline(clocked)
        await clocked.reconcile(reconciler.OrphanedBoots())
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "creating"
        clocked.clock.advance(reconciler.IMAGE_FETCH_BOUND_S)
        await clocked.reconcile(reconciler.OrphanedBoots())
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "failed"


async def test_a_boot_on_a_vm_host_is_given_the_vm_deadline(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        sandbox_id = await _create(http)
        async with transaction(clocked.services.sessions) as session:
            row = await session.get(Sandbox, sandbox_id)
            assert row is not None and row.host_id is not None
            await session.execute(
                update(Host).where(Host.id == row.host_id).values(labels={"paddock.io/runtime": "qemu"})
            )
        await _left_in(clocked, sandbox_id, "creating")
        clocked.host.held.pop(sandbox_id)
        _past_the_deadline(clocked)
        await clocked.reconcile(reconciler.OrphanedBoots())
        # Past a container's deadline, a VM's boot may still be recorded by the process running it.
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "creating"
        assert ("inspect", sandbox_id) not in clocked.host.calls
        settings = clocked.services.settings
        clocked.clock.advance(settings.vm_boot_timeout_s - settings.boot_timeout_s)
        await clocked.reconcile(reconciler.OrphanedBoots())
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "failed"
