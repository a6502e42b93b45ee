"""Local persistent volumes in the control plane (issue #34, docs/volumes.md) over real HTTP on both
database engines.

The host is the unit-test seam (``FakeHostLink`` with the volume calls, recorded); tests/volumes/ drives
the same paths on a real host agent, loop devices, XFS and sandboxes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from alembic import command
from sqlalchemy import text

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core import errors
from paddock_core.db import alembic_config, make_engine, upgrade
from paddock_hostagent.schemas import VolumeMountBody, VolumeMountView, VolumeView
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink

pytestmark = pytest.mark.db

SHAPE = "s-1vcpu-1gb"
HEADERS = {"Authorization": f"Bearer {HOST_TOKEN}"}


class FakeVolumeHost(FakeHostLink):
    """The fake host, with the volume calls a real host agent answers (``sandboxes/volumes.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self.volumes: dict[str, int] = {}
        self.mounts: dict[tuple[str, str], VolumeMountBody] = {}
        #: A mount at this path is refused as the host refuses a path through a link in the sandbox.
        self.refused_path = ""
        #: The host's free disk: a larger volume is refused as the host refuses it (its 507).
        self.free_mib = 1 << 20

    async def create_volume(self, volume_id: str, size_mib: int) -> VolumeView:
        self.calls.append(("create_volume", f"{volume_id} {size_mib}"))
        if size_mib > self.free_mib:
            raise hostlink.CapacityError(f"a volume of {size_mib} MiB does not fit: {self.free_mib} MiB free")
        self.volumes[volume_id] = size_mib
        return VolumeView(id=volume_id, size_mib=size_mib, used_bytes=0)

    async def resize_volume(self, volume_id: str, size_mib: int) -> VolumeView:
        self.calls.append(("resize_volume", f"{volume_id} {size_mib}"))
        self.volumes[volume_id] = size_mib
        return VolumeView(id=volume_id, size_mib=size_mib, used_bytes=0)

    async def delete_volume(self, volume_id: str) -> None:
        self.calls.append(("delete_volume", volume_id))
        self.volumes.pop(volume_id, None)

    async def attach_volume(self, sandbox_id: str, body: VolumeMountBody) -> VolumeMountView:
        self.calls.append(
            ("attach_volume", f"{sandbox_id} {body.volume_id} {body.mount_path} {body.read_only}")
        )
        if body.mount_path == self.refused_path:
            raise errors.ValidationFailed.field("path", f"{body.mount_path} passes through a symbolic link")
        self.mounts[(sandbox_id, body.volume_id)] = body
        return VolumeMountView(volume_id=body.volume_id, mount_path=body.mount_path, read_only=body.read_only)

    async def detach_volume(self, sandbox_id: str, volume_id: str) -> None:
        self.calls.append(("detach_volume", f"{sandbox_id} {volume_id}"))
        self.mounts.pop((sandbox_id, volume_id), None)


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # Webhook deliveries go to a closed loopback port; the tests read the outbox, not the receiver.
    return cp_settings.model_copy(update={"webhook_allow_private_targets": True})


@pytest.fixture
async def host(controlplane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> FakeVolumeHost:
    link = FakeVolumeHost()

    async def for_host(services: object, host_id: str | None) -> FakeVolumeHost:
        return link

    monkeypatch.setattr(hostlink, "for_host", for_host)
    beat = await controlplane.http.post("/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers=HEADERS)
    assert beat.status_code == 200, beat.text
    return link


async def client_for(controlplane: ControlPlane, plan: str = "pro") -> httpx.AsyncClient:
    _, key = await controlplane.new_user(plan, 500)
    return httpx.AsyncClient(base_url=controlplane.url, headers={"X-Api-Key": key}, timeout=30)


@pytest.fixture
async def api(controlplane: ControlPlane, host: FakeVolumeHost) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(controlplane) as client:
        yield client


def ok(resp: httpx.Response) -> Any:
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


def fail(resp: httpx.Response, status: int, code: str) -> str:
    """The failure's message (which names the field or the sandbox)."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["status"] == "fail" and body["data"]["code"] == code, body
    return str(body["data"]["message"])


async def new_volume(api: httpx.AsyncClient, name: str = "data", size_mib: int = 1024) -> dict[str, Any]:
    return dict(ok(await api.post("/v1/volumes", json={"name": name, "size_mib": size_mib})))


async def destroy(api: httpx.AsyncClient, sandbox_id: str) -> None:
    """Destroyed, not just destroying: a sandbox being destroyed still holds its volumes."""
    ok(await api.delete(f"/v1/sandboxes/{sandbox_id}"))
    for _ in range(100):
        status = ok(await api.get(f"/v1/sandboxes/{sandbox_id}"))["status"]
        if status == "destroyed":
            break
        await asyncio.sleep(0.05)
    assert status == "destroyed"


async def new_sandbox(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    return dict(ok(await api.post("/v1/sandboxes", json={"shape": SHAPE, **body})))


async def test_a_volume_is_made_on_a_host_read_by_id_or_name_grown_and_deleted(
    api: httpx.AsyncClient, host: FakeVolumeHost
) -> None:
    made = await new_volume(api, "pgdata", 1024)
    assert made["id"].startswith("vol_") and made["status"] == "ready" and made["size_mib"] == 1024
    assert made["host_id"] == HOST_BEAT["id"] and made["attachments"] == []
    assert host.volumes == {made["id"]: 1024}
    assert ok(await api.get(f"/v1/volumes/{made['id']}"))["name"] == "pgdata"
    assert ok(await api.get("/v1/volumes/pgdata"))["id"] == made["id"]
    listed = ok(await api.get("/v1/volumes"))
    assert [v["id"] for v in listed["data"]] == [made["id"]] and listed["pagination"]["total"] == 1
    assert "name" in fail(
        await api.post("/v1/volumes", json={"name": "pgdata", "size_mib": 1024}), 409, "ALREADY_EXISTS"
    )

    grown = ok(await api.patch("/v1/volumes/pgdata", json={"size_mib": 2048}))
    assert grown["size_mib"] == 2048 and host.volumes[made["id"]] == 2048
    assert "size_mib" in fail(
        await api.patch("/v1/volumes/pgdata", json={"size_mib": 2048}), 400, "VALIDATION_FAILED"
    )
    assert host.volumes[made["id"]] == 2048  # a refused shrink never reached the host

    assert ok(await api.delete("/v1/volumes/pgdata")) == {"deleted": True}
    assert ("delete_volume", made["id"]) in host.calls and host.volumes == {}
    fail(await api.get(f"/v1/volumes/{made['id']}"), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"size_mib": 1024}, 400, "name"),
        ({"name": "vol_x", "size_mib": 1024}, 400, "name"),
        ({"name": "has space", "size_mib": 1024}, 400, "name"),
        ({"name": "data"}, 400, "size_mib"),
        ({"name": "data", "size_mib": "big"}, 400, "size_mib"),
        ({"name": "data", "size_mib": 100}, 400, "size_mib"),
        ({"name": "data", "size_mib": 2**31}, 400, "size_mib"),
        ({"name": "data", "size_mib": 51201}, 403, "size_mib"),  # the pro plan's max_disk_mib is 51200
        ({"name": "data", "size_mib": 1024, "host_id": "nowhere"}, 400, "host_id"),
    ],
)
async def test_bad_volume_input_gets_a_4xx_naming_the_field(
    api: httpx.AsyncClient, host: FakeVolumeHost, body: dict[str, Any], status: int, field: str
) -> None:
    resp = await api.post("/v1/volumes", json=body)
    assert resp.status_code == status, resp.text
    assert field in resp.text
    assert host.volumes == {}


async def test_a_volume_larger_than_its_hosts_free_disk_is_a_507_naming_size_mib_and_leaves_no_row(
    api: httpx.AsyncClient, host: FakeVolumeHost
) -> None:
    host.free_mib = 2048
    resp = await api.post("/v1/volumes", json={"name": "big", "size_mib": 4096})
    assert resp.status_code == 507 and "size_mib" in resp.text and "2048 MiB free" in resp.text, resp.text
    assert ok(await api.get("/v1/volumes"))["pagination"]["total"] == 0
    await new_volume(api, "big", 1024)  # the name is free again


async def test_the_plan_bounds_how_many_volumes_an_account_keeps(
    controlplane: ControlPlane, host: FakeVolumeHost
) -> None:
    async with await client_for(controlplane, plan="free") as free:
        await new_volume(free, "one")
        fail(await free.post("/v1/volumes", json={"name": "two", "size_mib": 1024}), 403, "QUOTA_EXCEEDED")
        # The free plan's disk bound is its volume bound too.
        fail(await free.patch("/v1/volumes/one", json={"size_mib": 10241}), 403, "PLAN_LIMIT")


async def test_one_writer_or_many_readers_and_an_attached_volume_is_not_deleted(
    api: httpx.AsyncClient, host: FakeVolumeHost
) -> None:
    volume = await new_volume(api)
    vid = volume["id"]
    first = await new_sandbox(api, volumes=[{"volume_id": "data", "mount_path": "/data/"}])
    assert ("attach_volume", f"{first['id']} {vid} /data False") in host.calls
    held = ok(await api.get(f"/v1/volumes/{vid}"))["attachments"]
    assert held == [{"sandbox_id": first["id"], "mount_path": "/data", "read_only": False}]

    # A second writer, or a reader beside the writer, is a 409 naming the sandbox that holds it.
    second = await api.post(
        "/v1/sandboxes", json={"shape": SHAPE, "volumes": [{"volume_id": vid, "mount_path": "/d"}]}
    )
    assert first["id"] in fail(second, 409, "IN_USE")
    other = await new_sandbox(api)
    reader = await api.post(
        f"/v1/sandboxes/{other['id']}/volumes", json={"volume_id": vid, "mount_path": "/d", "read_only": True}
    )
    assert first["id"] in fail(reader, 409, "IN_USE")
    assert first["id"] in fail(await api.delete(f"/v1/volumes/{vid}"), 409, "IN_USE")
    assert len(ok(await api.get("/v1/sandboxes"))["data"]) == 2  # the refused create left nothing

    # Destroyed, the first holds it no more: the next writer attaches live.
    await destroy(api, first["id"])
    attached = ok(
        await api.post(f"/v1/sandboxes/{other['id']}/volumes", json={"volume_id": vid, "mount_path": "/d"})
    )
    assert attached == {"id": other["id"], "volume_id": vid, "mount_path": "/d", "read_only": False}
    fail(
        await api.post(f"/v1/sandboxes/{other['id']}/volumes", json={"volume_id": vid, "mount_path": "/e"}),
        409,
        "ALREADY_EXISTS",
    )
    ok(await api.delete(f"/v1/sandboxes/{other['id']}/volumes/{vid}"))
    assert ("detach_volume", f"{other['id']} {vid}") in host.calls
    assert (other["id"], vid) not in host.mounts

    # Readers: any number, and then no writer.
    readers = [
        await new_sandbox(api, volumes=[{"volume_id": vid, "mount_path": "/ro", "read_only": True}])
        for _ in range(2)
    ]
    assert {r["sandbox_id"] for r in ok(await api.get(f"/v1/volumes/{vid}"))["attachments"]} == {
        r["id"] for r in readers
    }
    writer = await api.post(
        f"/v1/sandboxes/{other['id']}/volumes", json={"volume_id": vid, "mount_path": "/d"}
    )
    assert readers[0]["id"] in fail(writer, 409, "IN_USE")
    for reader_sb in readers:
        ok(await api.delete(f"/v1/sandboxes/{reader_sb['id']}/volumes/{vid}"))
    ok(await api.delete(f"/v1/volumes/{vid}"))


async def test_volume_actions_are_announced_to_webhooks(api: httpx.AsyncClient) -> None:
    endpoint = ok(
        await api.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook", "events": []})
    )
    volume = await new_volume(api, "announced", 1024)
    ok(await api.patch(f"/v1/volumes/{volume['id']}", json={"size_mib": 2048}))
    sandbox = await new_sandbox(api)
    ok(
        await api.post(
            f"/v1/sandboxes/{sandbox['id']}/volumes", json={"volume_id": "announced", "mount_path": "/v"}
        )
    )
    ok(await api.delete(f"/v1/sandboxes/{sandbox['id']}/volumes/{volume['id']}"))
    ok(await api.delete(f"/v1/volumes/{volume['id']}"))
    deliveries = ok(await api.get(f"/v1/webhook-endpoints/{endpoint['id']}"))["deliveries"]
    events = {
        d["eventAction"]: json.loads(d["payload"])["data"]
        if isinstance(d["payload"], str)
        else d["payload"]["data"]
        for d in deliveries
        if d["eventAction"].startswith("volume.")
    }
    assert sorted(events) == [
        "volume.attach",
        "volume.create",
        "volume.delete",
        "volume.detach",
        "volume.resize",
    ]
    assert events["volume.create"] == {
        "volume_id": volume["id"], "name": "announced", "size_mib": 1024, "host_id": volume["host_id"]
    }  # fmt: skip
    assert (
        events["volume.resize"]["size_mib"] == 2048 and events["volume.delete"]["volume_id"] == volume["id"]
    )
    assert events["volume.attach"] == {
        "volume_id": volume["id"], "sandbox_id": sandbox["id"], "mount_path": "/v", "read_only": False
    }  # fmt: skip
    assert events["volume.detach"] == {"volume_id": volume["id"], "sandbox_id": sandbox["id"]}


async def test_concurrent_writers_get_one_attach_and_one_409(
    api: httpx.AsyncClient, host: FakeVolumeHost
) -> None:
    vid = (await new_volume(api))["id"]
    a, b = await new_sandbox(api), await new_sandbox(api)
    answers = await asyncio.gather(
        *(
            api.post(f"/v1/sandboxes/{s['id']}/volumes", json={"volume_id": vid, "mount_path": "/v"})
            for s in (a, b)
        )
    )
    assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]


async def test_bad_attachments_get_a_4xx_naming_the_field(
    api: httpx.AsyncClient, host: FakeVolumeHost
) -> None:
    vid = (await new_volume(api))["id"]
    cases = [
        ({"volume_id": vid, "mount_path": "data"}, 400, "volumes[0].mount_path"),
        ({"volume_id": vid, "mount_path": "/proc/x"}, 400, "volumes[0].mount_path"),
        ({"volume_id": vid, "mount_path": "/a/../b"}, 400, "volumes[0].mount_path"),
        ({"volume_id": vid, "mount_path": "/"}, 400, "volumes[0].mount_path"),
        ({"volume_id": "vol_nothere", "mount_path": "/data"}, 404, "volumes[0].volume_id"),
        ({"volume_id": vid, "mount_path": "/data", "read_only": "yes"}, 400, "read_only"),
        ({"mount_path": "/data"}, 400, "volume_id"),
    ]
    for item, status, field in cases:
        resp = await api.post("/v1/sandboxes", json={"shape": SHAPE, "volumes": [item]})
        assert resp.status_code == status and field in resp.text, (item, resp.text)
    twice = [
        {"volume_id": vid, "mount_path": "/a"},
        {"volume_id": vid, "mount_path": "/b", "read_only": True},
    ]
    assert "volumes[1].volume_id" in fail(
        await api.post("/v1/sandboxes", json={"shape": SHAPE, "volumes": twice}), 400, "VALIDATION_FAILED"
    )
    many = [{"volume_id": vid, "mount_path": f"/m{i}"} for i in range(17)]
    resp = await api.post("/v1/sandboxes", json={"shape": SHAPE, "volumes": many})
    assert resp.status_code == 400 and "volumes" in resp.text
    assert ok(await api.get("/v1/sandboxes"))["data"] == []  # none of them made a sandbox

    sandbox = await new_sandbox(api)
    resp = await api.post(
        f"/v1/sandboxes/{sandbox['id']}/volumes", json={"volume_id": vid, "mount_path": "/sys/x"}
    )
    assert "mount_path" in fail(resp, 400, "VALIDATION_FAILED")
    resp = await api.post(
        f"/v1/sandboxes/{sandbox['id']}/volumes", json={"volume_id": "nope", "mount_path": "/x"}
    )
    assert "volume_id" in fail(resp, 404, "NOT_FOUND")
    fail(await api.delete(f"/v1/sandboxes/{sandbox['id']}/volumes/{vid}"), 404, "NOT_FOUND")


async def test_a_mount_the_host_refuses_fails_the_create_naming_the_field_and_leaves_no_sandbox(
    api: httpx.AsyncClient, host: FakeVolumeHost
) -> None:
    vid = (await new_volume(api))["id"]
    host.refused_path = "/linked"
    resp = await api.post(
        "/v1/sandboxes", json={"shape": SHAPE, "volumes": [{"volume_id": vid, "mount_path": "/linked"}]}
    )
    assert "volumes[0].mount_path" in fail(resp, 400, "VALIDATION_FAILED")
    for _ in range(100):  # the destroy it started ends on its own
        gone = ok(await api.get("/v1/sandboxes?status=destroyed"))["data"]
        if gone:
            break
        await asyncio.sleep(0.05)
    assert [sb["status"] for sb in ok(await api.get("/v1/sandboxes"))["data"]] == ["destroyed"]
    assert ok(await api.get(f"/v1/volumes/{vid}"))["attachments"] == []
    await new_sandbox(api, volumes=[{"volume_id": vid, "mount_path": "/fine"}])  # and the volume is free


async def test_a_sandbox_using_a_volume_runs_on_its_host_and_gvisor_binds_it_at_the_start(
    controlplane: ControlPlane, api: httpx.AsyncClient, host: FakeVolumeHost
) -> None:
    vid = (await new_volume(api))["id"]
    other = {**HOST_BEAT, "id": "host-test-2", "url": "http://127.0.0.1:10"}
    assert (
        await controlplane.http.post("/internal/v1/hosts/heartbeat", json=other, headers=HEADERS)
    ).status_code == 200
    resp = await api.post(
        "/v1/sandboxes",
        json={"shape": SHAPE, "host_id": "host-test-2", "volumes": [{"volume_id": vid, "mount_path": "/v"}]},
    )
    message = fail(resp, 409, "INVALID_STATE")
    assert HOST_BEAT["id"] in message and "host-test-2" in message
    placed = await new_sandbox(api, volumes=[{"volume_id": vid, "mount_path": "/v"}])
    assert ("attach_volume", f"{placed['id']} {vid} /v False") in host.calls
    elsewhere = await new_sandbox(api, host_id="host-test-2")
    resp = await api.post(
        f"/v1/sandboxes/{elsewhere['id']}/volumes",
        json={"volume_id": vid, "mount_path": "/v", "read_only": True},
    )
    assert "host-test-2" in fail(resp, 409, "INVALID_STATE")

    gvisor = {
        **HOST_BEAT,
        "id": "host-gvisor",
        "url": "http://127.0.0.1:11",
        "labels": {"paddock.io/isolation": "gvisor", "paddock.io/runtime": "runsc"},
    }
    assert (
        await controlplane.http.post("/internal/v1/hosts/heartbeat", json=gvisor, headers=HEADERS)
    ).status_code == 200
    # gVisor keeps volumes but binds them only at a sandbox's start: its host is told before the create
    # call, and a live attach there is a 409 naming the tier.
    kept = ok(await api.post("/v1/volumes", json={"name": "g", "size_mib": 1024, "host_id": "host-gvisor"}))
    assert kept["host_id"] == "host-gvisor"
    host.calls.clear()
    bound = await new_sandbox(api, volumes=[{"volume_id": "g", "mount_path": "/g"}])
    order = [(name, detail.split()[0]) for name, detail in host.calls]
    assert order.index(("attach_volume", bound["id"])) < order.index(("create", bound["id"])), order
    other = await new_sandbox(api, host_id="host-gvisor")
    resp = await api.post(f"/v1/sandboxes/{other['id']}/volumes", json={"volume_id": "g", "mount_path": "/v"})
    assert "gvisor" in fail(resp, 409, "INVALID_STATE")


async def test_migration_0018_goes_up_and_down(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url)
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
        assert {"volumes", "volume_attachments"} <= tables
        cfg = alembic_config(MIGRATIONS, database_url)
        await asyncio.to_thread(command.downgrade, cfg, "0017")
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
            revision = (
                await conn.execute(text("SELECT version_num FROM alembic_version_controlplane"))
            ).scalar()
        assert "volumes" not in tables and "volume_attachments" not in tables and revision == "0017"
        await upgrade(MIGRATIONS, database_url)
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
        assert {"volumes", "volume_attachments"} <= tables
    finally:
        await engine.dispose()


async def test_the_openapi_document_lists_the_volume_routes_with_their_bodies_and_statuses(
    controlplane: ControlPlane,
) -> None:
    doc = (await controlplane.http.get("/openapi.json")).json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]

    def body_schema(operation: dict[str, Any]) -> dict[str, Any]:
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        return dict(schemas[ref.rsplit("/", 1)[1]])

    create = paths["/v1/volumes"]["post"]
    assert {"402", "403", "409", "503"} <= set(create["responses"])
    assert {"name", "size_mib", "host_id"} <= set(body_schema(create)["properties"])
    assert "get" in paths["/v1/volumes"] and "get" in paths["/v1/volumes/{ref}"]
    assert "409" in paths["/v1/volumes/{ref}"]["delete"]["responses"]
    assert set(body_schema(paths["/v1/volumes/{ref}"]["patch"])["properties"]) == {"size_mib"}
    attach = paths["/v1/sandboxes/{sandbox_id}/volumes"]["post"]
    assert body_schema(attach)["required"] == ["volume_id", "mount_path"] and "409" in attach["responses"]
    assert "409" in paths["/v1/sandboxes/{sandbox_id}/volumes/{volume_id}"]["delete"]["responses"]
    sandbox_body = body_schema(paths["/v1/sandboxes"]["post"])
    assert sandbox_body["properties"]["volumes"]["anyOf"][0]["maxItems"] == 16
