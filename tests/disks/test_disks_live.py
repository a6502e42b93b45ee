"""S3 disks through the whole platform where the control plane's view must follow the host's: a mount
the host cannot restore after its restart (control plane + a real host agent + s3fs + moto)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.disks.s3server import S3Server
from tests.live import LivePlatform, start_platform

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def live(debian_image: Path, guest_binary_dir: Path, s3: S3Server) -> Iterator[LivePlatform]:
    # moto's namespace is on private-use space (198.18.0.0/15), which a production control plane refuses.
    platform = start_platform(guest_binary_dir, cp_env={"PADDOCK_CP_DISK_ALLOW_PRIVATE_ENDPOINTS": "true"})
    try:
        yield platform
    finally:
        platform.stop()


def mounts(http: Any, sandbox_id: str, wanted: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:  # ends: every attachment is in the wanted state, or the assertion
        items = http.get(f"/v1/sandboxes/{sandbox_id}/disks").json()["data"]["data"]
        done = bool(items) and all(item["mount_status"] == wanted for item in items)
        if done or time.monotonic() > deadline:
            assert done, items
            return list(items)
        time.sleep(0.2)


def test_a_mount_the_restarted_host_cannot_restore_is_error_in_the_api(
    live: LivePlatform, s3: S3Server
) -> None:
    bucket = s3.bucket("lost-" + "a1b2c3")
    with live.http(live.api_key()) as http:
        disk = {
            "name": "lost",
            "kind": "s3",
            "config": {"bucket": bucket, "endpoint": s3.endpoint, "use_path_style": True},
            "credentials": {"access_key": s3.access_key, "secret_key": s3.secret_key},
        }
        assert http.post("/v1/disks", json=disk).status_code == 200
        made = http.post(
            "/v1/sandboxes",
            json={"shape": "s-1vcpu-1gb", "disks": [{"disk_id": "lost", "mount_path": "/data"}]},
        )
        assert made.status_code == 200, made.text
        sandbox_id = made.json()["data"]["id"]
        mounts(http, sandbox_id, "mounted")

        agent = live.agents[0]
        agent.stop(signal.SIGKILL)
        found = subprocess.run(
            ["pgrep", "-f", f"s3fs .*/disks/{sandbox_id}/"], capture_output=True, text=True
        )
        for pid in found.stdout.split():  # the mount dies with the agent, and its credentials are gone
            subprocess.run(["kill", "-9", pid], check=True)
        passwd = list((agent.state_dir / "disks" / sandbox_id).glob("*.passwd"))
        assert len(passwd) == 1, passwd
        passwd[0].unlink()
        agent.start()

        (item,) = mounts(http, sandbox_id, "error")
        assert "credentials lost on the host" in item["mount_error"], item
        http.delete(f"/v1/sandboxes/{sandbox_id}")
