"""Private networks in the control plane (§10.14, §11.10, §11.12, §14) over real HTTP on both engines.

The host is the unit-test seam (``FakeHostLink``, which records the attach/detach calls it gets);
tests/network/test_private_networks.py drives the same paths on real sandboxes and bridges.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core import tls
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import fake_host

__all__ = ["fake_host"]

pytestmark = pytest.mark.db

SHAPE = "s-1vcpu-1gb"


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # Webhook deliveries go to a closed loopback port; the tests read the outbox, not the receiver.
    return cp_settings.model_copy(update={"webhook_allow_private_targets": True})


async def client_for(controlplane: ControlPlane, plan: str = "pro", credits: int = 500) -> httpx.AsyncClient:
    _, key = await controlplane.new_user(plan, credits)
    # One TLS context for all (tls.py): httpx would load the CA bundle per client, ~50 ms each
    return httpx.AsyncClient(
        base_url=controlplane.url, headers={"X-Api-Key": key}, timeout=30, verify=tls.client_context()
    )


@pytest.fixture
async def api(controlplane: ControlPlane, fake_host: FakeHostLink) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(controlplane) as client:
        yield client


def ok(resp: httpx.Response) -> Any:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "success", body
    return body["data"]


def fail(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["status"] == "fail" and body["data"]["code"] == code, body
    return dict(body["data"])


async def new_network(api: httpx.AsyncClient, name: str = "backend") -> dict[str, Any]:
    return dict(ok(await api.post("/v1/networks", json={"name": name})))


async def new_sandbox(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    return dict(ok(await api.post("/v1/sandboxes", json={"shape": SHAPE, **body})))


async def test_crud_round_trip(api: httpx.AsyncClient) -> None:
    created = await new_network(api, "backend")
    assert created["id"].startswith("net_") and len(created["id"]) == 30
    assert created["name"] == "backend" and created["member_count"] == 0
    assert created["created_at"].endswith("Z")
    second = await new_network(api, "backend")  # names need not be unique
    assert second["id"] != created["id"]
    assert ipaddress.ip_network(second["cidr"]) != ipaddress.ip_network(created["cidr"])
    listed = ok(await api.get("/v1/networks", params={"limit": 1}))
    assert listed["pagination"] == {"total": 2, "limit": 1, "offset": 0, "count": 1}
    assert listed["data"] == [created] and "members" not in listed["data"][0]
    page2 = ok(await api.get("/v1/networks", params={"limit": 1, "offset": 1}))["data"]
    assert [item["id"] for item in page2] == [second["id"]]
    detail = ok(await api.get(f"/v1/networks/{created['id']}"))
    assert detail["members"] == [] and detail["name"] == "backend"
    assert ok(await api.delete(f"/v1/networks/{created['id']}")) == {"ok": True}
    fail(await api.get(f"/v1/networks/{created['id']}"), 404, "NOT_FOUND")
    fail(await api.delete(f"/v1/networks/{created['id']}"), 404, "NOT_FOUND")
    assert [n["id"] for n in ok(await api.get("/v1/networks"))["data"]] == [second["id"]]


@pytest.mark.parametrize(
    "body", [{}, {"name": ""}, {"name": "   "}, {"name": "x" * 64}, {"name": 7}, {"name": None}]
)
async def test_bad_names_are_400_naming_the_field(api: httpx.AsyncClient, body: dict[str, Any]) -> None:
    data = fail(await api.post("/v1/networks", json=body), 400, "VALIDATION_FAILED")
    assert "name" in data, data
    assert ok(await api.get("/v1/networks"))["pagination"]["total"] == 0


async def test_another_users_network_is_404_everywhere(
    api: httpx.AsyncClient, controlplane: ControlPlane
) -> None:
    mine = await new_network(api)
    async with await client_for(controlplane) as other:
        theirs_sandbox = await new_sandbox(other)
        fail(await other.get(f"/v1/networks/{mine['id']}"), 404, "NOT_FOUND")
        fail(await other.delete(f"/v1/networks/{mine['id']}"), 404, "NOT_FOUND")
        assert ok(await other.get("/v1/networks"))["data"] == []
        attach = await other.post(f"/v1/sandboxes/{theirs_sandbox['id']}/networks", json={"id": mine["id"]})
        fail(attach, 404, "NOT_FOUND")
        data = fail(
            await other.post("/v1/sandboxes", json={"shape": SHAPE, "networks": [{"id": mine["id"]}]}),
            404,
            "NOT_FOUND",
        )
        assert "networks[0].id" in data["message"]
        assert ok(await other.get("/v1/sandboxes"))["pagination"]["total"] == 1  # nothing was created
        # and my sandbox cannot be touched by them either
    sandbox = await new_sandbox(api)
    async with await client_for(controlplane) as other:
        theirs = await new_network(other)
        resp = await api.post(f"/v1/sandboxes/{sandbox['id']}/networks", json={"id": theirs["id"]})
        assert fail(resp, 404, "NOT_FOUND")["message"] == "network not found"
        resp = await other.post(f"/v1/sandboxes/{sandbox['id']}/networks", json={"id": theirs["id"]})
        assert fail(resp, 404, "NOT_FOUND")["message"] == "sandbox not found"


async def test_create_with_networks_joins_them_with_addresses(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    net_a, net_b = await new_network(api, "a"), await new_network(api, "b")
    refs = [{"id": net_a["id"]}, {"id": net_b["id"]}, {"id": net_a["id"]}]  # duplicates ignored
    first = await new_sandbox(api, name="web", networks=refs)
    second = await new_sandbox(api, name="db", networks=[{"id": net_a["id"]}])
    assert [n["id"] for n in first["networks"]] == [net_a["id"], net_b["id"]]
    assert all(n["status"] == "active" for n in first["networks"])
    ip_a1 = first["networks"][0]["ip"]
    ip_b1 = first["networks"][1]["ip"]
    ip_a2 = second["networks"][0]["ip"]
    assert ipaddress.ip_address(ip_a1) in ipaddress.ip_network(net_a["cidr"])
    assert ipaddress.ip_address(ip_b1) in ipaddress.ip_network(net_b["cidr"])
    assert ipaddress.ip_address(ip_a2) in ipaddress.ip_network(net_a["cidr"]) and ip_a2 != ip_a1
    assert ip_a1 != first["ip"]  # the overlay address is not the sandbox's private IP
    got = ok(await api.get(f"/v1/sandboxes/{first['id']}"))
    assert got["networks"] == first["networks"]
    listed = ok(await api.get("/v1/sandboxes"))["data"]
    assert [len(s.get("networks", [])) for s in listed] == [2, 1]
    detail = ok(await api.get(f"/v1/networks/{net_a['id']}"))
    assert detail["member_count"] == 2
    assert detail["members"] == [
        {"sandbox_id": first["id"], "status": "active", "ip": ip_a1, "name": "web"},
        {"sandbox_id": second["id"], "status": "active", "ip": ip_a2, "name": "db"},
    ]
    assert [n["member_count"] for n in ok(await api.get("/v1/networks"))["data"]] == [2, 1]
    prefix = ipaddress.ip_network(net_a["cidr"]).prefixlen
    # Joined inside the create call (one host call per boot), not by a separate attach.
    assert f"{net_a['id']} {ip_a1}/{prefix}" in fake_host.boot_networks[first["id"]]
    assert not [call for call in fake_host.calls if call[0] == "attach_network"]


async def test_create_with_a_bad_network_reference(api: httpx.AsyncClient) -> None:
    data = fail(
        await api.post("/v1/sandboxes", json={"shape": SHAPE, "networks": [{"id": ""}]}),
        400,
        "VALIDATION_FAILED",
    )
    assert "networks[0].id" in data
    net = await new_network(api)
    body = {"shape": SHAPE, "networks": [{"id": net["id"]}, {"id": "net_missing"}]}
    data = fail(await api.post("/v1/sandboxes", json=body), 404, "NOT_FOUND")
    assert "networks[1].id" in data["message"]
    assert ok(await api.get("/v1/sandboxes"))["pagination"]["total"] == 0
    assert ok(await api.get(f"/v1/networks/{net['id']}"))["members"] == []


async def test_attach_later_and_detach(api: httpx.AsyncClient, fake_host: FakeHostLink) -> None:
    net = await new_network(api)
    sandbox = await new_sandbox(api)
    assert "networks" not in sandbox
    path = f"/v1/sandboxes/{sandbox['id']}/networks"
    assert ok(await api.post(path, json={"id": net["id"]})) == {"ok": True}
    view = ok(await api.get(f"/v1/sandboxes/{sandbox['id']}"))
    assert [n["id"] for n in view["networks"]] == [net["id"]] and view["networks"][0]["status"] == "active"
    calls = len(fake_host.calls)
    assert ok(await api.post(path, json={"id": net["id"]})) == {"ok": True}  # already a member: no-op
    assert len(fake_host.calls) == calls
    fail(await api.post(path, json={}), 400, "VALIDATION_FAILED")
    fail(await api.post(path, json={"id": "net_nope"}), 404, "NOT_FOUND")
    fail(await api.post("/v1/sandboxes/sb-nope/networks", json={"id": net["id"]}), 404, "NOT_FOUND")
    assert ok(await api.delete(f"{path}/{net['id']}")) == {"ok": True}
    assert ("detach_network", f"{sandbox['id']} {net['id']}") in fake_host.calls
    assert "networks" not in ok(await api.get(f"/v1/sandboxes/{sandbox['id']}"))
    assert ok(await api.get(f"/v1/networks/{net['id']}"))["members"] == []
    fail(await api.delete(f"{path}/{net['id']}"), 404, "NOT_FOUND")  # no longer a member


async def test_pause_and_resume_answer_with_the_memberships(api: httpx.AsyncClient) -> None:
    # Pause and resume read the row and its memberships in one statement of their own (transition.py),
    # not through the ORM's relationship: their answers must still list the networks, in join order.
    net_a, net_b = await new_network(api, "a"), await new_network(api, "b")
    sandbox = await new_sandbox(api, networks=[{"id": net_a["id"]}, {"id": net_b["id"]}])
    assert [n["id"] for n in sandbox["networks"]] == [net_a["id"], net_b["id"]]
    paused = ok(await api.post(f"/v1/sandboxes/{sandbox['id']}/pause"))
    assert paused["status"] == "paused" and paused["networks"] == sandbox["networks"]
    resumed = ok(await api.post(f"/v1/sandboxes/{sandbox['id']}/resume"))
    assert resumed["status"] == "running" and resumed["networks"] == sandbox["networks"]
    assert ok(await api.get(f"/v1/sandboxes/{sandbox['id']}"))["networks"] == sandbox["networks"]
    alone = await new_sandbox(api, name="alone")
    assert "networks" not in ok(await api.post(f"/v1/sandboxes/{alone['id']}/pause"))


async def test_attach_needs_running_detach_works_while_paused(api: httpx.AsyncClient) -> None:
    net, other = await new_network(api, "a"), await new_network(api, "b")
    sandbox = await new_sandbox(api, networks=[{"id": net["id"]}])
    ok(await api.post(f"/v1/sandboxes/{sandbox['id']}/pause"))
    path = f"/v1/sandboxes/{sandbox['id']}/networks"
    fail(await api.post(path, json={"id": other["id"]}), 409, "INVALID_STATE")
    assert ok(await api.delete(f"{path}/{net['id']}")) == {"ok": True}
    ok(await api.delete(f"/v1/sandboxes/{sandbox['id']}"))
    fail(await api.delete(f"{path}/{other['id']}"), 409, "INVALID_STATE")  # destroyed
    fail(await api.post(path, json={"id": other["id"]}), 409, "INVALID_STATE")


async def test_a_host_failure_leaves_no_membership(api: httpx.AsyncClient, fake_host: FakeHostLink) -> None:
    net = await new_network(api)
    sandbox = await new_sandbox(api)
    fake_host.fail_network = True
    resp = await api.post(f"/v1/sandboxes/{sandbox['id']}/networks", json={"id": net["id"]})
    assert resp.status_code == 500 and resp.json()["status"] == "error", resp.text
    assert ok(await api.get(f"/v1/networks/{net['id']}"))["members"] == []
    # a create whose network cannot be programmed fails like a failed boot, and holds no address
    resp = await api.post("/v1/sandboxes", json={"shape": SHAPE, "networks": [{"id": net["id"]}]})
    assert resp.status_code == 500, resp.text
    assert ok(await api.get(f"/v1/networks/{net['id']}"))["members"] == []
    fake_host.fail_network = False
    assert ok(await api.delete(f"/v1/networks/{net['id']}")) == {"ok": True}


async def test_delete_is_refused_while_members_live(api: httpx.AsyncClient) -> None:
    net = await new_network(api)
    sandbox = await new_sandbox(api, networks=[{"id": net["id"]}])
    data = fail(await api.delete(f"/v1/networks/{net['id']}"), 409, "IN_USE")
    assert "in use" in data["message"]
    ok(await api.delete(f"/v1/sandboxes/{sandbox['id']}"))
    for _ in range(100):  # a running sandbox is reclaimed in the background
        if ok(await api.get(f"/v1/sandboxes/{sandbox['id']}"))["status"] == "destroyed":
            break
        import asyncio

        await asyncio.sleep(0.05)
    assert ok(await api.get(f"/v1/networks/{net['id']}"))["member_count"] == 0
    assert ok(await api.delete(f"/v1/networks/{net['id']}")) == {"ok": True}


async def test_fork_child_does_not_inherit_memberships(api: httpx.AsyncClient) -> None:
    net = await new_network(api)
    source = await new_sandbox(api, networks=[{"id": net["id"]}])
    child = ok(await api.post(f"/v1/sandboxes/{source['id']}/fork", json={}))
    assert "networks" not in child
    import asyncio

    for _ in range(100):
        got = ok(await api.get(f"/v1/sandboxes/{child['id']}"))
        if got["status"] == "running":
            break
        await asyncio.sleep(0.05)
    assert got["status"] == "running" and "networks" not in got
    members = ok(await api.get(f"/v1/networks/{net['id']}"))["members"]
    assert [m["sandbox_id"] for m in members] == [source["id"]]


async def test_free_plan_caps(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    async with await client_for(controlplane, plan="free") as free:
        first = await new_network(free)
        data = fail(await free.post("/v1/networks", json={"name": "two"}), 403, "QUOTA_EXCEEDED")
        assert "cap" in data["message"] and "limit 1" in data["message"]
        ok(await free.delete(f"/v1/networks/{first['id']}"))
        for index in range(9):  # 10 creations a day, deletions do not give any back
            made = await new_network(free, f"n{index}")
            ok(await free.delete(f"/v1/networks/{made['id']}"))
        data = fail(await free.post("/v1/networks", json={"name": "eleventh"}), 403, "QUOTA_EXCEEDED")
        assert "daily" in data["message"]
    async with await client_for(controlplane, credits=0) as broke:
        fail(await broke.post("/v1/networks", json={"name": "x"}), 402, "INSUFFICIENT_CREDIT")


async def test_network_actions_are_announced(api: httpx.AsyncClient) -> None:
    endpoint = ok(
        await api.post(
            "/v1/webhook-endpoints",
            json={
                "url": "http://127.0.0.1:9/hook",
                "events": ["network.create", "network.attach", "network.detach", "network.delete"],
            },
        )
    )
    net = await new_network(api)
    sandbox = await new_sandbox(api)
    ok(await api.post(f"/v1/sandboxes/{sandbox['id']}/networks", json={"id": net["id"]}))
    ok(await api.delete(f"/v1/sandboxes/{sandbox['id']}/networks/{net['id']}"))
    ok(await api.delete(f"/v1/networks/{net['id']}"))
    deliveries = ok(await api.get(f"/v1/webhook-endpoints/{endpoint['id']}"))["deliveries"]
    actions = sorted(d["eventAction"] for d in deliveries)
    assert actions == ["network.attach", "network.create", "network.delete", "network.detach"]
    import json

    attach = next(d for d in deliveries if d["eventAction"] == "network.attach")
    payload = json.loads(attach["payload"]) if isinstance(attach["payload"], str) else attach["payload"]
    assert payload["data"]["network_id"] == net["id"] and payload["data"]["sandbox_id"] == sandbox["id"]


async def test_members_span_hosts_and_each_host_learns_its_peers(
    api: httpx.AsyncClient, controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    """A network spans hosts: members go wherever placement puts them (joining from another host is
    fine), and each host's heartbeat answer lists, per network with members there, the addresses of
    the other hosts that run members: the peers its VXLAN port floods to (drivers/net/bridges.py)."""
    headers = {"Authorization": f"Bearer {HOST_TOKEN}"}
    second = {**HOST_BEAT, "id": "host-test-2", "url": "http://127.0.0.2:10"}
    assert (
        await controlplane.http.post("/internal/v1/hosts/heartbeat", json=second, headers=headers)
    ).is_success
    net = await new_network(api)
    lonely = await new_network(api)
    await new_sandbox(api, host_id="host-test-2", networks=[{"id": net["id"]}, {"id": lonely["id"]}])
    await new_sandbox(api, host_id="host-test-1", networks=[{"id": net["id"]}])
    elsewhere = await new_sandbox(api, host_id="host-test-1")
    assert ok(await api.post(f"/v1/sandboxes/{elsewhere['id']}/networks", json={"id": lonely["id"]})) == {
        "ok": True
    }
    answers = {}
    for beat in (HOST_BEAT, second):
        answer = await controlplane.http.post("/internal/v1/hosts/heartbeat", json=beat, headers=headers)
        answers[beat["id"]] = answer.json()["overlay"]
    assert answers["host-test-2"] == {net["id"]: ["127.0.0.1"], lonely["id"]: ["127.0.0.1"]}
    assert answers["host-test-1"] == {net["id"]: ["127.0.0.2"], lonely["id"]: ["127.0.0.2"]}
