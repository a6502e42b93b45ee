"""Both lanes scope a delegated access token alike (spec §12.1).

The pure-ASGI fast lane serves buffered exec and ``GET /v1/sandboxes/{id}`` itself; the same requests
through the FastAPI routes must be answered the same. Each test runs twice: once with every route's
caller dependency switched off (what answers was served by the fast lane; a route request shows the
switch bites), once with the fast lane taken out of the middleware stack (every request reaches a route).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.edge.api import deps
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core import errors
from paddock_core.fastlane import FastLane
from tests.conftest import LiveServer
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.resources.test_access_tokens import as_token, fail, issue, new_sandbox
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fake_host

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db


@pytest.fixture(params=["fast lane", "routes"])
def lane(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cp_app(cp_settings: ControlPlaneSettings, lane: str) -> FastAPI:
    app = create_app(cp_settings)
    if lane == "routes":
        # Starlette builds its middleware stack on the first request, from this list.
        app.user_middleware = [m for m in app.user_middleware if m.cls is not FastLane]
    return app


@pytest.fixture
async def controlplane(cp_settings: ControlPlaneSettings, cp_app: FastAPI) -> AsyncIterator[ControlPlane]:
    await migrate(cp_settings)
    async with LiveServer(cp_app) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        yield ControlPlane(url=server.url, settings=cp_settings, http=http)


async def routes_are_off() -> None:
    raise errors.Unavailable("the FastAPI routes are switched off in this test")


async def test_exec_and_get_scope_a_token_alike_in_both_lanes(
    cp_app: FastAPI, api: httpx.AsyncClient, lane: str
) -> None:
    sid = await new_sandbox(api)
    other = await new_sandbox(api)
    token = as_token((await issue(api, sid))["token"])
    if lane == "fast lane":
        cp_app.dependency_overrides[deps.get_caller] = routes_are_off
        # the switch bites: requests the fast lane does not serve reach a route and are refused
        assert (await api.get(f"/v1/sandboxes/{sid}/egress", headers=token)).status_code == 503
        streamed = await api.post(
            f"/v1/sandboxes/{sid}/exec?stream=false", json={"cmd": "true"}, headers=token
        )
        assert streamed.status_code == 503
    try:
        ran = await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": ["x"]}, headers=token)
        assert ran.status_code == 200 and ran.json()["data"]["result"]["stdout"] == "echo x\n", ran.text
        got = await api.get(f"/v1/sandboxes/{sid}", headers=token)
        assert got.status_code == 200 and got.json()["data"]["id"] == sid
        fail(
            await api.post(f"/v1/sandboxes/{other}/exec", json={"cmd": "true"}, headers=token),
            404,
            "NOT_FOUND",
        )
        fail(await api.get(f"/v1/sandboxes/{other}", headers=token), 404, "NOT_FOUND")
        bogus = as_token("sbt_" + "A" * 43)
        fail(
            await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}, headers=bogus),
            401,
            "UNAUTHORIZED",
        )
        fail(await api.get(f"/v1/sandboxes/{sid}", headers=bogus), 401, "UNAUTHORIZED")
        # the owner's key still reaches both sandboxes in this lane
        assert (await api.get(f"/v1/sandboxes/{other}")).status_code == 200
        assert (await api.post(f"/v1/sandboxes/{other}/exec", json={"cmd": "true"})).status_code == 200
    finally:
        cp_app.dependency_overrides.clear()


async def test_a_disabled_token_stops_at_once_in_both_lanes(cp_app: FastAPI, api: httpx.AsyncClient) -> None:
    sid = await new_sandbox(api)
    token = as_token((await issue(api, sid))["token"])
    assert (
        await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}, headers=token)
    ).status_code == 200
    assert (await api.get(f"/v1/sandboxes/{sid}", headers=token)).status_code == 200  # cached now
    assert (await api.delete(f"/v1/sandboxes/{sid}/access-token")).status_code == 200
    fail(
        await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}, headers=token), 401, "UNAUTHORIZED"
    )
    fail(await api.get(f"/v1/sandboxes/{sid}", headers=token), 401, "UNAUTHORIZED")


async def test_a_fork_is_the_owners_alone_in_both_lanes(
    cp_app: FastAPI, api: httpx.AsyncClient, lane: str
) -> None:
    """The fast lane forks when the body asks for nothing (``{}``, what both SDKs send, or none); the
    owner's key forks, the sandbox's own token gets 403 (§12.1), as through the route."""
    sid = await new_sandbox(api)
    token = as_token((await issue(api, sid))["token"])
    if lane == "fast lane":
        cp_app.dependency_overrides[deps.get_caller] = routes_are_off
        # a fork with overrides reaches the route, which parses them, and is refused by the switch
        assert (await api.post(f"/v1/sandboxes/{sid}/fork", json={"start_paused": True})).status_code == 503
    try:
        fail(await api.post(f"/v1/sandboxes/{sid}/fork", json={}, headers=token), 403, "FORBIDDEN")
        fail(await api.post(f"/v1/sandboxes/{sid}/fork", headers=token), 403, "FORBIDDEN")
        fail(await api.post("/v1/sandboxes/sb-000000000000000000000000000/fork", json={}), 404, "NOT_FOUND")
        children = []
        for body in ({"json": {}}, {"content": b""}):
            forked = await api.post(f"/v1/sandboxes/{sid}/fork", **body)  # type: ignore[arg-type]
            assert forked.status_code == 200, forked.text
            child = forked.json()["data"]
            assert child["status"] == "forking" and child["forked_from"] == sid, child
            children.append(child["id"])
        for child_id in children:
            waited = await api.get(
                f"/v1/sandboxes/{child_id}", params={"wait_for": "running", "wait_ms": "5000"}
            )
            assert waited.json()["data"]["status"] == "running", waited.text
    finally:
        cp_app.dependency_overrides.clear()
