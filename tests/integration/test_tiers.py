"""Isolation tiers as a user meets them: each host says which tier it gives (``paddock.io/isolation``,
``paddock.io/runtime`` in ``GET /v1/hosts``), ``node_selector`` places by it, and a sandbox on the
gVisor tier runs under its own kernel.
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.conftest import TIERS, platform_tier
from tests.live import LivePlatform

pytestmark = pytest.mark.root

ISOLATION = {"crun": "container", "runc": "container", "gvisor": "gvisor"}
BODY = {"shape": "s-1vcpu-256mb", "disk_mib": 2048}


def test_a_host_advertises_its_tier_and_node_selector_places_by_it(platform: LivePlatform) -> None:
    tier = platform_tier(platform)
    with platform.http(platform.api_key()) as http:
        hosts = http.get("/v1/hosts").json()["data"]
        listed = hosts.get("data", hosts) if isinstance(hosts, dict) else hosts
        labels = listed[0]["labels"]
        assert labels["paddock.io/isolation"] == ISOLATION[tier], labels
        assert labels["paddock.io/runtime"] == TIERS[tier], labels

        placed = http.post(
            "/v1/sandboxes", json={**BODY, "node_selector": {"paddock.io/isolation": ISOLATION[tier]}}
        )
        assert placed.status_code == 200, placed.text
        sandbox_id = placed.json()["data"]["id"]
        try:
            other = "vm" if ISOLATION[tier] != "vm" else "container"
            refused = http.post(
                "/v1/sandboxes", json={**BODY, "node_selector": {"paddock.io/isolation": other}}
            )
            assert refused.status_code == 503, refused.text
            kernel = run(http, sandbox_id, "uname -r")
            # gVisor's sentry reports its own (old) kernel release; a container sees the host's.
            if tier == "gvisor":
                assert kernel.startswith("4.4."), kernel
            else:
                assert kernel == run_host_uname(), kernel
        finally:
            http.delete(f"/v1/sandboxes/{sandbox_id}")


def run(http: httpx.Client, sandbox_id: str, script: str) -> str:
    response = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]})
    assert response.status_code == 200, response.text
    return str(response.json()["data"]["result"]["stdout"]).strip()


def run_host_uname() -> str:
    with open("/proc/sys/kernel/osrelease") as release:
        return release.read().strip()
