"""The control plane's sandbox rules (§11.3–§11.9, §13, §14) over real HTTP on both engines.

The host is the unit-test seam here (``FakeHostLink``); tests/integration runs the same paths on real
sandboxes under runc.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from paddock_controlplane.records import queries, validation
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, fake_hosts
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink

pytestmark = pytest.mark.db


@pytest.fixture
async def fake_host(
    controlplane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FakeHostLink]:
    link = fake_hosts(monkeypatch)
    resp = await controlplane.http.post(
        "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
    )
    assert resp.status_code == 200
    yield link


@pytest.fixture
async def api(controlplane: ControlPlane, fake_host: FakeHostLink) -> httpx.AsyncClient:
    _, key = await controlplane.new_user("pro")
    controlplane.http.headers["X-Api-Key"] = key
    return controlplane.http


def fail_data(resp: httpx.Response) -> dict[str, str]:
    body = resp.json()
    assert body["status"] == "fail", body
    return dict(body["data"])


async def test_create_returns_running_sandbox_and_get_agrees(api: httpx.AsyncClient) -> None:
    resp = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "envs": {"TOKEN": "s3cret"}})
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["status"] == "running" and data["id"].startswith("sb-") and len(data["id"]) == 29
    assert data["rootfs"] == "debian:13" and data["disk_mib"] == 10240 and data["region"] == "eu"
    assert data["bandwidth_quota_bytes"] == 5368709120 and data["egress"] == [] and data["ip"]
    assert "ingress_url_template" not in data
    got = (await api.get(f"/v1/sandboxes/{data['id']}")).json()["data"]
    assert got["status"] == "running" and got["envs"] == ["TOKEN"]
    assert "s3cret" not in (await api.get(f"/v1/sandboxes/{data['id']}")).text
    assert (await api.get("/v1/whoami")).json()["data"]["stats"] == {
        "running": 1,
        "paused": 0,
        "other": 0,
        "total": 1,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "shape"),
        ({"shape": "s-3vcpu"}, "shape"),
        ({"shape": "s-1vcpu-1gb", "name": "sb-mine"}, "name"),
        ({"shape": "s-1vcpu-1gb", "disk_mib": 100}, "disk_mib"),
        ({"shape": "s-1vcpu-1gb", "egress": ["example.com", "bad host!"]}, "egress[1]"),
        ({"shape": "s-1vcpu-1gb", "egress": ["*", "example.com"]}, "egress[0]"),
        ({"shape": "s-1vcpu-1gb", "egress": ["example.com:99999"]}, "egress[0]"),
        ({"shape": "s-1vcpu-1gb", "envs": {"1BAD": "x"}}, "envs"),
        ({"shape": "s-1vcpu-1gb", "envs": {"BIG": "x" * 5000}}, "envs"),
        ({"shape": "s-1vcpu-1gb", "ssh_pubkeys": ["ssh-ed25519 !!!"]}, "ssh_pubkeys[0]"),
        ({"shape": "s-1vcpu-1gb", "auto_pause_after_seconds": 5}, "auto_pause_after_seconds"),
        ({"shape": "s-1vcpu-1gb", "bandwidth_quota_bytes": 10}, "bandwidth_quota_bytes"),
        ({"shape": "s-1vcpu-1gb", "region": "mars"}, "region"),
        ({"shape": "s-1vcpu-1gb", "disks": [{"disk_id": "d", "mount_path": "rel"}]}, "disks[0].mount_path"),
        ({"shape": 5}, "shape"),
    ],
)
async def test_bad_create_bodies_name_the_field(
    api: httpx.AsyncClient, body: dict[str, object], field: str
) -> None:
    resp = await api.post("/v1/sandboxes", json=body)
    assert resp.status_code == 400, resp.text
    data = fail_data(resp)
    assert data["code"] == "VALIDATION_FAILED" and field in data, data
    assert (await api.get("/v1/sandboxes")).json()["data"]["pagination"]["total"] == 0


async def test_malformed_json_is_400_not_500(api: httpx.AsyncClient) -> None:
    resp = await api.post("/v1/sandboxes", content=b"{nope", headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and fail_data(resp)["code"] == "VALIDATION_FAILED"
    resp = await api.post("/v1/sandboxes", json=["not", "an", "object"])
    assert resp.status_code == 400


async def test_egress_rules_are_normalised(api: httpx.AsyncClient) -> None:
    rules = [
        " Example.COM ",
        "*.svc.example.com",
        "10.0.0.0/8:443",
        "1.2.3.4:53",
        "[::1]:8080",
        "example.com",
    ]
    data = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "egress": rules})).json()["data"]
    assert data["egress"] == [
        "example.com",
        "*.svc.example.com",
        "10.0.0.0/8:443",
        "1.2.3.4:53",
        "[::1]:8080",
    ]
    sid = data["id"]
    assert (await api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["*"]})).json()["data"] == {
        "id": sid,
        "egress": [],
    }
    bad = await api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["ok.com", "no way"]})
    assert bad.status_code == 400 and "egress[1]" in fail_data(bad)
    # Bounded (each rule is an element of the host's shared firewall sets): the most is taken, one more
    # is a 400 naming the list, which stays as it was.
    most = [f"10.{i // 256}.{i % 256}.1" for i in range(validation.MAX_EGRESS_RULES)]
    put = await api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": most})
    assert put.status_code == 200 and len(put.json()["data"]["egress"]) == len(most), put.text
    bad = await api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": [*most, "10.255.255.1"]})
    assert bad.status_code == 400, bad.text
    assert f"at most {validation.MAX_EGRESS_RULES} rules" in fail_data(bad)["egress"], bad.text
    assert (await api.get(f"/v1/sandboxes/{sid}/egress")).json()["data"]["egress"] == most


async def test_region_plan_and_credit_checks(api: httpx.AsyncClient, controlplane: ControlPlane) -> None:
    resp = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "region": "us"})
    assert resp.status_code == 400 and fail_data(resp)["code"] == "REGION_MISMATCH"
    _, free_key = await controlplane.new_user("free")
    resp = await api.post("/v1/sandboxes", json={"shape": "s-2vcpu-2gb"}, headers={"X-Api-Key": free_key})
    assert resp.status_code == 403 and fail_data(resp)["code"] == "PLAN_LIMIT"
    resp = await api.post(
        "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "disk_mib": 20480}, headers={"X-Api-Key": free_key}
    )
    assert resp.status_code == 403 and fail_data(resp)["code"] == "PLAN_LIMIT"
    _, broke_key = await controlplane.new_user("pro", credits=0)
    resp = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"}, headers={"X-Api-Key": broke_key})
    assert resp.status_code == 402 and fail_data(resp)["code"] == "INSUFFICIENT_CREDIT"


async def test_parallel_creates_never_exceed_the_concurrent_cap(
    api: httpx.AsyncClient, controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user("beginner")  # cap 5
    fake_host.boot_delay_s = 0.05
    results = await asyncio.gather(
        *[
            api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"}, headers={"X-Api-Key": key})
            for _ in range(12)
        ]
    )
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) == 5 and codes.count(403) == 7, codes
    denied = next(r for r in results if r.status_code == 403)
    message = fail_data(denied)["message"]
    assert fail_data(denied)["code"] == "QUOTA_EXCEEDED" and "cap" in message and "limit" in message
    stats = (await api.get("/v1/whoami", headers={"X-Api-Key": key})).json()["data"]["stats"]
    assert stats["running"] == 5


async def test_start_paused_skips_the_cap_and_daily_cap_counts_all(
    api: httpx.AsyncClient, controlplane: ControlPlane
) -> None:
    _, key = await controlplane.new_user("free")  # cap 1, 10 per day
    h = {"X-Api-Key": key}
    assert (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"}, headers=h)).status_code == 200
    paused = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "start_paused": True}, headers=h)
    assert (
        paused.status_code == 200
        and paused.json()["data"]["status"] == "paused"
        and paused.json()["data"]["ip"]
    )
    resume = await api.post(f"/v1/sandboxes/{paused.json()['data']['id']}/resume", headers=h)
    assert resume.status_code == 403 and fail_data(resume)["code"] == "QUOTA_EXCEEDED"
    for _ in range(8):
        assert (
            await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "start_paused": True}, headers=h)
        ).status_code == 200
    eleventh = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "start_paused": True}, headers=h)
    assert eleventh.status_code == 403 and "daily" in fail_data(eleventh)["message"]


async def test_running_create_and_fork_past_the_daily_cap_are_refused_under_the_concurrent_cap(
    api: httpx.AsyncClient, controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user("free")  # cap 1, 10 per day
    h = {"X-Api-Key": key}
    paused = [
        (
            await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "start_paused": True}, headers=h)
        ).json()["data"]["id"]
        for _ in range(10)
    ]
    # Nothing runs, so only the daily cap can refuse these.
    create = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"}, headers=h)
    fork = await api.post(f"/v1/sandboxes/{paused[0]}/fork", json={}, headers=h)
    for refused in (create, fork):
        assert refused.status_code == 403 and fail_data(refused)["code"] == "QUOTA_EXCEEDED"
        assert "daily sandbox cap reached: limit 10 per day" in fail_data(refused)["message"]
    assert not [call for call in fake_host.calls if call[0] == "fork"]
    stats = (await api.get("/v1/whoami", headers=h)).json()["data"]["stats"]
    assert stats["running"] == 0 and stats["paused"] == 10


async def test_names_are_unique_among_live_sandboxes(api: httpx.AsyncClient) -> None:
    first = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "worker"})).json()["data"]
    dup = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "worker"})
    assert dup.status_code == 409 and fail_data(dup)["code"] == "ALREADY_EXISTS"
    await api.post(f"/v1/sandboxes/{first['id']}/pause")
    assert (await api.delete(f"/v1/sandboxes/{first['id']}")).json()["data"] == {
        "id": first["id"],
        "status": "destroyed",
    }
    assert (
        await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "worker"})
    ).status_code == 200


async def test_no_capacity_is_503_with_retry_after_and_creates_nothing(api: httpx.AsyncClient) -> None:
    resp = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "node_selector": {"zone": "b"}})
    assert resp.status_code == 503
    body = resp.json()
    assert body["status"] == "error" and body["code"] == 503
    assert body["message"] == 'no host with capacity: no active host matches node_selector {"zone": "b"}'
    assert 1 <= int(resp.headers["retry-after"]) <= 30
    unknown = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "host_id": "host-nope"})
    assert unknown.status_code == 400 and "host_id" in fail_data(unknown)
    ok = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "node_selector": {"zone": "a"}})
    assert ok.status_code == 200
    assert (await api.get("/v1/sandboxes")).json()["data"]["pagination"]["total"] == 1


async def test_boot_failure_is_500_and_row_failed(api: httpx.AsyncClient, fake_host: FakeHostLink) -> None:
    fake_host.fail_boot = True
    resp = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert resp.status_code == 500 and resp.json()["status"] == "error" and resp.json()["code"] == 500
    rows = (await api.get("/v1/sandboxes", params={"status": "failed"})).json()["data"]["data"]
    assert len(rows) == 1 and rows[0]["status"] == "failed"


async def test_a_vm_hosts_boot_has_the_longer_deadline(
    api: httpx.AsyncClient,
    fake_host: FakeHostLink,
    controlplane: ControlPlane,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A TCG boot on a loaded VM host outlasts a container's deadline (CI saw 45 s go by); the control
    plane must not give up on a boot the host would finish."""
    monkeypatch.setattr(controlplane.settings, "boot_timeout_s", 0.3)
    monkeypatch.setattr(controlplane.settings, "vm_boot_timeout_s", 10.0)
    fake_host.boot_delay_s = 1.0
    slow_container = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert slow_container.status_code == 500, slow_container.text
    assert "boot deadline exceeded" in slow_container.json()["message"]
    fake_host.runtime = "qemu"
    slow_vm = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert slow_vm.status_code == 200, slow_vm.text
    assert slow_vm.json()["data"]["status"] == "running"


async def test_lifecycle_pause_resume_destroy(api: httpx.AsyncClient, fake_host: FakeHostLink) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    paused = (await api.post(f"/v1/sandboxes/{sid}/pause")).json()["data"]
    assert paused["status"] == "paused" and "paused_at" in paused
    again = await api.post(f"/v1/sandboxes/{sid}/pause")
    assert again.status_code == 409 and fail_data(again)["code"] == "INVALID_STATE"
    assert (await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})).status_code == 409
    resumed = (await api.post(f"/v1/sandboxes/{sid}/resume")).json()["data"]
    assert resumed["status"] == "running" and "last_resumed_at" in resumed
    gone = (await api.delete(f"/v1/sandboxes/{sid}")).json()["data"]
    assert gone == {"id": sid, "status": "destroying"}
    for _ in range(100):
        if (await api.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "destroyed":
            break
        await asyncio.sleep(0.02)
    view = (await api.get(f"/v1/sandboxes/{sid}")).json()["data"]
    assert view["status"] == "destroyed" and "destroyed_at" in view
    assert (await api.delete(f"/v1/sandboxes/{sid}")).json()["data"] == {"id": sid, "status": "destroyed"}
    assert ("destroy", sid) in fake_host.calls
    assert (await api.post(f"/v1/sandboxes/{sid}/resume")).status_code == 409


async def test_fork_inherits_settings_and_settles_running(api: httpx.AsyncClient) -> None:
    src = (
        await api.post(
            "/v1/sandboxes",
            json={
                "shape": "s-1vcpu-1gb",
                "envs": {"A": "1"},
                "egress": ["example.com"],
                "ingress_enabled": True,
            },
        )
    ).json()["data"]
    bad = await api.post(f"/v1/sandboxes/{src['id']}/fork", json={"bandwidth_quota_bytes": 1})
    assert bad.status_code == 400
    child = (await api.post(f"/v1/sandboxes/{src['id']}/fork", json={})).json()["data"]
    assert child["status"] == "forking" and child["forked_from"] == src["id"] and child["id"] != src["id"]
    for _ in range(100):
        view = (await api.get(f"/v1/sandboxes/{child['id']}")).json()["data"]
        if view["status"] == "running":
            break
        await asyncio.sleep(0.02)
    assert view["status"] == "running" and view["envs"] == ["A"] and view["egress"] == ["example.com"]
    assert view["ingress_url_template"] == f"https://<port>-{child['id']}.sandbox.localhost"
    assert (await api.get(f"/v1/sandboxes/{src['id']}")).json()["data"]["status"] == "running"


async def test_fork_of_a_sandbox_not_the_callers_is_404_and_forks_nothing(
    api: httpx.AsyncClient, controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    src = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    _, stranger = await controlplane.new_user("pro")
    theirs = await api.post(f"/v1/sandboxes/{src}/fork", json={}, headers={"X-Api-Key": stranger})
    assert theirs.status_code == 404 and fail_data(theirs)["message"] == "sandbox not found"
    missing = await api.post("/v1/sandboxes/sb-01m8gvxxys6pbnxsbjgz4jy000/fork", json={})
    assert missing.status_code == 404 and fail_data(missing)["message"] == "sandbox not found"
    await asyncio.sleep(0.05)  # a fork's boot would have reached the host by now
    assert not [call for call in fake_host.calls if call[0] == "fork"]
    listed = (await api.get("/v1/sandboxes")).json()["data"]["data"]
    assert [sandbox["id"] for sandbox in listed] == [src]


async def test_exec_env_overrides_only_for_declared_keys(api: httpx.AsyncClient) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "envs": {"MODE": "a"}})).json()[
        "data"
    ]["id"]
    out = (
        await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "printenv", "env": {"MODE": "b"}})
    ).json()["data"]
    assert out["result"] == {"stdout": "MODE=b\n", "stderr": "", "exit_code": 0} and out["exec_ms"] >= 0
    new_key = await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "printenv", "env": {"OTHER": "x"}})
    assert new_key.status_code == 400 and "env.OTHER" in fail_data(new_key)
    missing = (await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "missing"})).json()["data"]["result"]
    assert missing["exit_code"] == -1 and "not found" in missing["error"]


async def test_exec_stream_frames(api: httpx.AsyncClient) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    resp = await api.post(
        f"/v1/sandboxes/{sid}/exec", params={"stream": "true"}, json={"cmd": "x", "stream": True}
    )
    assert resp.headers["content-type"].startswith("application/x-ndjson")
    assert resp.text.splitlines() == [
        '{"hb":true}',
        '{"stdout":"one\\n"}',
        '{"stderr":"two\\n"}',
        '{"exit_code":3}',
    ]


async def test_patch_resize_ssh_bandwidth(api: httpx.AsyncClient, controlplane: ControlPlane) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    view = (await api.patch(f"/v1/sandboxes/{sid}", json={"ingress_enabled": True})).json()["data"]
    assert view["ingress_url_template"].startswith("https://<port>-sb-")
    view = (await api.patch(f"/v1/sandboxes/{sid}", json={"auto_pause_after_seconds": 120})).json()["data"]
    assert view["auto_pause_after_seconds"] == 120
    view = (await api.patch(f"/v1/sandboxes/{sid}", json={"disable_auto_pause": True})).json()["data"]
    assert "auto_pause_after_seconds" not in view
    assert (await api.patch(f"/v1/sandboxes/{sid}", json={"auto_pause_after_seconds": 10})).status_code == 400
    assert (await api.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": 10240})).status_code == 400
    assert (await api.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": 60000})).status_code == 403
    assert (await api.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": 20480})).json()["data"] == {
        "id": sid,
        "disk_mib": 20480,
    }
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG8ap9k0pW3o4S1jR7x5m9Qv9XyZ7mFh2cK1mB5fQe3H me@host"
    assert (await api.post(f"/v1/sandboxes/{sid}/ssh-pubkeys", json={"keys": [key, key]})).json()["data"] == {
        "count": 1
    }
    bad = await api.post(f"/v1/sandboxes/{sid}/ssh-pubkeys", json={"keys": [key, "nope"]})
    assert bad.status_code == 400 and "keys[1]" in fail_data(bad)
    bw = (await api.post(f"/v1/sandboxes/{sid}/bandwidth/recharge", json={"add_bytes": 1000})).json()["data"]
    assert bw == {
        "id": sid,
        "quota_bytes": 5368710120,
        "used_bytes": 0,
        "ingress_bytes": 0,
        "remaining_bytes": 5368710120,
        "capped": False,
    }
    assert (
        await api.post(f"/v1/sandboxes/{sid}/bandwidth/recharge", json={"add_bytes": 0})
    ).status_code == 400
    _, other = await controlplane.new_user()
    hidden = await api.post(
        f"/v1/sandboxes/{sid}/bandwidth/recharge", json={"add_bytes": 0}, headers={"X-Api-Key": other}
    )
    assert hidden.status_code == 404 and fail_data(hidden)["message"] == "sandbox not found"


async def test_files_round_trip_and_errors(api: httpx.AsyncClient) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    payload = bytes(range(256)) * 100
    put = await api.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/a.bin"}, content=payload)
    assert put.json()["data"] == {"path": "/root/a.bin", "size": len(payload)}
    got = await api.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/a.bin"})
    assert got.content == payload and got.headers["content-type"] == "application/octet-stream"
    assert (await api.get(f"/v1/sandboxes/{sid}/files", params={"path": "relative"})).status_code == 400
    assert (await api.get(f"/v1/sandboxes/{sid}/files", params={"path": "/nope"})).status_code == 404


async def test_list_pagination_status_filter_and_by_ip(api: httpx.AsyncClient) -> None:
    made = [
        (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"] for _ in range(3)
    ]
    page = (await api.get("/v1/sandboxes", params={"limit": 2, "offset": 1})).json()["data"]
    assert [s["id"] for s in page["data"]] == [made[1]["id"], made[2]["id"]]
    assert page["pagination"] == {"total": 3, "limit": 2, "offset": 1, "count": 2}
    assert (await api.get("/v1/sandboxes", params={"status": "bogus"})).status_code == 400
    found = (await api.get(f"/v1/sandboxes/by-ip/{made[0]['ip']}")).json()["data"]
    assert found["id"] == made[0]["id"]
    assert (await api.get("/v1/sandboxes/by-ip/not-an-ip")).status_code == 400
    assert (await api.get("/v1/sandboxes/by-ip/10.99.99.99")).status_code == 404


async def test_exec_answers_the_same_in_the_fast_lane_and_the_route(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    """A buffered exec is served by the fast lane; ``?stream=false`` sends the same request through the
    FastAPI route. Every answer a user can get must be the same either way."""
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "envs": {"MODE": "a"}})).json()[
        "data"
    ]["id"]
    paused = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "start_paused": True})).json()[
        "data"
    ]["id"]
    key = api.headers["X-Api-Key"]
    cases = [
        (sid, {"cmd": "printenv", "env": {"MODE": "b"}}, key, 200),
        (sid, {"cmd": "missing"}, key, 200),
        (sid, {"cmd": "printenv", "env": {"OTHER": "x"}}, key, 400),
        (sid, {"cmd": ""}, key, 400),
        (sid, {"cmd": "true"}, "pdk_not_a_key", 401),
        (sid, {"cmd": "true"}, "", 401),
        ("sb-000000000000000000000000000", {"cmd": "true"}, key, 404),
        (paused, {"cmd": "true"}, key, 409),
    ]
    for sandbox_id, body, api_key, status in cases:
        answers = []
        for params in ({}, {"stream": "false"}):
            resp = await api.post(
                f"/v1/sandboxes/{sandbox_id}/exec", json=body, params=params, headers={"X-Api-Key": api_key}
            )
            assert resp.headers["x-request-id"].startswith("req_")
            data = resp.json()
            if isinstance(data.get("data"), dict):
                data["data"].pop("exec_ms", None)
            answers.append((resp.status_code, data))
        assert answers[0] == answers[1], (body, api_key, answers)
        assert answers[0][0] == status, (body, answers[0])


async def test_get_with_wait_for_answers_when_the_state_changes(
    api: httpx.AsyncClient, fake_host: FakeHostLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``?wait_for=running`` on a forking child answers the moment the fork lands, not on a poll tick."""
    monkeypatch.setattr(queries, "REREAD_S", 30.0)  # only the commit's wake-up can end the wait early
    src = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    fake_host.boot_delay_s = 0.6
    # The fork answers once its host has (a refusal for room is a 503): its child is read while forking.
    forking = asyncio.create_task(api.post(f"/v1/sandboxes/{src}/fork", json={}))
    child = await _forking_child(api)
    # The bounds are far apart so that a loaded box cannot blur them: the fork lands after 0.6 s, the
    # wait gives up at 20 s and the poll would re-read at 30 s; an answer before 10 s is the wake-up.
    started = asyncio.get_running_loop().time()
    resp = await api.get(f"/v1/sandboxes/{child}", params={"wait_for": "running", "wait_ms": "20000"})
    waited_s = asyncio.get_running_loop().time() - started
    assert resp.status_code == 200 and resp.json()["data"]["status"] == "running"
    assert 0.3 < waited_s < 10.0, waited_s
    assert (await forking).status_code == 200

    # A state the sandbox will not leave on its own answers at once, whatever was asked (not at 20 s).
    started = asyncio.get_running_loop().time()
    now = await api.get(f"/v1/sandboxes/{src}", params={"wait_for": "paused", "wait_ms": "20000"})
    assert now.json()["data"]["status"] == "running"
    assert asyncio.get_running_loop().time() - started < 10.0

    # The wait ends at wait_ms with the sandbox as it is then.
    fake_host.boot_delay_s = 3.0
    forking = asyncio.create_task(api.post(f"/v1/sandboxes/{src}/fork", json={}))
    slow = await _forking_child(api)
    started = asyncio.get_running_loop().time()
    held = await api.get(f"/v1/sandboxes/{slow}", params={"wait_for": "running", "wait_ms": "300"})
    # Still forking: it answered before the fork landed (3 s), at wait_ms and not at once.
    assert held.json()["data"]["status"] == "forking"
    assert 0.25 < asyncio.get_running_loop().time() - started < 3.0
    assert (await forking).status_code == 200


async def _forking_child(api: httpx.AsyncClient) -> str:
    """The id of the child a fork in flight is booting (listed ``forking`` once its row is written)."""
    for _ in range(100):
        listed = (await api.get("/v1/sandboxes", params={"limit": 100})).json()["data"]["data"]
        forking = [view["id"] for view in listed if view["status"] == "forking"]
        if forking:
            return str(forking[0])
        await asyncio.sleep(0.01)
    raise AssertionError("no child is forking")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"wait_for": "sleeping"}, "wait_for"),
        ({"wait_for": "running", "wait_ms": "soon"}, "wait_ms"),
        ({"wait_for": "running", "wait_ms": "30001"}, "wait_ms"),
        ({"wait_ms": "100"}, "wait_ms"),
    ],
)
async def test_get_with_bad_wait_params_is_400_naming_the_field(
    api: httpx.AsyncClient, params: dict[str, str], field: str
) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    resp = await api.get(f"/v1/sandboxes/{sid}", params=params)
    assert resp.status_code == 400 and field in fail_data(resp), resp.text


async def test_a_create_its_destroy_overtook_on_the_host_ends_destroyed_not_500(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    """The destroy of a booting sandbox reached its host before the create did, so the host refused the
    create (it remembers the destroyed id): the create answers the sandbox being destroyed, not a 500,
    and it ends destroyed."""
    fake_host.boot_gone = True  # its create waits for the destroy, then is refused
    creating = asyncio.create_task(api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"}))
    deadline = asyncio.get_running_loop().time() + 10
    listed: list[dict[str, str]] = []
    while not listed and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
        listed = (await api.get("/v1/sandboxes")).json()["data"]["data"]
    assert listed, "the create never recorded its sandbox"
    sandbox_id = listed[0]["id"]
    assert (await api.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 200
    created = await creating
    assert created.status_code == 200, created.text
    assert created.json()["data"]["status"] in ("destroying", "destroyed"), created.json()
    status = ""
    while status != "destroyed" and asyncio.get_running_loop().time() < deadline:
        status = (await api.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"]
        await asyncio.sleep(0.05)
    assert status == "destroyed"
