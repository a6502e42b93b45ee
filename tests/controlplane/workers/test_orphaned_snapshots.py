"""A snapshot whose control plane died between writing its row ``creating`` and recording its host's
answer: once no live process could still record it, the reconciler asks the host. A snapshot the host
holds whole becomes ``ready`` with its size and its ``snapshot.create``; one it does not hold is removed
there (with its volume copies) and its row goes, as a failed create's, which frees its place under the
plan's cap. A host that does not answer leaves the row for a later pass, unless it has been dead for
an hour: then the row goes without asking it.

The dead process is simulated by moving a taken snapshot's row back to ``creating`` with the columns only
the create's last transaction writes cleared (what a process killed between the two leaves), and the
clock past the bound; the pass is a fresh one, as in a control plane started after the dead one.
tests/integration/test_orphaned_snapshot_live.py shows it with a control plane really SIGKILLed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Host, WebhookDelivery
from paddock_controlplane.records.snapshots import Snapshot, SnapshotVolume
from paddock_controlplane.resources import snapshots
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_controlplane.workers import reconciler
from paddock_core.db import transaction
from paddock_hostagent.schemas import SnapshotView, VolumeView
from tests.controlplane.conftest import Clocked
from tests.controlplane.resources.test_snapshot_volumes_api import COPY_BYTES, DISK_BYTES, FakeSnapshotHost
from tests.controlplane.resources.test_volumes_api import fail, ok

SHAPE = "s-1vcpu-256mb"


class KeeperHost(FakeSnapshotHost):
    """The fake snapshot host, answering whether it holds a snapshot or a volume as a host agent does
    (``GET /internal/v1/snapshots/{id}``, ``GET /internal/v1/volumes/{id}``)."""

    def __init__(self) -> None:
        super().__init__()
        self.answering = True

    async def held_snapshot(self, snapshot_id: str) -> SnapshotView | None:
        self.calls.append(("held_snapshot", snapshot_id))
        if not self.answering:
            raise hostlink.HostError("connection refused")
        if snapshot_id not in self.snapshots:
            return None
        return SnapshotView(
            id=snapshot_id,
            image="debian:13",
            fs="xfs",
            disk_mib=2048,
            source_id="",
            created_at=0.0,
            size_bytes=DISK_BYTES,
        )

    async def held_volume(self, volume_id: str) -> VolumeView | None:
        self.calls.append(("held_volume", volume_id))
        if volume_id not in self.volumes:
            return None
        return VolumeView(id=volume_id, size_mib=self.volumes[volume_id], used_bytes=COPY_BYTES)


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # Webhook deliveries go to a closed loopback port; the tests read the outbox, not a receiver.
    return cp_settings.model_copy(update={"webhook_allow_private_targets": True})


@pytest.fixture
def host(clocked: Clocked, monkeypatch: pytest.MonkeyPatch) -> KeeperHost:
    link = KeeperHost()

    async def for_host(services: object, host_id: str | None) -> KeeperHost:
        return link

    monkeypatch.setattr(hostlink, "for_host", for_host)
    return link


async def _client(clocked: Clocked, plan: str) -> httpx.AsyncClient:
    _, key = await clocked.cp.new_user(plan, credits=500)
    return httpx.AsyncClient(base_url=clocked.cp.url, headers={"X-API-Key": key}, timeout=30)


async def _snapshot_with_a_volume(http: httpx.AsyncClient) -> dict[str, Any]:
    ok(await http.post("/v1/volumes", json={"name": "data", "size_mib": 512}))
    made = await http.post(
        "/v1/sandboxes",
        json={"shape": SHAPE, "volumes": [{"volume_id": "data", "mount_path": "/data"}]},
    )
    source = ok(made)
    return dict(
        ok(await http.post(f"/v1/sandboxes/{source['id']}/snapshots", json={"include_volumes": True}))
    )


async def _left_creating(clocked: Clocked, snapshot_id: str) -> None:
    """The rows as a process killed before recording its host's answer leaves them."""
    async with transaction(clocked.services.sessions) as session:
        await session.execute(
            update(Snapshot)
            .where(Snapshot.id == snapshot_id)
            .values(status="creating", size_bytes=0, created_at=clocked.clock())
        )
        await session.execute(
            update(SnapshotVolume).where(SnapshotVolume.snapshot_id == snapshot_id).values(used_bytes=0)
        )


async def _plain_snapshot_left_creating(clocked: Clocked, http: httpx.AsyncClient) -> dict[str, Any]:
    """A snapshot without volumes, of a new sandbox, left ``creating`` as a killed process leaves it."""
    source = ok(await http.post("/v1/sandboxes", json={"shape": SHAPE}))
    snap = dict(ok(await http.post(f"/v1/sandboxes/{source['id']}/snapshots", json={})))
    await _left_creating(clocked, snap["id"])
    return snap


async def _copies(clocked: Clocked, snapshot_id: str) -> list[str]:
    async with clocked.services.sessions() as session:
        rows = await session.scalars(
            select(SnapshotVolume.volume_id).where(SnapshotVolume.snapshot_id == snapshot_id)
        )
        return list(rows.all())


async def _events(clocked: Clocked, snapshot_id: str) -> int:
    async with clocked.services.sessions() as session:
        count = await session.scalar(
            select(func.count())
            .select_from(WebhookDelivery)
            .where(
                WebhookDelivery.event_action == "snapshot.create",
                WebhookDelivery.payload.contains(snapshot_id),
            )
        )
    return int(count or 0)


async def test_a_snapshot_its_host_does_not_hold_is_removed_there_and_frees_its_place_under_the_cap(
    clocked: Clocked, host: KeeperHost
) -> None:
    async with await _client(clocked, "free") as http:  # the free plan keeps one snapshot
        snap = await _snapshot_with_a_volume(http)
        [copy_id] = await _copies(clocked, snap["id"])
        await _left_creating(clocked, snap["id"])
        host.snapshots.discard(snap["id"])  # its agent removed the half-written copy; the volume's stays
        source_id = snap["source_sandbox_id"]

        # Left so, it is listed, holds the plan's one place, and cannot be deleted or booted.
        [listed] = ok(await http.get("/v1/snapshots"))["data"]
        assert listed["status"] == "creating"
        refused = await http.post(f"/v1/sandboxes/{source_id}/snapshots", json={})
        fail(refused, 403, "QUOTA_EXCEEDED")
        assert "being made" in fail(await http.delete(f"/v1/snapshots/{snap['id']}"), 409, "INVALID_STATE")

        # Past a plain snapshot's bound but not one that copies a volume first: not even asked.
        clocked.clock.advance(reconciler.snapshot_orphaned_after_s(0) + 1)
        await clocked.reconcile(reconciler.OrphanedSnapshots())
        assert ok(await http.get(f"/v1/snapshots/{snap['id']}"))["status"] == "creating"
        assert ("held_snapshot", snap["id"]) not in host.calls

        clocked.clock.advance(reconciler.snapshot_orphaned_after_s(1))
        await clocked.reconcile(reconciler.OrphanedSnapshots())

        fail(await http.get(f"/v1/snapshots/{snap['id']}"), 404, "NOT_FOUND")
        assert ok(await http.get("/v1/snapshots"))["data"] == []
        assert ("delete_snapshot", snap["id"]) in host.calls and ("delete_volume", copy_id) in host.calls
        assert copy_id not in host.volumes and await _copies(clocked, snap["id"]) == []
        assert await _events(clocked, snap["id"]) == 0  # a failed create announces nothing
        again = ok(await http.post(f"/v1/sandboxes/{source_id}/snapshots", json={}))  # its place is free
        assert again["status"] == "ready"


async def test_a_snapshot_its_host_holds_whole_is_ready_with_its_size_and_its_event(
    clocked: Clocked, host: KeeperHost
) -> None:
    async with await _client(clocked, "pro") as http:
        ok(await http.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"}))
        snap = await _snapshot_with_a_volume(http)
        events = await _events(clocked, snap["id"])
        await _left_creating(clocked, snap["id"])
        booting = await http.post("/v1/sandboxes", json={"shape": SHAPE, "rootfs": snap["id"]})
        assert "creating" in fail(booting, 409, "INVALID_STATE")

        clocked.clock.advance(reconciler.snapshot_orphaned_after_s(1) + 1)
        await clocked.reconcile(reconciler.OrphanedSnapshots())

        view = ok(await http.get(f"/v1/snapshots/{snap['id']}"))
        assert view["status"] == "ready" and view["size_bytes"] == DISK_BYTES + COPY_BYTES
        assert view["volumes"] == snap["volumes"]
        assert not [call for call in host.calls if call[0] in ("delete_snapshot", "delete_volume")]
        assert await _events(clocked, snap["id"]) == events + 1
        booted = ok(await http.post("/v1/sandboxes", json={"shape": SHAPE, "rootfs": snap["id"]}))
        assert booted["status"] == "running"

        # Another pass, or another control plane, finds nothing left to settle.
        await clocked.reconcile(reconciler.OrphanedSnapshots())
        assert await _events(clocked, snap["id"]) == events + 1


async def test_a_snapshot_is_left_as_it_is_while_its_host_does_not_answer(
    clocked: Clocked, host: KeeperHost
) -> None:
    async with await _client(clocked, "pro") as http:
        snap = await _plain_snapshot_left_creating(clocked, http)
        host.snapshots.discard(snap["id"])
        host.answering = False

        clocked.clock.advance(reconciler.snapshot_orphaned_after_s(0) + 1)
        await clocked.reconcile(reconciler.OrphanedSnapshots())
        assert ("held_snapshot", snap["id"]) in host.calls
        assert ok(await http.get(f"/v1/snapshots/{snap['id']}"))["status"] == "creating"
        assert ("delete_snapshot", snap["id"]) not in host.calls

        host.answering = True  # it answers again: settled on the next pass
        await clocked.reconcile(reconciler.OrphanedSnapshots())
        fail(await http.get(f"/v1/snapshots/{snap['id']}"), 404, "NOT_FOUND")
        assert ("delete_snapshot", snap["id"]) in host.calls


async def test_a_snapshot_whose_host_is_dead_for_good_is_given_up_without_asking_it(
    clocked: Clocked, host: KeeperHost
) -> None:
    async with await _client(clocked, "pro") as http:
        snap = await _plain_snapshot_left_creating(clocked, http)
        host.answering = False
        async with transaction(clocked.services.sessions) as session:
            await session.execute(update(Host).values(status="dead", last_heartbeat_at=clocked.clock()))

        # Dead, but not for long: it may come back from a restart, so it is still asked.
        clocked.clock.advance(reconciler.snapshot_orphaned_after_s(0) + 1)
        await clocked.reconcile(reconciler.OrphanedSnapshots())
        assert ok(await http.get(f"/v1/snapshots/{snap['id']}"))["status"] == "creating"
        assert host.calls.count(("held_snapshot", snap["id"])) == 1

        clocked.clock.advance(snapshots.SNAPSHOT_HOST_GONE_S)
        await clocked.reconcile(reconciler.OrphanedSnapshots())
        fail(await http.get(f"/v1/snapshots/{snap['id']}"), 404, "NOT_FOUND")
        assert host.calls.count(("held_snapshot", snap["id"])) == 1, "a host gone is not asked"
        assert await _events(clocked, snap["id"]) == 0
        assert ok(await http.get("/v1/snapshots"))["data"] == []  # its place under the plan's cap is free


async def test_a_whole_disk_without_its_volume_copy_cannot_boot_as_taken_and_is_removed(
    clocked: Clocked, host: KeeperHost
) -> None:
    async with await _client(clocked, "pro") as http:
        snap = await _snapshot_with_a_volume(http)
        [copy_id] = await _copies(clocked, snap["id"])
        await _left_creating(clocked, snap["id"])
        host.volumes.pop(copy_id)

        clocked.clock.advance(reconciler.snapshot_orphaned_after_s(1) + 1)
        await clocked.reconcile(reconciler.OrphanedSnapshots())

        fail(await http.get(f"/v1/snapshots/{snap['id']}"), 404, "NOT_FOUND")
        assert snap["id"] not in host.snapshots and ("delete_volume", copy_id) in host.calls


async def test_a_create_that_answers_after_the_reconciler_settled_it_records_nothing_twice(
    clocked: Clocked, host: KeeperHost
) -> None:
    """The copy is whole on the host but its answer comes late (here: held back), past the bound: the
    reconciler records it ``ready`` with its event, and the create's answer then changes nothing."""
    answer = asyncio.Event()
    copy = host.snapshot

    async def late(sandbox_id: str, snapshot_id: str) -> SnapshotView:
        made = await copy(sandbox_id, snapshot_id)  # whole on the host now
        await answer.wait()
        return made

    async with await _client(clocked, "pro") as http:
        ok(await http.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"}))
        source = ok(await http.post("/v1/sandboxes", json={"shape": SHAPE}))
        setattr(host, "snapshot", late)  # noqa: B010
        asked = asyncio.create_task(http.post(f"/v1/sandboxes/{source['id']}/snapshots", json={}))
        for _ in range(200):
            if host.snapshots:
                break
            await asyncio.sleep(0.01)
        [snapshot_id] = host.snapshots

        clocked.clock.advance(reconciler.snapshot_orphaned_after_s(0) + 1)
        await clocked.reconcile(reconciler.OrphanedSnapshots())
        assert ok(await http.get(f"/v1/snapshots/{snapshot_id}"))["status"] == "ready"
        assert await _events(clocked, snapshot_id) == 1

        answer.set()
        answered = ok(await asked)
        assert answered["id"] == snapshot_id and answered["status"] == "ready"
        assert answered["size_bytes"] == DISK_BYTES
        assert await _events(clocked, snapshot_id) == 1
