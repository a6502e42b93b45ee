"""Delegated sandbox access tokens (spec §12.1) over real HTTP on both engines.

The calls are the reference Python client's: create and rotate with no body and no Content-Type
(§2.2), the token sent back as ``X-Api-Key`` (§3). A token acts on its own sandbox only: 404 on any
other sandbox, 403 on account routes and on operations §12.1 keeps for the owner — in both lanes (the
pure-ASGI fast lane serves buffered exec and ``GET /v1/sandboxes/{id}``).
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from sqlalchemy import text

from paddock_core.crypto import sha256_hex
from paddock_core.db import make_engine
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fake_host

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db

TOKEN_RE = re.compile(r"sbt_[A-Za-z0-9_-]{43}")
SHAPE = {"shape": "s-1vcpu-1gb"}


async def new_sandbox(api: httpx.AsyncClient, **extra: object) -> str:
    resp = await api.post("/v1/sandboxes", json={**SHAPE, **extra})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["data"]["id"])


async def issue(api: httpx.AsyncClient, sandbox_id: str, path: str = "access-token") -> dict[str, str]:
    """As the reference client sends it: POST, no body, no Content-Type."""
    resp = await api.post(f"/v1/sandboxes/{sandbox_id}/{path}")
    assert resp.status_code == 200, resp.text
    data: dict[str, str] = resp.json()["data"]
    return data


def as_token(token: str) -> dict[str, str]:
    return {"X-Api-Key": token}


def fail(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, (resp.request.method, resp.request.url, resp.text)
    assert resp.json() == {"status": "fail", "data": resp.json()["data"]}
    assert resp.json()["data"]["code"] == code, resp.text


async def test_create_get_rotate_disable_follow_the_contract(
    api: httpx.AsyncClient, controlplane: ControlPlane
) -> None:
    sid = await new_sandbox(api)
    base = f"/v1/sandboxes/{sid}/access-token"
    never = await api.get(base)
    assert never.status_code == 200 and never.json()["data"] == {"enabled": False}

    created = await issue(api, sid)
    token = created["token"]
    assert TOKEN_RE.fullmatch(token) and created["enabled"] is True and created["created_at"]
    assert "rotated_at" not in created and "token_hint" not in created
    fail(await api.post(base), 409, "ALREADY_EXISTS")

    shown = (await api.get(base)).json()["data"]
    assert shown == {"enabled": True, "token_hint": f"sbt_…{token[-4:]}", "created_at": created["created_at"]}
    assert (await api.get(f"/v1/sandboxes/{sid}", headers=as_token(token))).status_code == 200

    # Stored hashed: the database holds the SHA-256 and the last 4 characters, never the token.
    engine = make_engine(controlplane.settings.database_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT * FROM sandbox_access_tokens"))).mappings().all()
    finally:
        await engine.dispose()
    assert len(rows) == 1 and rows[0]["token_hash"] == sha256_hex(token)
    assert not any(token in str(value) or token[4:] in str(value) for value in rows[0].values())

    rotated = await issue(api, sid, "access-token/rotate")
    assert TOKEN_RE.fullmatch(rotated["token"]) and rotated["token"] != token
    assert (
        rotated["enabled"] is True
        and rotated["created_at"] == created["created_at"]
        and rotated["rotated_at"]
    )
    # The old token stops at once (this process evicts it from the 1 s cache); the new one works.
    fail(await api.get(f"/v1/sandboxes/{sid}", headers=as_token(token)), 401, "UNAUTHORIZED")
    assert (await api.get(f"/v1/sandboxes/{sid}", headers=as_token(rotated["token"]))).status_code == 200

    disabled = await api.delete(base)
    assert disabled.status_code == 200
    assert disabled.json()["data"] == {
        "enabled": False,
        "token_hint": f"sbt_…{rotated['token'][-4:]}",
        "created_at": created["created_at"],
        "rotated_at": rotated["rotated_at"],
    }
    fail(await api.get(f"/v1/sandboxes/{sid}", headers=as_token(rotated["token"])), 401, "UNAUTHORIZED")
    again = await api.delete(base)  # idempotent
    assert again.status_code == 200 and again.json()["data"] == disabled.json()["data"]
    fail(await api.post(f"{base}/rotate"), 409, "INVALID_STATE")

    fresh = await issue(api, sid)  # a disabled token may be replaced by a new one
    assert fresh["token"] not in (token, rotated["token"]) and "rotated_at" not in fresh
    assert (await api.get(f"/v1/sandboxes/{sid}", headers=as_token(fresh["token"]))).status_code == 200


async def test_a_token_acts_on_its_own_sandbox_only(api: httpx.AsyncClient, fake_host: FakeHostLink) -> None:
    sid = await new_sandbox(api)
    other = await new_sandbox(api)  # the same owner's: still not the token's
    token = as_token((await issue(api, sid))["token"])
    own, elsewhere = f"/v1/sandboxes/{sid}", f"/v1/sandboxes/{other}"

    # What §12.1 opens to a token, on its own sandbox.
    ran = await api.post(f"{own}/exec", json={"cmd": "echo", "args": ["hi"]}, headers=token)
    assert ran.status_code == 200 and ran.json()["data"]["result"]["stdout"] == "echo hi\n"
    streamed = await api.post(f"{own}/exec", params={"stream": "true"}, json={"cmd": "echo"}, headers=token)
    assert streamed.status_code == 200 and streamed.headers["content-type"] == "application/x-ndjson"
    put = await api.put(f"{own}/files", params={"path": "/tmp/a"}, content=b"abc", headers=token)
    assert put.status_code == 200, put.text
    got = await api.get(f"{own}/files", params={"path": "/tmp/a"}, headers=token)
    assert got.status_code == 200 and got.content == b"abc"
    for method, path, body in [
        ("GET", own, None),
        ("PATCH", own, {"ingress_enabled": True}),
        ("GET", f"{own}/egress", None),
        ("PUT", f"{own}/egress", {"egress": ["example.com"]}),
        ("GET", f"{own}/bandwidth", None),
        ("GET", f"{own}/disks", None),
        (
            "POST",
            f"{own}/ssh-pubkeys",
            {"keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGd0b2tlbnRlc3RrZXkxMjM0NTY3ODkwYWJjZGVm t"]},
        ),
        ("POST", f"{own}/resize", {"disk_mib": 20480}),
        ("POST", f"{own}/pause", None),
        ("POST", f"{own}/resume", None),
    ]:
        resp = await api.request(method, path, json=body, headers=token)
        assert resp.status_code == 200, (method, path, resp.text)

    # Any other sandbox is answered as if it did not exist.
    for method, path, body in [
        ("GET", elsewhere, None),
        ("POST", f"{elsewhere}/exec", {"cmd": "true"}),
        ("GET", f"{elsewhere}/files?path=/tmp/a", None),
        ("PATCH", elsewhere, {"ingress_enabled": True}),
        ("DELETE", elsewhere, None),
        ("POST", f"{elsewhere}/pause", None),
        ("GET", f"{elsewhere}/egress", None),
        ("GET", f"{elsewhere}/disks", None),
        ("GET", "/v1/sandboxes/sb-000000000000000000000000000", None),
    ]:
        fail(await api.request(method, path, json=body, headers=token), 404, "NOT_FOUND")

    # Account routes and the operations §12.1 keeps for the owner's key.
    for method, path, body in [
        ("GET", "/v1/whoami", None),
        ("GET", "/v1/sandboxes", None),
        ("POST", "/v1/sandboxes", SHAPE),
        ("GET", "/v1/sandboxes/by-ip/10.0.0.2", None),
        ("GET", "/v1/hosts", None),
        ("GET", "/v1/networks", None),
        ("POST", "/v1/networks", {"name": "n"}),
        ("GET", "/v1/webhook-endpoints", None),
        ("POST", "/v1/webhook-endpoints", {"url": "https://example.com/hook"}),
        ("POST", f"{own}/fork", None),
        ("POST", f"{own}/bandwidth/recharge", {"add_bytes": 1}),
        ("POST", f"{own}/networks", {"id": "net_x"}),
        ("POST", f"{own}/disks", {"disk_id": "dsk_x", "mount_path": "/mnt/x"}),
        ("GET", "/v1/disks", None),
        ("POST", f"{own}/access-token", None),
        ("GET", f"{own}/access-token", None),
        ("POST", f"{own}/access-token/rotate", None),
        ("DELETE", f"{own}/access-token", None),
    ]:
        fail(await api.request(method, path, json=body, headers=token), 403, "FORBIDDEN")
    # Public routes ignore whatever key is sent (§3).
    assert (await api.get("/v1/shapes", headers=token)).status_code == 200
    # The token is still enabled after all that: 403s and 404s revoke nothing.
    assert (await api.get(f"/v1/sandboxes/{sid}/access-token")).json()["data"]["enabled"] is True

    # DELETE is allowed, and destroying the sandbox revokes its token (§11.8, §12.1).
    assert (await api.delete(own, headers=token)).status_code == 200
    for _ in range(100):
        if (await api.get(own)).json()["data"]["status"] == "destroyed":
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.1)  # a principal cached before the destroy expires
    fail(await api.get(own, headers=token), 401, "UNAUTHORIZED")
    assert (await api.get(f"{own}/access-token")).json()["data"]["enabled"] is False
    fail(await api.post(f"{own}/access-token"), 409, "INVALID_STATE")


async def test_management_is_the_owners_alone(api: httpx.AsyncClient, controlplane: ControlPlane) -> None:
    sid = await new_sandbox(api)
    _, stranger = await controlplane.new_user("pro")
    for method, suffix in [("POST", ""), ("GET", ""), ("DELETE", ""), ("POST", "/rotate")]:
        resp = await api.request(
            method, f"/v1/sandboxes/{sid}/access-token{suffix}", headers=as_token(stranger)
        )
        fail(resp, 404, "NOT_FOUND")
    fail(await api.get("/v1/sandboxes/sb-000000000000000000000000000/access-token"), 404, "NOT_FOUND")
    assert (await api.get(f"/v1/sandboxes/{sid}/access-token")).json()["data"] == {"enabled": False}


async def test_expiry_is_enforced_even_from_the_cache(api: httpx.AsyncClient) -> None:
    sid = await new_sandbox(api)
    base = f"/v1/sandboxes/{sid}/access-token"
    for bad in [0, -5, 365 * 24 * 3600 + 1, "60", 1.5, True]:
        resp = await api.post(base, json={"expires_in_seconds": bad})
        fail(resp, 400, "VALIDATION_FAILED")
        assert "expires_in_seconds" in resp.json()["data"], resp.text
    created = (await api.post(base, json={"expires_in_seconds": 2})).json()["data"]
    assert created["expires_at"] > created["created_at"]
    token = as_token(created["token"])
    assert (await api.get(f"/v1/sandboxes/{sid}", headers=token)).status_code == 200  # now cached
    await asyncio.sleep(2.1)
    fail(await api.get(f"/v1/sandboxes/{sid}", headers=token), 401, "UNAUTHORIZED")
    fail(
        await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}, headers=token), 401, "UNAUTHORIZED"
    )
    shown = (await api.get(base)).json()["data"]
    assert shown["enabled"] is False and shown["expires_at"] == created["expires_at"]
    fail(await api.post(f"{base}/rotate"), 409, "INVALID_STATE")
    # An expired token does not block a new one; without a body it never expires.
    fresh = await issue(api, sid)
    assert "expires_at" not in fresh


async def test_rotate_keeps_the_lifetime_unless_told(api: httpx.AsyncClient) -> None:
    sid = await new_sandbox(api)
    base = f"/v1/sandboxes/{sid}/access-token"
    await api.post(base, json={"expires_in_seconds": 3600})
    kept = await issue(api, sid, "access-token/rotate")
    assert kept["expires_at"] > kept["rotated_at"]
    changed = (await api.post(f"{base}/rotate", json={"expires_in_seconds": 60})).json()["data"]
    assert changed["expires_at"] < kept["expires_at"]


async def test_tokens_are_never_logged(api: httpx.AsyncClient, capfd: pytest.CaptureFixture[str]) -> None:
    sid = await new_sandbox(api)
    token = (await issue(api, sid))["token"]
    rotated = (await issue(api, sid, "access-token/rotate"))["token"]
    await api.get(f"/v1/sandboxes/{sid}", headers=as_token(token))  # a refused one
    await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}, headers=as_token(rotated))
    logged = capfd.readouterr()
    out = logged.out + logged.err
    assert f"/v1/sandboxes/{sid}/access-token" in out  # the request lines were captured
    assert token not in out and rotated not in out
    assert token[4:] not in out and rotated[4:] not in out


async def test_parallel_creates_issue_one_token(api: httpx.AsyncClient) -> None:
    sid = await new_sandbox(api)
    answers = await asyncio.gather(*(api.post(f"/v1/sandboxes/{sid}/access-token") for _ in range(6)))
    assert sorted(a.status_code for a in answers) == [200, 409, 409, 409, 409, 409], [a.text for a in answers]
    [won] = [a.json()["data"]["token"] for a in answers if a.status_code == 200]
    assert (await api.get(f"/v1/sandboxes/{sid}", headers=as_token(won))).status_code == 200
