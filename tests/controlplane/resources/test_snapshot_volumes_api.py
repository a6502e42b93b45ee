"""A snapshot's ``include_volumes`` in the control plane (issue #34, docs/volumes.md) over real HTTP on both
database engines: the 400 for a non-boolean, the plan's volume cap on a boot from such a snapshot (403
naming ``rootfs``), what the snapshot shows, that a failed boot and a deleted snapshot leave no copy,
the 409s for gVisor and for a boot on another host, and a snapshot without the flag.

The host is the unit-test seam (the volume host of test_volumes_api.py, with a snapshot and a clone
call); tests/volumes/test_snapshot_volumes_live.py drives the same paths on a real host agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from paddock_controlplane.hosts import hostlink
from paddock_hostagent.schemas import SnapshotView, VolumeView
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import HOST_BEAT
from tests.controlplane.resources.test_volumes_api import (
    HEADERS,
    FakeVolumeHost,
    client_for,
    destroy,
    fail,
    new_sandbox,
    new_volume,
    ok,
)

pytestmark = pytest.mark.db

DISK_BYTES = 5 << 20
COPY_BYTES = 3 << 20


class FakeSnapshotHost(FakeVolumeHost):
    """The fake volume host, with snapshots and volume copies as a real host agent answers them."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshots: set[str] = set()
        #: Copy id -> the snapshot it belongs to (None: a user's volume copied from one).
        self.copies: dict[str, str | None] = {}

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotView:
        self.calls.append(("snapshot", f"{sandbox_id} {snapshot_id}"))
        self.snapshots.add(snapshot_id)
        return SnapshotView(
            id=snapshot_id,
            image="debian:13",
            fs="xfs",
            disk_mib=2048,
            source_id=sandbox_id,
            created_at=0.0,
            size_bytes=DISK_BYTES,
        )

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.calls.append(("delete_snapshot", snapshot_id))
        self.snapshots.discard(snapshot_id)

    async def clone_volume(
        self, source_id: str, volume_id: str, *, snapshot_id: str | None = None
    ) -> VolumeView:
        self.calls.append(("clone_volume", f"{source_id} {volume_id} {snapshot_id}"))
        if source_id not in self.volumes:
            raise hostlink.HostError(f"no volume {source_id} on this host")
        self.volumes[volume_id] = self.volumes[source_id]
        self.copies[volume_id] = snapshot_id
        return VolumeView(id=volume_id, size_mib=self.volumes[volume_id], used_bytes=COPY_BYTES)


@pytest.fixture
async def host(controlplane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> FakeSnapshotHost:
    link = FakeSnapshotHost()

    async def for_host(services: object, host_id: str | None) -> FakeSnapshotHost:
        return link

    monkeypatch.setattr(hostlink, "for_host", for_host)
    beat = await controlplane.http.post("/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers=HEADERS)
    assert beat.status_code == 200, beat.text
    return link


@pytest.fixture
async def api(controlplane: ControlPlane, host: FakeSnapshotHost) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(controlplane, plan="beginner") as client:
        yield client


async def user_volumes(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    return list(ok(await api.get("/v1/volumes"))["data"])


async def test_include_volumes_keeps_copies_counted_against_the_cap_at_boot_and_gone_with_the_snapshot(
    api: httpx.AsyncClient, host: FakeSnapshotHost
) -> None:
    volume = await new_volume(api, "data", 1024)
    source = await new_sandbox(api, volumes=[{"volume_id": "data", "mount_path": "/data", "read_only": True}])

    not_bool = await api.post(f"/v1/sandboxes/{source['id']}/snapshots", json={"include_volumes": "yes"})
    assert "include_volumes" in fail(not_bool, 400, "VALIDATION_FAILED")
    assert host.snapshots == set()

    snap = ok(await api.post(f"/v1/sandboxes/{source['id']}/snapshots", json={"include_volumes": True}))
    assert snap["volumes"] == [{"name": "data", "mount_path": "/data", "read_only": True, "size_mib": 1024}]
    assert snap["size_bytes"] == DISK_BYTES + COPY_BYTES  # the copy's bytes are the snapshot's
    [(kept_id, owner)] = host.copies.items()
    assert owner == snap["id"] and kept_id != volume["id"]
    assert [v["id"] for v in await user_volumes(api)] == [volume["id"]]  # the copy is not a user's volume
    assert ok(await api.get(f"/v1/snapshots/{snap['id']}"))["volumes"] == snap["volumes"]
    assert ok(await api.get("/v1/snapshots"))["data"][0]["volumes"] == snap["volumes"]

    # The beginner plan keeps five volumes: with five kept, a boot that would make a sixth is a 403
    # naming rootfs, and leaves nothing behind.
    fillers = [await new_volume(api, f"filler{n}", 512) for n in range(4)]
    over = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": snap["id"]})
    assert "rootfs" in fail(over, 403, "QUOTA_EXCEEDED")
    assert len(await user_volumes(api)) == 5
    for filler in fillers:
        ok(await api.delete(f"/v1/volumes/{filler['id']}"))

    # Independent of its source: the sandbox and the volume go, the snapshot boots with its copy.
    await destroy(api, source["id"])
    ok(await api.delete("/v1/volumes/data"))

    # A boot whose host fails makes no volume that stays.
    host.fail_boot = True
    failed = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": snap["id"]})
    assert failed.status_code == 500, failed.text
    assert await user_volumes(api) == []
    host.fail_boot = False

    booted = await new_sandbox(api, rootfs=snap["id"])
    [mine] = await user_volumes(api)
    assert mine["name"].startswith("data-snap-") and mine["status"] == "ready" and mine["size_mib"] == 1024
    assert mine["attachments"] == [{"sandbox_id": booted["id"], "mount_path": "/data", "read_only": True}]
    assert host.copies[mine["id"]] is None and ("clone_volume", f"{kept_id} {mine['id']} None") in host.calls
    assert host.mounts[(booted["id"], mine["id"])].mount_path == "/data"

    ok(await api.delete(f"/v1/snapshots/{snap['id']}"))
    assert ("delete_volume", kept_id) in host.calls and kept_id not in host.volumes
    assert mine["id"] in host.volumes  # the booted sandbox's volume stays
    assert [v["id"] for v in await user_volumes(api)] == [mine["id"]]


async def test_gvisor_refuses_include_volumes_and_such_a_snapshot_boots_on_its_host_only(
    controlplane: ControlPlane, api: httpx.AsyncClient, host: FakeSnapshotHost
) -> None:
    gvisor = {
        **HOST_BEAT,
        "id": "host-gvisor",
        "url": "http://127.0.0.1:11",
        "labels": {"paddock.io/isolation": "gvisor", "paddock.io/runtime": "runsc"},
    }
    beat = await controlplane.http.post("/internal/v1/hosts/heartbeat", json=gvisor, headers=HEADERS)
    assert beat.status_code == 200, beat.text
    ok(await api.post("/v1/volumes", json={"name": "g", "size_mib": 1024, "host_id": "host-gvisor"}))
    on_gvisor = await new_sandbox(api, volumes=[{"volume_id": "g", "mount_path": "/g"}])
    refused = await api.post(f"/v1/sandboxes/{on_gvisor['id']}/snapshots", json={"include_volumes": True})
    assert "gvisor" in fail(refused, 409, "INVALID_STATE")
    assert host.snapshots == set() and host.copies == {}
    assert ok(await api.get("/v1/snapshots"))["pagination"]["total"] == 0

    ok(await api.post("/v1/volumes", json={"name": "data", "size_mib": 1024, "host_id": HOST_BEAT["id"]}))
    source = await new_sandbox(api, volumes=[{"volume_id": "data", "mount_path": "/data"}])
    snap = ok(await api.post(f"/v1/sandboxes/{source['id']}/snapshots", json={"include_volumes": True}))
    other = await api.post(
        "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": snap["id"], "host_id": "host-gvisor"}
    )
    message = fail(other, 409, "INVALID_STATE")
    assert HOST_BEAT["id"] in message and "host-gvisor" in message and "volumes" in message

    # Without the flag (or false), as before: the snapshot keeps no volume and boots with none.
    plain = ok(await api.post(f"/v1/sandboxes/{source['id']}/snapshots", json={"include_volumes": False}))
    assert plain["volumes"] == [] and plain["size_bytes"] == DISK_BYTES
    assert list(host.copies.values()) == [snap["id"]]
    booted = await new_sandbox(api, rootfs=plain["id"])
    assert not [key for key in host.mounts if key[0] == booted["id"]]
