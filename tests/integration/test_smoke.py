"""A sandbox made through the public API runs a command on a real host."""

from __future__ import annotations

import pytest

from tests.live import LivePlatform

pytestmark = pytest.mark.root


def test_create_exec_destroy_through_the_api(platform: LivePlatform) -> None:
    with platform.http(platform.api_key()) as http:
        created = http.post(
            "/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "name": "smoke", "disk_mib": 2048}
        )
        assert created.status_code == 200, created.text
        sandbox = created.json()["data"]
        assert sandbox["status"] == "running"
        ran = http.post(f"/v1/sandboxes/{sandbox['id']}/exec", json={"cmd": "hostname"})
        assert ran.status_code == 200, ran.text
        assert ran.json()["data"]["result"]["stdout"].strip() == "smoke"
        gone = http.delete(f"/v1/sandboxes/{sandbox['id']}")
        assert gone.status_code == 200, gone.text
