"""Disks in the control plane (§10.13, §11.10, §11.11, §14) over real HTTP on both engines.

The host is the unit-test seam (``FakeHostLink``, which records the mounts it is asked for);
tests/integration/test_disks.py drives the same paths on real sandboxes, s3fs and an S3 server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from paddock_controlplane.records.models import Disk, SandboxDisk
from paddock_controlplane.resources import disks
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.db import make_engine, make_sessionmaker
from paddock_core.timeutil import utcnow
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink
from tests.controlplane.resources.test_networks import client_for, fail, new_sandbox, ok
from tests.controlplane.resources.test_networks import fake_host as fake_host

pytestmark = pytest.mark.db

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
ACCESS = "AKIAPADDOCKTEST00001"


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # The S3 endpoints here are on loopback, which a production control plane refuses
    # (tests/disks/test_disk_endpoints.py).
    return cp_settings.model_copy(
        update={"webhook_allow_private_targets": True, "disk_allow_private_endpoints": True}
    )


@pytest.fixture
async def api(controlplane: ControlPlane, fake_host: FakeHostLink) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(controlplane) as client:
        yield client


def disk_body(name: str = "data", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "kind": "s3",
        "config": {
            "bucket": "team-data",
            "endpoint": "http://127.0.0.1:9000",
            "region": "us-east-1",
            "use_path_style": True,
        },
        "credentials": {"access_key": ACCESS, "secret_key": SECRET},
    }
    body.update(overrides)
    return body


async def new_disk(api: httpx.AsyncClient, name: str = "data", **overrides: Any) -> dict[str, Any]:
    return dict(ok(await api.post("/v1/disks", json=disk_body(name, **overrides))))


async def settled(api: httpx.AsyncClient, sandbox_id: str) -> list[dict[str, Any]]:
    """The sandbox's attachments once none is pending (the mount runs after the attach answers)."""
    for _ in range(100):
        items = ok(await api.get(f"/v1/sandboxes/{sandbox_id}/disks"))["data"]
        if all(item["mount_status"] != "pending" for item in items):
            return list(items)
        await asyncio.sleep(0.05)
    raise AssertionError(f"mounts still pending: {items}")


async def test_crud_round_trip_credentials_sealed_and_never_shown(
    api: httpx.AsyncClient, controlplane: ControlPlane
) -> None:
    created = await new_disk(api, "data")
    assert created["id"].startswith("disk_") and len(created["id"]) == 31, created
    assert created == {
        "id": created["id"],
        "name": "data",
        "kind": "s3",
        "config": disk_body()["config"],
        "created_at": created["created_at"],
    }
    second = await new_disk(api, "logs")
    listed = ok(await api.get("/v1/disks", params={"limit": 1}))
    assert listed["pagination"] == {"total": 2, "limit": 1, "offset": 0, "count": 1}
    assert listed["data"] == [created]
    assert ok(await api.get("/v1/disks", params={"offset": 1}))["data"] == [second]
    assert ok(await api.get(f"/v1/disks/{created['id']}")) == created
    assert ok(await api.get("/v1/disks/logs")) == second  # by name too
    rotated = {"credentials": {"access_key": "AKIAROTATED000000001", "secret_key": "rotated-" + SECRET}}
    assert ok(await api.patch("/v1/disks/data", json=rotated)) == created
    fail(
        await api.patch("/v1/disks/data", json={"credentials": {"access_key": "a"}}), 400, "VALIDATION_FAILED"
    )
    engine = make_engine(controlplane.settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            sealed = (await session.scalars(select(Disk.credentials_sealed))).all()
    finally:
        await engine.dispose()
    assert len(sealed) == 2 and not any(SECRET in value or ACCESS in value for value in sealed)
    fail(await api.post("/v1/disks", json=disk_body("data")), 409, "ALREADY_EXISTS")
    assert ok(await api.delete("/v1/disks/data")) == {"deleted": True}
    fail(await api.get(f"/v1/disks/{created['id']}"), 404, "NOT_FOUND")
    fail(await api.delete(f"/v1/disks/{created['id']}"), 404, "NOT_FOUND")
    assert (await new_disk(api, "data"))["id"] != created["id"]  # the name is free again


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (disk_body("Bad_Name"), "name"),
        (disk_body("-x"), "name"),
        (disk_body("a" * 64), "name"),
        ({k: v for k, v in disk_body().items() if k != "name"}, "name"),
        (disk_body(kind="gcs"), "kind"),
        (disk_body(config={"endpoint": "http://127.0.0.1:9000"}), "config.bucket"),
        (disk_body(config={"bucket": "b", "endpoint": "127.0.0.1:9000"}), "config.endpoint"),
        (disk_body(config={"bucket": "b", "endpoint": "ftp://x"}), "config.endpoint"),
        (disk_body(config="{}"), "config"),
        (disk_body(credentials={"access_key": "a", "secret_key": ""}), "credentials.secret_key"),
        (disk_body(credentials={"secret_key": "s"}), "credentials.access_key"),
        ({"name": "flat", "kind": "s3", "bucket": "b", "access_key_id": "a"}, "config"),
        # A comma is another s3fs option: a second url (the host's loopback), or a cache directory on
        # the host that s3fs, as root, would fill with the bucket's objects (tests/security/
        # test_s3_probes.py runs them against a real agent).
        (
            disk_body(config={"bucket": "b", "endpoint": "https://8.8.8.8/,url=http://127.0.0.1:9"}),
            "config.endpoint",
        ),
        (disk_body(config={"bucket": "b", "endpoint": "http://8.8.8.8,use_cache=/root"}), "config.endpoint"),
        (disk_body(config={"bucket": "b", "endpoint": "http://u:p@8.8.8.8"}), "config.endpoint"),
        (disk_body(config={"bucket": "b", "endpoint": "http://8.8.8.8/?x=1"}), "config.endpoint"),
        (disk_body(config={"bucket": "b", "endpoint": "http://8.8.8.8/#x"}), "config.endpoint"),
        (disk_body(config={"bucket": "b", "endpoint": "http://8.8.8.8/a b"}), "config.endpoint"),
        (disk_body(config={"bucket": "b", "endpoint": "http://8.8.8.8/\nx"}), "config.endpoint"),
        (disk_body(config={"bucket": "b", "endpoint": "http://8.8.8.8:70000"}), "config.endpoint"),
        (disk_body(config={"bucket": "b,use_cache=/root", "endpoint": "http://8.8.8.8"}), "config.bucket"),
        (disk_body(config={"bucket": "b:c", "endpoint": "http://8.8.8.8"}), "config.bucket"),
    ],
)
async def test_bad_input_is_400_naming_the_field_and_creates_nothing(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    data = fail(await api.post("/v1/disks", json=body), 400, "VALIDATION_FAILED")
    assert field in data, data
    assert SECRET not in str(data)
    assert ok(await api.get("/v1/disks"))["pagination"]["total"] == 0


async def test_plan_caps(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    async with await client_for(controlplane, plan="free") as free:
        assert (
            "no disks" in fail(await free.post("/v1/disks", json=disk_body()), 403, "PLAN_LIMIT")["message"]
        )
    async with await client_for(controlplane, plan="beginner") as small:
        for index in range(5):
            await new_disk(small, f"d{index}")
        data = fail(await small.post("/v1/disks", json=disk_body("d5")), 403, "QUOTA_EXCEEDED")
        assert "cap" in data["message"] and "limit 5" in data["message"]
    async with await client_for(controlplane, credits=0) as broke:
        fail(await broke.post("/v1/disks", json=disk_body()), 402, "INSUFFICIENT_CREDIT")


async def test_attach_at_create_and_live_list_detach_and_delete_rules(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    disk = await new_disk(api, "data")
    sandbox = await new_sandbox(
        api,
        disks=[
            {"disk_id": "data", "mount_path": "/mnt/a"},
            {"disk_id": disk["id"], "mount_path": "/mnt/b", "sub_path": "team/x"},
        ],
    )
    at_create = ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))
    assert [(d["mount_path"], d["mount_status"], d.get("sub_path")) for d in at_create["data"]] == [
        ("/mnt/a", "mounted", None),
        ("/mnt/b", "mounted", "team/x"),
    ]
    assert at_create["data"][0]["disk_id"] == disk["id"] and at_create["data"][0]["name"] == "data"
    mounted = fake_host.disks[(sandbox["id"], "/mnt/b")]
    assert (mounted.secret_key, mounted.sub_path, mounted.bucket) == (SECRET, "team/x", "team-data")

    live = ok(
        await api.post(
            f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": "data", "mount_path": "/srv/c"}
        )
    )
    assert live == {
        "id": sandbox["id"],
        "ok": True,
        "disk_id": disk["id"],
        "mount_path": "/srv/c",
        "mount_status": "pending",
    }
    assert [d["mount_status"] for d in await settled(api, sandbox["id"])] == ["mounted"] * 3
    again = await api.post(
        f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": "data", "mount_path": "/srv/c"}
    )
    fail(again, 409, "ALREADY_EXISTS")
    nested = await api.post(
        f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": "data", "mount_path": "/srv/c/d"}
    )
    assert "mount_path" in fail(nested, 400, "VALIDATION_FAILED")

    fail(await api.delete("/v1/disks/data"), 409, "IN_USE")
    fail(await api.delete(f"/v1/sandboxes/{sandbox['id']}/disks/{disk['id']}"), 400, "VALIDATION_FAILED")
    fail(
        await api.delete(f"/v1/sandboxes/{sandbox['id']}/disks/data", params={"mount_path": "/mnt/a"}),
        404,
        "NOT_FOUND",
    )
    detached = await api.delete(
        f"/v1/sandboxes/{sandbox['id']}/disks/{disk['id']}", params={"mount_path": "/mnt/a"}
    )
    assert ok(detached) == {"detached": True}
    assert (sandbox["id"], "/mnt/a") not in fake_host.disks
    assert [d["mount_path"] for d in await settled(api, sandbox["id"])] == ["/mnt/b", "/srv/c"]
    fail(await api.delete("/v1/disks/data"), 409, "IN_USE")
    ok(await api.delete(f"/v1/sandboxes/{sandbox['id']}"))
    for _ in range(100):  # destroy finishes in the background, then the attachments are gone
        if ok(await api.get(f"/v1/sandboxes/{sandbox['id']}"))["status"] == "destroyed":
            break
        await asyncio.sleep(0.05)
    assert ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))["data"] == []
    assert ok(await api.delete("/v1/disks/data")) == {"deleted": True}


async def test_a_failed_mount_is_reported_not_a_failed_sandbox(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    fake_host.failing_buckets["broken"] = (
        "mounting bucket 'broken' failed: NoSuchBucket: The specified bucket does not exist"
    )
    await new_disk(api, "broken", config={"bucket": "broken", "endpoint": "http://127.0.0.1:9000"})
    sandbox = await new_sandbox(api, disks=[{"disk_id": "broken", "mount_path": "/mnt/x"}])
    assert sandbox["status"] == "running"
    (item,) = ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))["data"]
    assert item["mount_status"] == "error" and "NoSuchBucket" in item["mount_error"]


@pytest.mark.parametrize(
    ("disks", "field", "status"),
    [
        ([{"disk_id": "", "mount_path": "/mnt/a"}], "disks[0].disk_id", 400),
        ([{"disk_id": "data", "mount_path": "mnt/a"}], "disks[0].mount_path", 400),
        ([{"disk_id": "data", "mount_path": "/"}], "disks[0].mount_path", 400),
        ([{"disk_id": "data", "mount_path": "/mnt/a", "sub_path": "../up"}], "disks[0].sub_path", 400),
        ([{"disk_id": "data", "mount_path": "/mnt/a", "sub_path": "/abs"}], "disks[0].sub_path", 400),
        (
            [{"disk_id": "data", "mount_path": "/mnt/a"}, {"disk_id": "data", "mount_path": "/mnt/a/b"}],
            "disks[1].mount_path",
            400,
        ),
        (
            [{"disk_id": "data", "mount_path": "/mnt/a"}, {"disk_id": "nope", "mount_path": "/mnt/b"}],
            "disks[1].disk_id",
            404,
        ),
    ],
)
async def test_bad_attachments_at_create_name_the_field_and_create_nothing(
    api: httpx.AsyncClient, fake_host: FakeHostLink, disks: list[dict[str, Any]], field: str, status: int
) -> None:
    await new_disk(api, "data")
    resp = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "disks": disks})
    assert resp.status_code == status, resp.text
    assert field in resp.text
    assert ok(await api.get("/v1/sandboxes"))["pagination"]["total"] == 0
    assert not fake_host.disks


async def test_another_users_disk_is_404_and_a_free_plan_cannot_attach(
    api: httpx.AsyncClient, controlplane: ControlPlane
) -> None:
    mine = await new_disk(api, "data")
    async with await client_for(controlplane) as other:
        fail(await other.get(f"/v1/disks/{mine['id']}"), 404, "NOT_FOUND")
        fail(await other.delete("/v1/disks/data"), 404, "NOT_FOUND")
        theirs = await new_sandbox(other)
        attach = await other.post(
            f"/v1/sandboxes/{theirs['id']}/disks", json={"disk_id": mine["id"], "mount_path": "/m"}
        )
        assert "disk_id" in fail(attach, 404, "NOT_FOUND")
        create = await other.post(
            "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "disks": [{"disk_id": "data", "mount_path": "/m"}]}
        )
        assert "disks[0].disk_id" in fail(create, 404, "NOT_FOUND")
    sandbox = await new_sandbox(api)
    async with await client_for(controlplane) as other:
        resp = await other.get(f"/v1/sandboxes/{sandbox['id']}/disks")
        fail(resp, 404, "NOT_FOUND")


async def test_attach_needs_a_running_sandbox(api: httpx.AsyncClient) -> None:
    await new_disk(api, "data")
    sandbox = await new_sandbox(api)
    ok(await api.post(f"/v1/sandboxes/{sandbox['id']}/pause"))
    resp = await api.post(
        f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": "data", "mount_path": "/m"}
    )
    fail(resp, 409, "INVALID_STATE")
    assert ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))["data"] == []


async def test_disk_actions_are_announced_without_credentials(api: httpx.AsyncClient) -> None:
    endpoint = ok(
        await api.post(
            "/v1/webhook-endpoints",
            json={
                "url": "http://127.0.0.1:9/hook",
                "events": ["disk.create", "disk.attach", "disk.detach", "disk.delete"],
            },
        )
    )
    disk = await new_disk(api)
    sandbox = await new_sandbox(api)
    ok(
        await api.post(
            f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": disk["id"], "mount_path": "/m"}
        )
    )
    await settled(api, sandbox["id"])
    ok(await api.delete(f"/v1/sandboxes/{sandbox['id']}/disks/{disk['id']}", params={"mount_path": "/m"}))
    ok(await api.delete(f"/v1/disks/{disk['id']}"))
    deliveries = ok(await api.get(f"/v1/webhook-endpoints/{endpoint['id']}"))["deliveries"]
    assert sorted(d["eventAction"] for d in deliveries) == [
        "disk.attach",
        "disk.create",
        "disk.delete",
        "disk.detach",
    ]
    assert SECRET not in str(deliveries) and ACCESS not in str(deliveries)


async def test_a_fork_inherits_the_mounts_of_its_source(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    disk = await new_disk(api, "data")
    source = await new_sandbox(api, disks=[{"disk_id": "data", "mount_path": "/mnt/a", "sub_path": "s"}])
    child = ok(await api.post(f"/v1/sandboxes/{source['id']}/fork", json={}))
    for _ in range(200):
        if ok(await api.get(f"/v1/sandboxes/{child['id']}"))["status"] == "running":
            break
        await asyncio.sleep(0.05)
    items = await settled(api, child["id"])
    assert [(d["disk_id"], d["mount_path"], d["sub_path"], d["mount_status"]) for d in items] == [
        (disk["id"], "/mnt/a", "s", "mounted")
    ]
    assert fake_host.disks[(child["id"], "/mnt/a")].sub_path == "s"
    # The source keeps its own mount; detaching the child's leaves it.
    ok(await api.delete(f"/v1/sandboxes/{child['id']}/disks/{disk['id']}", params={"mount_path": "/mnt/a"}))
    assert [d["mount_path"] for d in await settled(api, source["id"])] == ["/mnt/a"]


async def test_a_mount_left_pending_by_a_stopped_process_is_driven_again(
    api: httpx.AsyncClient, controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    disk = await new_disk(api, "data")
    sandbox = await new_sandbox(api)
    engine = make_engine(controlplane.settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            # What a control plane that died between writing the attachment and the host's answer leaves.
            session.add(
                SandboxDisk(
                    sandbox_id=sandbox["id"],
                    mount_path="/left",
                    disk_id=disk["id"],
                    mount_status="pending",
                    created_at=utcnow() - dt.timedelta(seconds=disks.PENDING_STALE_S + 5),
                )
            )
    finally:
        await engine.dispose()
    for _ in range(100):  # the reconciler runs every 0.2 s here
        items = ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))["data"]
        if items[0]["mount_status"] != "pending":
            break
        await asyncio.sleep(0.05)
    assert items[0]["mount_status"] == "mounted", items
    assert (sandbox["id"], "/left") in fake_host.disks


async def test_a_detach_during_the_mount_leaves_nothing_mounted(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    disk = await new_disk(api, "data")
    sandbox = await new_sandbox(api)
    fake_host.mount_delay_s = 0.5
    ok(await api.post(f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": "data", "mount_path": "/m"}))
    ok(await api.delete(f"/v1/sandboxes/{sandbox['id']}/disks/{disk['id']}", params={"mount_path": "/m"}))
    for _ in range(100):  # the host answers the mount after the detach; the control plane undoes it
        if [c for c in fake_host.calls if c[0] == "detach_disk"] == [
            ("detach_disk", f"{sandbox['id']} /m")
        ] * 2:
            break
        await asyncio.sleep(0.05)
    assert (sandbox["id"], "/m") not in fake_host.disks, fake_host.calls
    assert ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))["data"] == []


async def test_an_endpoint_is_stored_re_serialised(api: httpx.AsyncClient) -> None:
    config = {"bucket": "b", "endpoint": "HTTP://127.0.0.1:09000/", "region": "eu-west-1"}
    created = await new_disk(api, "canon", config=config)
    assert created["config"]["endpoint"] == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    "path",
    ["/proc", "/proc/self", "/dev", "/dev/shm", "/sys/fs", "/", "//", "/a//b", "/a/./b", "/a b", "/a\tb"],
)
async def test_mount_paths_on_the_sandboxs_kernel_filesystems_or_not_clean_are_400(
    api: httpx.AsyncClient, fake_host: FakeHostLink, path: str
) -> None:
    """A disk over /proc or /dev hides the sandbox's own, and its detach unmounted them with it."""
    await new_disk(api, "data")
    sandbox = await new_sandbox(api)
    attach = await api.post(
        f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": "data", "mount_path": path}
    )
    assert "mount_path" in fail(attach, 400, "VALIDATION_FAILED")
    create = await api.post(
        "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "disks": [{"disk_id": "data", "mount_path": path}]}
    )
    assert "disks[0].mount_path" in fail(create, 400, "VALIDATION_FAILED")
    detach = await api.delete(f"/v1/sandboxes/{sandbox['id']}/disks/data", params={"mount_path": path})
    assert "mount_path" in fail(detach, 400, "VALIDATION_FAILED")
    assert ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))["data"] == []
    assert not fake_host.disks


async def test_a_mount_its_host_could_not_restore_is_shown_as_error(
    api: httpx.AsyncClient, controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    """The host's heartbeat names the mounts it holds as failed (after its restart, say): the API
    shows them ``error`` with the host's reason, no longer ``mounted``."""
    await new_disk(api, "data")
    sandbox = await new_sandbox(
        api,
        disks=[{"disk_id": "data", "mount_path": "/mnt/a"}, {"disk_id": "data", "mount_path": "/mnt/b"}],
    )
    assert [d["mount_status"] for d in await settled(api, sandbox["id"])] == ["mounted", "mounted"]
    reason = "credentials lost on the host; attach the disk again"
    report = {"id": sandbox["id"], "status": "running", "oom_kills": 0, "disk_errors": {"/mnt/b": reason}}
    beat = await controlplane.http.post(
        "/internal/v1/hosts/heartbeat",
        json={**HOST_BEAT, "sandboxes": [report]},
        headers={"Authorization": f"Bearer {HOST_TOKEN}"},
    )
    assert beat.status_code == 200, beat.text
    items = ok(await api.get(f"/v1/sandboxes/{sandbox['id']}/disks"))["data"]
    assert [(d["mount_path"], d["mount_status"], d.get("mount_error")) for d in items] == [
        ("/mnt/a", "mounted", None),
        ("/mnt/b", "error", reason),
    ]
