"""Hibernation on the VM tier (issue #34: "on the VM tier it keeps memory too"), through the public API,
on a real control plane and a host agent under QEMU (TCG here: a cold boot takes seconds).

A hibernated VM keeps its memory (QEMU's migration stream in a file) and its overlay; its QEMU process,
slot, tap, namespace and address go. A wake restores it as itself (its address, MAC and hostname), and
the processes it ran carry on: the counter it started counts on from where it stopped, same pid.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from tests.hibernation.test_hibernation_live import Account, netns_names, record_of, start_ticks
from tests.live import LivePlatform
from tests.volumes.conftest import platform_on

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]

VM = {"shape": "s-1vcpu-1gb", "disk_mib": 2048}
COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /root/c.tmp; mv /root/c.tmp /root/counter; sleep 0.2; done"
)


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    with platform_on("qemu", guest_binary_dir) as live:
        yield live


def counter(account: Account, sandbox_id: str) -> int:
    return int(account.out(sandbox_id, "cat /root/counter 2>/dev/null || echo 0").strip())


def counting(account: Account, sandbox_id: str, since: int) -> int:
    """The counter once it passed ``since`` (within 20 s: a TCG guest is slow, not stopped)."""
    deadline = time.monotonic() + 20
    value = counter(account, sandbox_id)
    while value <= since and time.monotonic() < deadline:
        time.sleep(0.2)
        value = counter(account, sandbox_id)
    assert value > since, f"the counter stayed at {value}"
    return value


def test_a_hibernated_vm_frees_its_qemu_and_wakes_with_its_files_and_running_processes(
    platform: LivePlatform, account: Account
) -> None:
    sandbox_id = account.sandbox(**VM)
    identity = (
        "cat /etc/hostname; cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0 | awk '{print $4}'"
    )
    before_identity = account.out(sandbox_id, identity)
    account.out(
        sandbox_id,
        "echo kept-through-hibernation > /root/kept && "
        f"{{ setsid nohup bash -c '{COUNTER}' >/dev/null 2>&1 < /dev/null & echo $! > /root/bg.pid; }}",
    )
    pid = account.out(sandbox_id, "cat /root/bg.pid").strip()
    before = counting(account, sandbox_id, 2)
    running = record_of(platform, sandbox_id)["driver_state"]
    qemu_pid, slot = int(running["pid"]), str(running["slot"])
    assert start_ticks(qemu_pid) is not None
    ip = account.get(sandbox_id)["ip"]

    started = time.monotonic()
    view = account.hibernate(sandbox_id)
    print(f"VM hibernate (API): {(time.monotonic() - started) * 1000:.0f} ms")
    assert view["status"] == "paused" and view["hibernated"] is True, view
    # Nothing of it runs: its QEMU (and with it the guest's memory on the host) is gone, and its slot.
    assert start_ticks(qemu_pid) is None, "QEMU still runs"
    assert not any(name.endswith(f"-{slot}") for name in netns_names()), netns_names()
    assert not Path(running["dir"]).exists()
    kept = record_of(platform, sandbox_id)["driver_state"]
    assert set(kept) == {"hibernated"}, kept
    time.sleep(2)  # hibernated: its processes do not run meanwhile

    started = time.monotonic()
    woken = account.resume(sandbox_id)
    print(f"VM wake (API): {(time.monotonic() - started) * 1000:.0f} ms")
    assert woken.status_code == 200, woken.text
    view = account.wait_status(sandbox_id, {"running"})
    assert "hibernated" not in view and view["ip"] == ip, view
    assert record_of(platform, sandbox_id)["driver_state"]["boot"] == "woken"
    assert account.out(sandbox_id, "cat /root/kept") == "kept-through-hibernation\n"
    # The same process, still counting, from where it stopped (not restarted from 0).
    assert account.out(sandbox_id, f"kill -0 {pid} && cat /proc/{pid}/cmdline | tr '\\0' ' '").startswith(
        "bash -c"
    )
    assert account.out(sandbox_id, "cat /root/bg.pid").strip() == pid
    after = counter(account, sandbox_id)
    assert after >= before, (before, after)
    counting(account, sandbox_id, after)
    assert account.out(sandbox_id, identity) == before_identity  # the same sandbox: hostname, MAC, address
    account.destroy(sandbox_id)


def test_a_hibernated_vm_destroyed_leaves_nothing_and_one_holding_a_volume_wakes_with_it(
    platform: LivePlatform, account: Account
) -> None:
    agent_vm = platform.agents[0].state_dir / "vm"
    sandbox_id = account.sandbox(**VM)
    account.hibernate(sandbox_id)
    assert (agent_vm / "hibernated" / sandbox_id / "memory.state").is_file()
    account.destroy(sandbox_id)
    assert not (agent_vm / "hibernated" / sandbox_id).exists()
    assert not (platform.agents[0].state_dir / "sandboxes" / f"{sandbox_id}.json").exists()

    # A VM holding a volume: its memory has the volume mounted, and its wake gives the same drive back.
    made = account.http.post("/v1/volumes", json={"name": "vmhib", "size_mib": 512})
    assert made.status_code == 200, made.text
    volume_id = made.json()["data"]["id"]
    try:
        holder = account.sandbox(**VM, volumes=[{"volume_id": volume_id, "mount_path": "/data"}])
        # Written, not synced: the page cache in the guest's memory goes into the hibernation too.
        account.out(holder, "echo before-hibernate > /data/kept")
        account.hibernate(holder)
        assert account.get(holder)["hibernated"] is True
        held = account.http.get(f"/v1/volumes/{volume_id}").json()["data"]
        assert [m["sandbox_id"] for m in held["attachments"]] == [holder], held  # still its own
        woken = account.resume(holder)
        assert woken.status_code == 200, woken.text
        account.wait_status(holder, {"running"})
        assert account.out(holder, "cat /data/kept") == "before-hibernate\n"
        account.out(holder, "echo after-wake > /data/more && sync")
        assert account.out(holder, "cat /data/more") == "after-wake\n"
        assert " rw" in account.out(holder, "grep ' /data ' /proc/mounts").replace(" rw,", " rw ")
        account.destroy(holder)
    finally:
        account.http.delete(f"/v1/volumes/{volume_id}")
