"""The VM tier as users meet it: a control plane and a host agent with ``runtime=qemu``, over the public API.

One platform, one source VM and one fork (TCG boots take seconds). Checked here: the host advertises
``paddock.io/isolation=vm``; create → running; exec, a streamed exec and a 20 MiB file upload and
download through the API; pause/resume; and a fork, through ``POST /v1/sandboxes/{id}/fork``,
continues a counter its source started. What the tier does not offer (docs/isolation.md's table) is
refused with a 409 ``INVALID_STATE`` naming the tier and the operation, changing nothing: a disk
resize (running or paused), a private network attached live or named at create (refused before any
VM boots), an S3 disk. The rest of the tier is checked at the driver in test_vm_tier.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from tests.hostagent.conftest import TOKEN, debian_image, guest_binary_dir
from tests.live import LivePlatform, start_platform

__all__ = ["debian_image", "guest_binary_dir"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]

COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /root/c.tmp; mv /root/c.tmp /root/counter; sleep 0.1; done"
)


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    # A loopback disk endpoint is allowed: the refusal of an S3 disk on this tier comes before any mount.
    live = start_platform(
        guest_binary_dir,
        agent_options={"runtime": "qemu"},
        cp_env={"PADDOCK_CP_DISK_ALLOW_PRIVATE_ENDPOINTS": "true"},
    )
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def api(platform: LivePlatform) -> Iterator[httpx.Client]:
    with platform.http(platform.api_key()) as http:
        yield http
        listed = http.get("/v1/sandboxes", params={"limit": 100}).json()["data"]
        for item in listed.get("data", listed if isinstance(listed, list) else []):
            if item["status"] not in ("destroyed", "failed"):
                http.delete(f"/v1/sandboxes/{item['id']}")


def sh(api: httpx.Client, sandbox_id: str, script: str) -> dict[str, Any]:
    response = api.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["data"]["result"]
    return result


def wait_status(api: httpx.Client, sandbox_id: str, wanted: str) -> dict[str, Any]:
    response = api.get(f"/v1/sandboxes/{sandbox_id}", params={"wait_for": wanted, "wait_ms": 30000})
    sandbox: dict[str, Any] = response.json()["data"]
    assert sandbox["status"] == wanted, sandbox
    return sandbox


@pytest.fixture(scope="module")
def source(api: httpx.Client) -> dict[str, Any]:
    """The module's one VM (destroyed with the others by ``api``)."""
    created = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "disk_mib": 2048})
    assert created.status_code == 200, created.text
    sandbox: dict[str, Any] = created.json()["data"]
    assert sandbox["status"] == "running", sandbox
    return sandbox


def test_a_vm_sandbox_runs_pauses_and_forks_with_its_processes(
    platform: LivePlatform, api: httpx.Client, source: dict[str, Any]
) -> None:
    info = httpx.get(
        platform.agents[0].url + "/internal/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert info["runtime"] == "qemu"
    assert info.get("labels", {}).get("paddock.io/isolation", "vm") == "vm"
    sid = source["id"]
    result = sh(api, sid, "uname -r; hostname")
    assert result["exit_code"] == 0 and result["stdout"].split()[1] == source["name"]
    assert "cloud-amd64" in result["stdout"]

    body = {"cmd": "bash", "args": ["-c", "echo one; sleep 1; echo two >&2; exit 3"], "stream": True}
    with api.stream("POST", f"/v1/sandboxes/{sid}/exec", params={"stream": "true"}, json=body) as response:
        assert response.status_code == 200
        frames = [json.loads(line) for line in response.iter_lines() if line.strip()]
    assert [f for f in frames if "hb" not in f] == [
        {"stdout": "one\n"},
        {"stderr": "two\n"},
        {"exit_code": 3},
    ]

    payload = os.urandom(20 << 20)
    put = api.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/blob.bin"}, content=payload)
    assert put.status_code == 200, put.text
    inside = sh(api, sid, "sha256sum /root/blob.bin")["stdout"].split()[0]
    assert inside == hashlib.sha256(payload).hexdigest()
    back = api.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/blob.bin"})
    assert back.status_code == 200 and back.content == payload

    sh(api, sid, f"nohup bash -c '{COUNTER}' >/dev/null 2>&1 &")
    time.sleep(1.0)
    assert api.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    wait_status(api, sid, "paused")
    time.sleep(1.0)
    assert api.post(f"/v1/sandboxes/{sid}/resume").status_code == 200
    wait_status(api, sid, "running")
    before_fork = int(sh(api, sid, "cat /root/counter")["stdout"])
    assert 1 <= before_fork <= 25, "the counter ran on while paused, or never ran"

    forked = api.post(f"/v1/sandboxes/{sid}/fork")
    assert forked.status_code == 200, forked.text
    child = wait_status(api, forked.json()["data"]["id"], "running")
    assert child["forked_from"] == sid and child["ip"] != source["ip"]
    first = int(sh(api, child["id"], "cat /root/counter")["stdout"])
    assert first >= before_fork, "the fork did not start from its source's memory"
    deadline = time.monotonic() + 30  # TCG on a loaded machine runs the counter slowly
    later = first
    while later <= first + 3 and time.monotonic() < deadline:
        time.sleep(0.3)
        later = int(sh(api, child["id"], "cat /root/counter")["stdout"])
    assert later > first + 3, "the fork's counter stopped"
    assert sh(api, child["id"], "hostname")["stdout"].strip() == child["name"]


def refused_on_the_vm_tier(response: httpx.Response, operation: str) -> None:
    assert response.status_code == 409, response.text
    body = response.json()
    assert body["data"]["code"] == "INVALID_STATE", body
    message = str(body["data"]["message"])
    assert f"{operation} is not supported on the vm isolation tier" in message, message


def test_what_the_vm_tier_does_not_offer_is_refused_with_a_409(
    api: httpx.Client, source: dict[str, Any]
) -> None:
    sid = source["id"]
    assert wait_status(api, sid, "running")["disk_mib"] == 2048

    refused_on_the_vm_tier(
        api.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": 4096}), "growing a sandbox's disk"
    )
    assert api.get(f"/v1/sandboxes/{sid}").json()["data"]["disk_mib"] == 2048

    net = api.post("/v1/networks", json={"name": "lan"})
    assert net.status_code == 200, net.text
    net_id = net.json()["data"]["id"]
    attach = api.post(f"/v1/sandboxes/{sid}/networks", json={"id": net_id})
    refused_on_the_vm_tier(attach, "joining a private network")
    assert api.get(f"/v1/networks/{net_id}").json()["data"]["members"] == []

    before = {item["id"] for item in listed(api)}
    started = time.monotonic()
    create = api.post(
        "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "disk_mib": 2048, "networks": [{"id": net_id}]}
    )
    refused_on_the_vm_tier(create, "joining a private network")
    assert time.monotonic() - started < 5, "a VM was booted for a create that could not be served"
    assert {item["id"] for item in listed(api)} == before, "the refused create left a sandbox"

    disk = api.post(
        "/v1/disks",
        json={
            "name": "team",
            "kind": "s3",
            "config": {"bucket": "b", "endpoint": "http://127.0.0.1:9", "region": "us-east-1"},
            "credentials": {"access_key": "AKIAEXAMPLE", "secret_key": "secret-example"},
        },
    )
    assert disk.status_code == 200, disk.text
    mounted = api.post(
        f"/v1/sandboxes/{sid}/disks", json={"disk_id": disk.json()["data"]["id"], "mount_path": "/mnt/team"}
    )
    refused_on_the_vm_tier(mounted, "mounting an S3 disk")

    assert api.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    wait_status(api, sid, "paused")
    refused_on_the_vm_tier(
        api.post(f"/v1/sandboxes/{sid}/resize", json={"disk_mib": 4096}), "growing a sandbox's disk"
    )
    assert api.post(f"/v1/sandboxes/{sid}/resume").status_code == 200
    assert wait_status(api, sid, "running")["disk_mib"] == 2048
    assert sh(api, sid, "echo still")["stdout"] == "still\n"


def listed(api: httpx.Client) -> list[dict[str, Any]]:
    data = api.get("/v1/sandboxes", params={"limit": 100}).json()["data"]
    return list(data.get("data", data) if isinstance(data, dict) else data)
