"""What a hibernated sandbox gets back when it wakes (docs/hibernation.md): its S3 disk, mounted again at
the same path with the same files, and its private network, on the same address there (control plane +
a real host agent + s3fs + moto; a second sandbox on the network answers it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.disks.s3server import S3Server
from tests.live import LivePlatform, start_platform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"


@pytest.fixture
def s3() -> Iterator[S3Server]:
    server = S3Server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def live(debian_image: Path, guest_binary_dir: Path, s3: S3Server) -> Iterator[LivePlatform]:
    # moto's namespace is on private-use space (198.18.0.0/15), which a production control plane refuses.
    platform = start_platform(guest_binary_dir, cp_env={"PADDOCK_CP_DISK_ALLOW_PRIVATE_ENDPOINTS": "true"})
    try:
        yield platform
    finally:
        platform.stop()


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()["data"]


def sh(http: httpx.Client, sandbox_id: str, script: str) -> dict[str, Any]:
    return dict(
        ok(http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}))[
            "result"
        ]
    )


def mounted(http: httpx.Client, sandbox_id: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:  # ends: every attachment mounted, or the assertion
        items = ok(http.get(f"/v1/sandboxes/{sandbox_id}/disks"))["data"]
        done = bool(items) and all(item["mount_status"] == "mounted" for item in items)
        if done or time.monotonic() > deadline:
            assert done, items
            return list(items)
        time.sleep(0.2)


def test_a_woken_sandbox_has_its_s3_disk_and_its_network_back(live: LivePlatform, s3: S3Server) -> None:
    bucket = s3.bucket("hib-" + "c3d4e5")
    with live.http(live.api_key()) as http:
        made: list[str] = []
        try:
            disk = {
                "name": "bucket",
                "kind": "s3",
                "config": {"bucket": bucket, "endpoint": s3.endpoint, "use_path_style": True},
                "credentials": {"access_key": s3.access_key, "secret_key": s3.secret_key},
            }
            ok(http.post("/v1/disks", json=disk))
            net = ok(http.post("/v1/networks", json={"name": "lan"}))
            sleeper = ok(
                http.post(
                    "/v1/sandboxes",
                    json={
                        "shape": SHAPE,
                        "networks": [{"id": net["id"]}],
                        "disks": [{"disk_id": "bucket", "mount_path": "/data"}],
                    },
                )
            )["id"]
            made.append(sleeper)
            peer = ok(http.post("/v1/sandboxes", json={"shape": SHAPE, "networks": [{"id": net["id"]}]}))[
                "id"
            ]
            made.append(peer)
            mounted(http, sleeper)
            assert sh(http, sleeper, "echo in-bucket > /data/b.txt")["exit_code"] == 0
            lan_ip = next(n["ip"] for n in ok(http.get(f"/v1/sandboxes/{sleeper}"))["networks"])
            assert sh(http, peer, f"ping -c1 -W2 {lan_ip}")["exit_code"] == 0

            view = ok(http.post(f"/v1/sandboxes/{sleeper}/pause", json={"keep_memory": False}))
            assert view["hibernated"] is True
            assert sh(http, peer, f"ping -c1 -W1 {lan_ip}")["exit_code"] != 0  # nothing answers there now

            assert ok(http.post(f"/v1/sandboxes/{sleeper}/resume"))["status"] == "running"
            assert mounted(http, sleeper)[0]["mount_path"] == "/data"
            result = sh(http, sleeper, "cat /data/b.txt")
            assert result["stdout"] == "in-bucket\n", result
            # The same address there, and the same MAC: the peer's neighbour cache is right at once.
            assert sh(http, peer, f"ping -c1 -W1 {lan_ip}")["exit_code"] == 0
        finally:
            for sandbox_id in made:
                http.delete(f"/v1/sandboxes/{sandbox_id}")
            for sandbox_id in made:
                deadline = time.monotonic() + 30
                while ok(http.get(f"/v1/sandboxes/{sandbox_id}"))["status"] != "destroyed":
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
