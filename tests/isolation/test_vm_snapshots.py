"""VM snapshots (issue #34: "on the VM tier also its memory"), against a real QEMU under TCG.

One source VM, one snapshot, two VMs booted from it (each TCG boot takes seconds, so the module is
lean and its checks share them):

- an agent killed while the source is stopped for a snapshot: the next agent's start lets the source
  go on and removes the half-made snapshot
- the source wrote a file and started a background counter; both copies have the file, and the same
  counter process still running (its pid, counting on from where the snapshot left it): the memory
  came with the disk
- the source is destroyed between the two boots: the snapshot boots all the same
- each copy has its own hostname, MAC and address, and the host's clock
- each diverges on its own: a file written in one is not in the other, and the counter killed in one
  still counts in the other
- deleting the snapshot leaves the VMs booted from it running, with their disks

The store's crash safety (a half-written snapshot is never offered) is checked fast in
tests/hostagent/test_vm_snapshot_store.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord, SandboxSpec, Shape
from paddock_hostagent.drivers.vm import qmp
from paddock_hostagent.drivers.vm.qemu import FROM_SNAPSHOT, QemuRuntime
from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from paddock_hostagent.drivers.vm.vmsnapshots import RESUME_MARKER
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.isolation.vm_support import qemu_runtime, sh

__all__ = ["debian_image", "guest_binary_dir"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]

SMALL = Shape(vcpu=1, mem_mib=384, disk_mib=2048)
COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /root/c.tmp; mv /root/c.tmp /root/counter; sleep 0.2; done"
)
SNAPSHOT_ID = "snap_vmtest1"


async def counter(runtime: QemuRuntime, record: SandboxRecord) -> int:
    return int((await sh(runtime, record, "cat /root/counter 2>/dev/null || echo 0")).strip())


async def counting(runtime: QemuRuntime, record: SandboxRecord, since: int) -> int:
    """The counter once it passed ``since`` (within 15 s: a TCG guest is slow, not stopped)."""
    deadline = time.monotonic() + 15
    value = await counter(runtime, record)
    while value <= since and time.monotonic() < deadline:
        value = await counter(runtime, record)
    assert value > since, f"{record.name}'s counter stayed at {value}"
    return value


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime(
    tmp_path_factory: pytest.TempPathFactory, guest_binary_dir: Path
) -> AsyncIterator[QemuRuntime]:
    state_dir = tmp_path_factory.mktemp("vmsnap")
    # One cold boot for the source, no background build of a saved state beside the test.
    async with qemu_runtime(state_dir, guest_binary_dir, "pdksn", saved_states=False) as qemu:
        yield qemu


async def test_a_vm_snapshot_boots_twice_with_its_files_and_running_processes(
    runtime: QemuRuntime, debian_image: Path
) -> None:
    records: list[SandboxRecord] = []
    try:
        source = await runtime.create(
            SandboxSpec("sb_vmsn0", "vm-snap-src", "debian:13", debian_image, SMALL)
        )
        records.append(source)
        script = "echo from-source > /root/kept && "
        script += (
            f"{{ setsid nohup bash -c '{COUNTER}' >/dev/null 2>&1 < /dev/null & echo $! > /root/bg.pid; }}"
        )
        await sh(runtime, source, script + " && sync")
        before = await counting(runtime, source, 2)
        pid = (await sh(runtime, source, "cat /root/bg.pid")).strip()

        # An agent killed while the source is stopped for a snapshot (its memory half migrated): the
        # next agent's start lets the source go on and removes the half-made snapshot.
        partial = runtime.snapshots.partial_dir("snap_vmcrash")
        (partial / RESUME_MARKER).write_text(source.id)
        qmp_socket = Path(source.driver_state["run_dir"]) / "qmp.sock"
        await qmp.execute(qmp_socket, "stop")
        await qmp.execute(qmp_socket, "migrate", {"uri": f"exec:cat > {partial / 'memory.state'}"})
        assert await runtime.start([source]) == {source.id: RuntimeState.RUNNING}
        assert not partial.exists() and runtime.snapshot_info("snap_vmcrash") is None
        before = await counting(runtime, source, before)

        started = time.monotonic()
        info = await runtime.snapshot(source, SNAPSHOT_ID)
        print(f"VM snapshot: {(time.monotonic() - started) * 1000:.0f} ms, {info.size_bytes >> 20} MiB")
        assert runtime.snapshot_info(SNAPSHOT_ID) == info
        assert info.image == "debian:13" and info.source_id == source.id and info.size_bytes > 0
        await counting(runtime, source, before)  # the source goes on after the snapshot

        copies: list[SandboxRecord] = []
        for index in (1, 2):
            if index == 2:  # the snapshot outlives its source
                await runtime.destroy(source)
                records.remove(source)
            snapshot = runtime.snapshot_info(SNAPSHOT_ID)
            assert snapshot is not None
            spec = SandboxSpec(f"sb_vmsn{index}", f"vm-snap-copy-{index}", "debian:13", debian_image, SMALL)
            started = time.monotonic()
            copy = await runtime.create_from_snapshot(snapshot, spec)
            print(f"boot from VM snapshot: {(time.monotonic() - started) * 1000:.0f} ms")
            records.append(copy)
            copies.append(copy)
            assert copy.driver_state["boot"] == FROM_SNAPSHOT
            assert (copy.vcpu, copy.mem_mib, copy.disk_mib) == (SMALL.vcpu, SMALL.mem_mib, SMALL.disk_mib)

        identity = (
            "hostname; cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0 | tr -s ' ' | cut -d' ' -f4;"
            " date +%s; cat /root/kept; cat /root/bg.pid; kill -0 $(cat /root/bg.pid) && echo alive"
        )
        seen = []
        for copy in copies:
            host_now = time.time()
            hostname, mac, address, guest_now, kept, bg_pid, alive = (
                await sh(runtime, copy, identity)
            ).split()
            assert hostname == copy.name and mac == copy.driver_state["mac"] and address == f"{copy.ip}/32"
            assert abs(int(guest_now) - host_now) < 30, "the copy kept the snapshot's clock"
            # the file, and the very process the source started, counting on from the snapshot
            assert (kept, bg_pid, alive) == ("from-source", pid, "alive")
            await counting(runtime, copy, before)
            seen.append((hostname, mac, address))
        assert len({mac for _, mac, _ in seen} | {source.driver_state["mac"]}) == 3
        assert seen[0][2] != seen[1][2] and seen[0][0] != seen[1][0]

        # each diverges on its own
        first, second = copies
        await sh(runtime, first, "echo one > /root/mine && kill $(cat /root/bg.pid)")
        assert (await sh(runtime, second, "cat /root/mine 2>/dev/null || echo absent")).strip() == "absent"
        assert (
            await sh(runtime, first, "kill -0 $(cat /root/bg.pid) 2>/dev/null || echo dead")
        ).strip() == "dead"
        stopped_at = await counter(runtime, first)
        await counting(runtime, second, await counter(runtime, second))
        assert await counter(runtime, first) == stopped_at

        # deleting the snapshot leaves what booted from it as it is
        assert await runtime.delete_snapshot(SNAPSHOT_ID)
        assert runtime.snapshot_info(SNAPSHOT_ID) is None and not await runtime.delete_snapshot(SNAPSHOT_ID)
        assert (await sh(runtime, first, "cat /root/kept /root/mine")).split() == ["from-source", "one"]
        await counting(runtime, second, await counter(runtime, second))
    finally:
        for record in records:
            await runtime.destroy(record)
