"""The control plane's fast lane really serves buffered exec, ``GET /v1/sandboxes/{id}`` and its ``DELETE``.

``test_sandboxes_rules.py`` checks that the fast lane and the FastAPI route answer alike, which would
also hold if the fast lane declined everything and the route answered both times. Here every FastAPI
route is switched off (its caller dependency overridden to answer 503): what still answers was served by
the fast lane, and the same request steered to the route shows the switch bites.
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
from tests.conftest import LiveServer
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fake_host

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db


@pytest.fixture
def cp_app(cp_settings: ControlPlaneSettings) -> FastAPI:
    return create_app(cp_settings)


@pytest.fixture
async def controlplane(cp_settings: ControlPlaneSettings, cp_app: FastAPI) -> AsyncIterator[ControlPlane]:
    """conftest's control plane, with its app at hand to override the routes' dependencies."""
    await migrate(cp_settings)
    async with LiveServer(cp_app) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        yield ControlPlane(url=server.url, settings=cp_settings, http=http)


async def routes_are_off() -> None:
    raise errors.Unavailable("the FastAPI routes are switched off in this test")


async def test_exec_and_get_are_served_with_every_route_switched_off(
    cp_app: FastAPI, api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    created = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert created.status_code == 200, created.text
    sid = created.json()["data"]["id"]
    cp_app.dependency_overrides[deps.get_caller] = routes_are_off
    try:
        # the switch bites: a request that reaches a route is refused
        via_route = await api.post(
            f"/v1/sandboxes/{sid}/exec", params={"stream": "false"}, json={"cmd": "echo"}
        )
        assert via_route.status_code == 503, via_route.text
        assert (await api.get(f"/v1/sandboxes/{sid}/egress")).status_code == 503

        ran = await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": ["hi"]})
        assert ran.status_code == 200, ran.text
        assert ran.json()["data"]["result"]["stdout"] == "echo hi\n"
        got = await api.get(f"/v1/sandboxes/{sid}")
        assert got.status_code == 200 and got.json()["data"]["id"] == sid
        assert got.json()["data"]["status"] == "running"
        waited = await api.get(f"/v1/sandboxes/{sid}", params={"wait_for": "running", "wait_ms": "1000"})
        assert waited.status_code == 200 and waited.json()["data"]["status"] == "running"
        # the fast lane's errors are the contract's too, not the switch's 503
        unknown = await api.get("/v1/sandboxes/sb-000000000000000000000000000")
        assert unknown.status_code == 404 and unknown.json()["data"]["code"] == "NOT_FOUND"
    finally:
        cp_app.dependency_overrides.clear()


async def test_a_destroy_is_served_with_every_route_switched_off(
    cp_app: FastAPI, api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    """Every sandbox made is destroyed once, so its ``DELETE`` is in the fast lane too."""
    made = [
        (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"] for _ in "ab"
    ]
    cp_app.dependency_overrides[deps.get_caller] = routes_are_off
    try:
        # with a query it goes on to the route, which the switch refuses
        assert (await api.delete(f"/v1/sandboxes/{made[1]}", params={"x": "1"})).status_code == 503
        gone = await api.delete(f"/v1/sandboxes/{made[0]}")
        assert gone.status_code == 200, gone.text
        assert gone.json()["data"] == {"id": made[0], "status": "destroying"}
        waited = await api.get(
            f"/v1/sandboxes/{made[0]}", params={"wait_for": "destroyed", "wait_ms": "5000"}
        )
        assert waited.json()["data"]["status"] == "destroyed", waited.text
        assert ("destroy", made[0]) in fake_host.calls
        unknown = await api.delete("/v1/sandboxes/sb-000000000000000000000000000")
        assert unknown.status_code == 404 and unknown.json()["data"]["code"] == "NOT_FOUND"
    finally:
        cp_app.dependency_overrides.clear()
    kept = await api.get(f"/v1/sandboxes/{made[1]}")
    assert kept.json()["data"]["status"] == "running", kept.text
