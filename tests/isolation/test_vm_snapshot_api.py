"""VM snapshots as users meet them (issue #34): a control plane and a host agent with ``runtime=qemu``,
over the public API.

``POST /v1/sandboxes/{id}/snapshots`` of a VM is taken (the control plane no longer refuses the VM
tier), and ``POST /v1/sandboxes`` with ``rootfs`` = the snapshot boots VMs that hold the source's file
and the process it started, still running, each with its own name and address; the source's destroy
leaves the snapshot bootable. A host agent killed with SIGKILL while a VM is stopped for its snapshot
leaves, once restarted, the source running with its process and no snapshot. The driver's side
(divergence, MACs, delete) is in test_vm_snapshots.py.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform, start_platform
from tests.multihost.support import wait_status

__all__ = ["debian_image", "guest_binary_dir"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]

COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /root/c.tmp; mv /root/c.tmp /root/counter; sleep 0.2; done"
)


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    live = start_platform(guest_binary_dir, agent_options={"runtime": "qemu"})
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


def sh(api: httpx.Client, sandbox_id: str, script: str) -> str:
    response = api.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["data"]["result"]
    assert result["exit_code"] == 0, result
    return str(result["stdout"])


def counter_passes(api: httpx.Client, sandbox_id: str, since: int) -> int:
    deadline = time.monotonic() + 20  # TCG on a loaded machine runs the counter slowly
    value = int(sh(api, sandbox_id, "cat /root/counter 2>/dev/null || echo 0"))
    while value <= since and time.monotonic() < deadline:
        time.sleep(0.3)
        value = int(sh(api, sandbox_id, "cat /root/counter 2>/dev/null || echo 0"))
    assert value > since, f"the counter of {sandbox_id} stayed at {value}"
    return value


def create(api: httpx.Client, **body: Any) -> dict[str, Any]:
    created = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", **body})
    assert created.status_code == 200, created.text
    sandbox: dict[str, Any] = created.json()["data"]
    assert sandbox["status"] == "running", sandbox
    return sandbox


def test_a_vm_snapshot_through_the_api_boots_with_the_sources_files_and_processes(api: httpx.Client) -> None:
    source = create(api, disk_mib=2048)
    sid = source["id"]
    sh(
        api,
        sid,
        f"echo kept > /root/kept; {{ setsid nohup bash -c '{COUNTER}' >/dev/null 2>&1 < /dev/null & echo $! > /root/bg.pid; }}",
    )
    before = counter_passes(api, sid, 2)
    pid = sh(api, sid, "cat /root/bg.pid").strip()

    made = api.post(f"/v1/sandboxes/{sid}/snapshots", json={"name": "vm-snap"})
    assert made.status_code == 200, made.text
    snap = made.json()["data"]
    assert snap["status"] == "ready" and snap["source_sandbox_id"] == sid and snap["size_bytes"] > 0
    counter_passes(api, sid, before)  # the source goes on

    # Its memory goes back into the machine it came from: another shape is a 400 naming the field.
    other = api.post("/v1/sandboxes", json={"shape": "s-2vcpu-2gb", "rootfs": snap["id"]})
    assert other.status_code == 400, other.text
    assert "s-1vcpu-1gb" in other.json()["data"]["shape"]
    first = create(api, rootfs=snap["id"])
    assert api.delete(f"/v1/sandboxes/{sid}").status_code == 200
    second = create(api, rootfs="vm-snap")  # by name, after the source is gone
    for copy in (first, second):
        hostname, kept, bg_pid = sh(api, copy["id"], "hostname; cat /root/kept; cat /root/bg.pid").split()
        assert (hostname, kept, bg_pid) == (copy["name"], "kept", pid)
        assert sh(api, copy["id"], f"kill -0 {pid} && echo alive").strip() == "alive"
        counter_passes(api, copy["id"], before)
    # Each copy has its own address: the first beside its live source, the second beside the first. The
    # second may get the destroyed source's (the host hands out the lowest free one).
    assert len({source["ip"], first["ip"]}) == 2 and second["ip"] != first["ip"]

    assert api.delete(f"/v1/snapshots/{snap['id']}").status_code == 200
    assert api.get(f"/v1/snapshots/{snap['id']}").status_code == 404


def test_an_agent_killed_in_the_middle_of_a_vm_snapshot_leaves_the_source_running_and_no_snapshot(
    platform: LivePlatform, api: httpx.Client
) -> None:
    """SIGKILL of the host agent while the source is stopped and its memory and disk are being copied
    (800 MiB written, so the overlay's copy takes a while): the next agent lets the source go on, with
    its files and its process, removes the half-made snapshot, and the source can be snapshotted again."""
    source = create(api, disk_mib=2048)
    sid = source["id"]
    script = f"{{ setsid nohup bash -c '{COUNTER}' >/dev/null 2>&1 < /dev/null & }}; echo kept > /root/kept; "
    sh(api, sid, script + "dd if=/dev/zero of=/root/dirty.bin bs=1M count=800 conv=fsync status=none")
    before = counter_passes(api, sid, 2)
    agent = platform.agents[0]
    snapshots = agent.state_dir / "vm" / "snapshots"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(api.post, f"/v1/sandboxes/{sid}/snapshots", json={})
        deadline = time.monotonic() + 30
        # memory.state exists once QEMU is stopped and migrating into the snapshot
        while not list(snapshots.glob(".partial-snap_*/memory.state")) and time.monotonic() < deadline:
            time.sleep(0.002)
        partial = list(snapshots.glob(".partial-snap_*"))
        assert partial and (partial[0] / "resume-source").read_text() == sid, "the snapshot never started"
        agent.stop(signal.SIGKILL)
        answered = asked.result(timeout=60)
    assert answered.status_code >= 500, answered.text  # the host went away in the middle
    assert not (snapshots / partial[0].name.removeprefix(".partial-")).exists()
    agent.start()
    assert not partial[0].exists()
    # A restart under load can outlast host_dead_after_s (15 s): the control plane then shows the source
    # as error until the new agent's first heartbeat reports it running, which revives it (error is not
    # a state ?wait_for waits through, hence the poll).
    wait_status(api, sid, "running", timeout_s=30)
    assert sh(api, sid, "cat /root/kept; stat -c %s /root/dirty.bin").split() == ["kept", str(800 << 20)]
    counter_passes(api, sid, before)  # the very process, running again
    # None of this source's (another test's snapshot may be listed beside, if that test failed)
    listed = api.get("/v1/snapshots", params={"limit": 100}).json()["data"]["data"]
    assert [s["id"] for s in listed if s["source_sandbox_id"] == sid] == []
    made = api.post(f"/v1/sandboxes/{sid}/snapshots", json={})
    assert made.status_code == 200, made.text
    assert api.delete(f"/v1/snapshots/{made.json()['data']['id']}").status_code == 200
