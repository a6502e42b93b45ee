"""Networking tests: the platform (control plane + a host agent) next to a fake internet.

The host agent's resolver forwards to the fake internet's DNS server, and every sandbox's traffic is
routed and NATed to the fake internet's namespace exactly as it would be to the real internet.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostagent.conftest import debian_image, guest_binary_dir, pytest_collection_modifyitems
from tests.live import LivePlatform, start_platform
from tests.network.internet import FakeInternet

__all__ = ["debian_image", "guest_binary_dir", "pytest_collection_modifyitems"]

#: Every sandbox of these tests starts with this egress budget (the operator default is 5 GiB).
QUOTA_BYTES = 1_000_000


@pytest.fixture(scope="package")
def internet() -> Iterator[FakeInternet]:
    with FakeInternet() as fake:
        yield fake


@pytest.fixture(scope="package")
def net_platform(
    debian_image: Path, guest_binary_dir: Path, internet: FakeInternet
) -> Iterator[LivePlatform]:
    live = start_platform(
        guest_binary_dir,
        cp_env={"PADDOCK_CP_DEFAULT_BANDWIDTH_QUOTA_BYTES": str(QUOTA_BYTES)},
        agent_options={"extra_env": {"PADDOCK_HOST_DNS_UPSTREAM": internet.dns_upstream}},
    )
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def api(net_platform: LivePlatform) -> Iterator[httpx.Client]:
    """A fresh user's client; the sandboxes it made are destroyed afterwards."""
    with net_platform.http(net_platform.api_key()) as http:
        yield http
        listed = http.get("/v1/sandboxes", params={"limit": 100}).json()["data"]
        for item in listed.get("data", listed if isinstance(listed, list) else []):
            if item["status"] not in ("destroyed", "failed"):
                http.delete(f"/v1/sandboxes/{item['id']}")


def create(api: httpx.Client, **body: Any) -> dict[str, Any]:
    response = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "disk_mib": 2048, **body})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()["data"]
    assert data["status"] == "running", data
    return data


def sh(api: httpx.Client, sandbox_id: str, script: str) -> dict[str, Any]:
    response = api.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["data"]["result"]
    return result


def fetch(api: httpx.Client, sandbox_id: str, target: str, port: int = 80) -> str:
    """What ``curl http://target:port/`` inside the sandbox printed, or ``error <curl exit code>``."""
    script = f'curl -sS --max-time 3 http://{target}:{port}/; echo "|rc=$?"'
    out = sh(api, sandbox_id, script)["stdout"].strip()
    body, _, code = out.rpartition("|rc=")
    return body if code == "0" else f"error {code}"
