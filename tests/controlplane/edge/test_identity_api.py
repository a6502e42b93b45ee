"""Identity, catalog and probes through real HTTP, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from paddock_controlplane.resources import accounts
from paddock_core.db import make_engine, make_sessionmaker, transaction
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane

pytestmark = pytest.mark.db


async def test_shapes_are_public_even_with_a_bad_key(controlplane: ControlPlane) -> None:
    for headers in ({}, {"X-Api-Key": "pdk_not-a-real-key"}):
        resp = await controlplane.http.get("/v1/shapes", headers=headers)
        assert resp.status_code == 200
        body = resp.json()
        assert body["status"] == "success"
        ids = [s["id"] for s in body["data"]["data"]]
        assert ids[0] == "s-0.25vcpu-512mb" and ids[-1] == "s-8vcpu-16gb" and len(ids) == 11
        assert body["data"]["data"][0]["cpu_quota_pct"] == 25
        assert "cpu_quota_pct" not in body["data"]["data"][2]
        assert body["data"]["pagination"] == {"total": 11, "limit": 50, "offset": 0, "count": 11}


async def test_shapes_pagination_and_bad_limit(controlplane: ControlPlane) -> None:
    page = (await controlplane.http.get("/v1/shapes", params={"limit": 3, "offset": 9})).json()["data"]
    assert [s["id"] for s in page["data"]] == ["s-8vcpu-8gb", "s-8vcpu-16gb"]
    assert page["pagination"] == {"total": 11, "limit": 3, "offset": 9, "count": 2}
    assert (await controlplane.http.get("/v1/shapes", params={"limit": 9999})).json()["data"]["pagination"][
        "limit"
    ] == 500
    bad = await controlplane.http.get("/v1/shapes", params={"limit": 0})
    assert bad.status_code == 400
    assert bad.json() == {
        "status": "fail",
        "data": {
            "code": "VALIDATION_FAILED",
            "message": "limit: must be at least 1",
            "limit": "must be at least 1",
        },
    }
    assert (await controlplane.http.get("/v1/shapes", params={"offset": "x"})).status_code == 400


async def test_whoami_with_key_and_401_without(controlplane: ControlPlane) -> None:
    user_id, key = await controlplane.new_user()
    resp = await controlplane.http.get("/v1/whoami", headers={"X-Api-Key": key})
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "success",
        "data": {
            "user_id": user_id,
            "stats": {"running": 0, "paused": 0, "other": 0, "total": 0},
            # This server's extension (issue #32): credits left and spent so far.
            "credits": {"balance": 500.0, "spent": 0.0},
        },
    }
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.headers["x-request-id"].startswith("req_")
    for headers in ({}, {"X-Api-Key": "pdk_wrong"}, {"X-Api-Key": key + "x"}):
        denied = await controlplane.http.get("/v1/whoami", headers=headers)
        assert denied.status_code == 401
        assert denied.json()["status"] == "fail"
        assert denied.json()["data"]["code"] == "UNAUTHORIZED"


async def test_revoked_key_gets_401(controlplane: ControlPlane) -> None:
    user_id, key = await controlplane.new_user()
    assert (await controlplane.http.get("/v1/whoami", headers={"X-Api-Key": key})).status_code == 200
    engine = make_engine(controlplane.settings.database_url)
    async with transaction(make_sessionmaker(engine)) as session:
        (row,) = await accounts.list_keys(session, user_id)
        await accounts.revoke_key(session, row.id)
    await engine.dispose()
    # Revocation applies within the auth cache's lifetime (1 s by default).
    await asyncio.sleep(controlplane.settings.hot_cache_ttl_s + 0.1)
    resp = await controlplane.http.get("/v1/whoami", headers={"X-Api-Key": key})
    assert resp.status_code == 401 and resp.json()["data"]["code"] == "UNAUTHORIZED"


async def test_probes_are_public_and_jsend(controlplane: ControlPlane) -> None:
    assert (await controlplane.http.get("/healthz", headers={"X-Api-Key": "bad"})).json() == {
        "status": "success",
        "data": {"up": True},
    }
    ready = await controlplane.http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["data"]["ready"] is True
    assert isinstance(ready.json()["data"]["scheduler_last_ok_ms_ago"], int)


async def test_unknown_route_and_wrong_method_are_jsend(controlplane: ControlPlane) -> None:
    missing = await controlplane.http.get("/v1/nope")
    assert missing.status_code == 404
    assert missing.json()["data"]["code"] == "NOT_FOUND"
    wrong = await controlplane.http.delete("/v1/shapes")
    assert wrong.status_code == 405
    assert wrong.json()["status"] == "fail" and wrong.json()["data"]["code"] == "METHOD_NOT_ALLOWED"


async def test_heartbeat_registers_host_and_offers_its_images(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user()
    empty = (await controlplane.http.get("/v1/rootfs")).json()["data"]
    assert empty == {"rootfs": [], "default": "debian:13"}
    beat = {
        "id": "host-eu-1",
        "url": "http://127.0.0.1:1",
        "free_mib": 20000,
        "total_mib": 22000,
        "vm_count": 0,
        "rootfses": ["debian:13"],
        "buildable": ["devbox:1"],
        "labels": {"zone": "a"},
    }
    denied = await controlplane.http.post("/internal/v1/hosts/heartbeat", json=beat)
    assert denied.status_code == 401
    ok = await controlplane.http.post(
        "/internal/v1/hosts/heartbeat", json=beat, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
    )
    assert ok.status_code == 200
    hosts = (await controlplane.http.get("/v1/hosts", headers={"X-Api-Key": key})).json()["data"]
    assert hosts["data"] == [
        {
            "id": "host-eu-1",
            "status": "active",
            "free_mib": 20000,
            "vm_count": 0,
            "rootfses": ["debian:13"],
            "labels": {"zone": "a"},  # additive: what node_selector matches
        }
    ]
    rootfs = (await controlplane.http.get("/v1/rootfs")).json()["data"]
    assert rootfs["rootfs"] == ["devbox:1", "debian:13"]
    assert rootfs["default"] == "debian:13"
    assert [e["name"] for e in rootfs["entries"]] == ["devbox:1", "debian:13"]
    assert (await controlplane.http.get("/v1/hosts")).status_code == 401


async def test_openapi_document_is_served(controlplane: ControlPlane) -> None:
    doc = (await controlplane.http.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    assert "/v1/whoami" in doc["paths"]
