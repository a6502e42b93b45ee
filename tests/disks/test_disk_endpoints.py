"""A disk's endpoint may not point at private address space (SSRF) unless the operator allows it. s3fs
connects from the sandbox's network namespace, where the host's loopback is the sandbox's own
(tests/security/test_s3_probes.py); this check refuses such endpoints early, with a 400."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.resources.test_networks import client_for, fail, ok
from tests.controlplane.resources.test_networks import fake_host as fake_host

pytestmark = pytest.mark.db


@pytest.fixture
async def api(controlplane: ControlPlane, fake_host: FakeHostLink) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(controlplane) as client:
        yield client


def body(endpoint: str) -> dict[str, object]:
    return {
        "name": "d",
        "kind": "s3",
        "config": {"bucket": "b", "endpoint": endpoint},
        "credentials": {"access_key": "a", "secret_key": "s"},
    }


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:9000",
        "http://localhost:8081",
        "http://10.0.0.5",
        "http://169.254.169.254/latest",
        "http://[::1]:9000",
        "http://[::ffff:192.168.1.1]",
    ],
)
async def test_private_endpoints_are_refused_naming_the_field(api: httpx.AsyncClient, endpoint: str) -> None:
    data = fail(await api.post("/v1/disks", json=body(endpoint)), 400, "VALIDATION_FAILED")
    assert "config.endpoint" in data, data
    assert ok(await api.get("/v1/disks"))["pagination"]["total"] == 0


async def test_a_public_endpoint_is_accepted(api: httpx.AsyncClient) -> None:
    assert (
        ok(await api.post("/v1/disks", json=body("http://8.8.8.8:9000")))["config"]["endpoint"]
        == "http://8.8.8.8:9000"
    )
