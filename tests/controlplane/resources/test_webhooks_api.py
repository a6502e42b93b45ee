"""Webhook endpoint routes (§11.14) on a real control plane, SSRF guard on (the default)."""

from __future__ import annotations

import re

import pytest

from paddock_controlplane.resources import webhooks
from tests.controlplane.conftest import ControlPlane

pytestmark = pytest.mark.db

PUBLIC_URL = "https://203.0.114.7/hooks/paddock"  # a public address literal: no DNS, never contacted

ALL_ACTIONS = [
    "sandbox.create",
    "sandbox.destroy",
    "sandbox.pause",
    "sandbox.resume",
    "sandbox.fork",
    "sandbox.patch",
    "sandbox.resize",
    "sandbox.egress.set",
    "sandbox.ssh_pubkey.update",
    "sandbox.bandwidth.update",
    "disk.create",
    "disk.delete",
    "disk.attach",
    "disk.detach",
    "network.create",
    "network.delete",
    "network.attach",
    "network.detach",
    "template.submit",
    "template.delete",
    "template.build.start",
    "template.build.complete",
    # This server's extension, after the contract's list (issue #32): a sandbox's lifetime ran out.
    "sandbox.timeout",
    # Issue #34: a snapshot was made or deleted.
    "snapshot.create",
    "snapshot.delete",
    # Issue #34: a volume was made, grown, deleted, attached to a sandbox or detached from one.
    "volume.create",
    "volume.resize",
    "volume.delete",
    "volume.attach",
    "volume.detach",
]


def auth(key: str) -> dict[str, str]:
    return {"X-Api-Key": key}


async def test_actions_list_is_every_action_in_the_contract_order(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user()
    response = await controlplane.http.get("/v1/webhook-endpoints/actions", headers=auth(key))
    assert response.status_code == 200
    assert response.json() == {"status": "success", "data": ALL_ACTIONS}
    anonymous = await controlplane.http.get("/v1/webhook-endpoints/actions")
    assert anonymous.status_code == 401 and anonymous.json()["data"]["code"] == "UNAUTHORIZED"


async def test_create_shows_the_secret_once_and_list_and_get_never(controlplane: ControlPlane) -> None:
    user_id, key = await controlplane.new_user()
    created = await controlplane.http.post(
        "/v1/webhook-endpoints",
        json={"url": PUBLIC_URL, "events": ["sandbox.create", "disk.create", "sandbox.create"]},
        headers=auth(key),
    )
    assert created.status_code == 200, created.text
    endpoint = created.json()["data"]
    assert re.fullmatch(r"whsec_[0-9a-f]{64}", endpoint["secret"])
    assert re.fullmatch(r"wh_[0-9a-z]{26}", endpoint["id"])
    assert endpoint["url"] == PUBLIC_URL
    assert endpoint["events"] == ["sandbox.create", "disk.create"]
    assert (endpoint["active"], endpoint["failureCount"]) == (True, 0)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", endpoint["createdAt"])

    listed = (await controlplane.http.get("/v1/webhook-endpoints", headers=auth(key))).json()["data"]
    assert listed["pagination"] == {"total": 1, "limit": 50, "offset": 0, "count": 1}
    [item] = listed["data"]
    assert "secret" not in item
    assert {k: item[k] for k in ("id", "events", "active", "failureCount", "createdAt")} == {
        k: endpoint[k] for k in ("id", "events", "active", "failureCount", "createdAt")
    }

    got = await controlplane.http.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=auth(key))
    assert got.status_code == 200
    assert got.json()["data"]["deliveries"] == []
    shown = got.json()["data"]["endpoint"]
    assert "secret" not in shown and shown["id"] == endpoint["id"] and shown["userId"] == user_id
    assert endpoint["secret"] not in got.text + str(listed)


async def test_empty_or_missing_events_mean_every_action(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user()
    for body in ({"url": PUBLIC_URL}, {"url": PUBLIC_URL, "events": []}, {"url": PUBLIC_URL, "events": None}):
        response = await controlplane.http.post("/v1/webhook-endpoints", json=body, headers=auth(key))
        assert response.status_code == 200 and response.json()["data"]["events"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "url"),
        ({"url": "ftp://203.0.114.7/x"}, "url"),
        ({"url": "/relative/path"}, "url"),
        ({"url": "https://"}, "url"),
        ({"url": "http://203.0.114.7:99999/"}, "url"),
        ({"url": "https://203.0.114.7/" + "a" * 2048}, "url"),
        ({"url": 42}, "url"),
        ({"url": PUBLIC_URL, "events": ["sandbox.create", "sandbox.explode"]}, "events[1]"),
        ({"url": PUBLIC_URL, "events": "sandbox.create"}, "events"),
    ],
)
async def test_invalid_bodies_are_400_on_the_field(
    controlplane: ControlPlane, body: dict[str, object], field: str
) -> None:
    _, key = await controlplane.new_user()
    response = await controlplane.http.post("/v1/webhook-endpoints", json=body, headers=auth(key))
    assert response.status_code == 400, response.text
    data = response.json()["data"]
    assert data["code"] == "VALIDATION_FAILED" and field in data


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.10/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
    ],
)
async def test_private_and_loopback_targets_are_refused_by_default(
    controlplane: ControlPlane, url: str
) -> None:
    _, key = await controlplane.new_user()
    response = await controlplane.http.post("/v1/webhook-endpoints", json={"url": url}, headers=auth(key))
    assert response.status_code == 400, response.text
    assert "loopback, private or link-local" in response.json()["data"]["url"]


async def test_plan_maximum_on_endpoints_is_403_quota_exceeded(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user(plan="free")
    for _ in range(2):
        ok = await controlplane.http.post(
            "/v1/webhook-endpoints", json={"url": PUBLIC_URL}, headers=auth(key)
        )
        assert ok.status_code == 200
    third = await controlplane.http.post("/v1/webhook-endpoints", json={"url": PUBLIC_URL}, headers=auth(key))
    assert third.status_code == 403 and third.json()["data"]["code"] == "QUOTA_EXCEEDED"
    first_id = (await controlplane.http.get("/v1/webhook-endpoints", headers=auth(key))).json()["data"][
        "data"
    ][0]["id"]
    await controlplane.http.delete(f"/v1/webhook-endpoints/{first_id}", headers=auth(key))
    again = await controlplane.http.post("/v1/webhook-endpoints", json={"url": PUBLIC_URL}, headers=auth(key))
    assert again.status_code == 200


async def test_enterprise_has_no_endpoint_maximum(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user(plan="enterprise")
    for _ in range(8):
        ok = await controlplane.http.post(
            "/v1/webhook-endpoints", json={"url": PUBLIC_URL}, headers=auth(key)
        )
        assert ok.status_code == 200
    listed = await controlplane.http.get("/v1/webhook-endpoints?limit=3&offset=6", headers=auth(key))
    assert listed.json()["data"]["pagination"] == {"total": 8, "limit": 3, "offset": 6, "count": 2}


async def test_suspend_and_resume_are_idempotent(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user()
    endpoint_id = (
        await controlplane.http.post("/v1/webhook-endpoints", json={"url": PUBLIC_URL}, headers=auth(key))
    ).json()["data"]["id"]
    for _ in range(2):
        suspended = await controlplane.http.post(
            f"/v1/webhook-endpoints/{endpoint_id}/suspend", headers=auth(key)
        )
        assert suspended.status_code == 200
        assert suspended.json()["data"]["active"] is False and "secret" not in suspended.json()["data"]
    got = await controlplane.http.get(f"/v1/webhook-endpoints/{endpoint_id}", headers=auth(key))
    assert got.json()["data"]["endpoint"]["active"] is False
    for _ in range(2):
        resumed = await controlplane.http.post(
            f"/v1/webhook-endpoints/{endpoint_id}/resume", headers=auth(key)
        )
        assert resumed.status_code == 200
        assert (resumed.json()["data"]["active"], resumed.json()["data"]["failureCount"]) == (True, 0)


async def test_another_users_endpoint_is_404_everywhere(controlplane: ControlPlane) -> None:
    _, owner = await controlplane.new_user()
    _, stranger = await controlplane.new_user()
    endpoint_id = (
        await controlplane.http.post("/v1/webhook-endpoints", json={"url": PUBLIC_URL}, headers=auth(owner))
    ).json()["data"]["id"]
    base = f"/v1/webhook-endpoints/{endpoint_id}"
    for method, path in (
        ("GET", base),
        ("POST", base + "/suspend"),
        ("POST", base + "/resume"),
        ("DELETE", base),
    ):
        response = await controlplane.http.request(method, path, headers=auth(stranger))
        assert response.status_code == 404, (method, path)
        assert response.json()["data"]["code"] == "NOT_FOUND"
    listed = await controlplane.http.get("/v1/webhook-endpoints", headers=auth(stranger))
    assert listed.json()["data"]["data"] == []
    still = await controlplane.http.get(base, headers=auth(owner))
    assert still.status_code == 200 and still.json()["data"]["endpoint"]["active"] is True


async def test_delete_answers_deleted_and_then_404(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user()
    endpoint_id = (
        await controlplane.http.post("/v1/webhook-endpoints", json={"url": PUBLIC_URL}, headers=auth(key))
    ).json()["data"]["id"]
    deleted = await controlplane.http.delete(f"/v1/webhook-endpoints/{endpoint_id}", headers=auth(key))
    assert deleted.json() == {"status": "success", "data": {"deleted": True}}
    for method in ("GET", "DELETE"):
        gone = await controlplane.http.request(
            method, f"/v1/webhook-endpoints/{endpoint_id}", headers=auth(key)
        )
        assert gone.status_code == 404


def test_actions_constant_matches_the_contract() -> None:
    assert list(webhooks.ACTIONS) == ALL_ACTIONS
