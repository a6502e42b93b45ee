"""VM hibernation's crash safety at the driver (docs/hibernation.md, "On the VM tier"), against a real
QEMU under TCG: one VM, hibernated twice.

- an agent killed after the copy and before the commit (the record still says running): the next
  agent's start (``settle_hibernations``) removes the copy and lets the VM go on, counter still counting
- an agent killed after the commit, before the teardown (the record says hibernated, with ``teardown``):
  the next agent's start kills the QEMU and frees the slot, and the VM wakes from its kept memory with
  its address, MAC and the same counter process

The public API's path (hibernate, wake, the QEMU process gone) is tests/hibernation/test_hibernation_vm.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord, SandboxSpec, Shape
from paddock_hostagent.drivers.system import host_processes
from paddock_hostagent.drivers.vm.qemu import HIBERNATION, TEARDOWN, WOKEN, QemuRuntime
from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from paddock_hostagent.drivers.vm.vmsnapshots import RESUME_MARKER
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.isolation.test_vm_snapshots import COUNTER, counting
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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime(
    tmp_path_factory: pytest.TempPathFactory, guest_binary_dir: Path
) -> AsyncIterator[QemuRuntime]:
    state_dir = tmp_path_factory.mktemp("vmhib")
    async with qemu_runtime(state_dir, guest_binary_dir, "pdkhb", saved_states=False) as qemu:
        yield qemu


async def test_a_vm_hibernation_cut_short_either_side_of_its_commit(
    runtime: QemuRuntime, debian_image: Path
) -> None:
    spec = SandboxSpec("sb_vmhib0", "vm-hib", "debian:13", debian_image, SMALL)
    record: SandboxRecord | None = await runtime.create(spec)
    assert record is not None
    try:
        script = "echo kept > /root/kept && "
        script += (
            f"{{ setsid nohup bash -c '{COUNTER}' >/dev/null 2>&1 < /dev/null & echo $! > /root/bg.pid; }}"
        )
        await sh(runtime, record, script)
        pid = (await sh(runtime, record, "cat /root/bg.pid")).strip()
        before = await counting(runtime, record, 2)
        identity = "cat /etc/hostname /sys/class/net/eth0/address; ip -4 -o addr show dev eth0"
        who = await sh(runtime, record, identity)

        # Killed before the commit: the copy is whole, the VM stopped, the record still says running.
        state = await runtime.hibernate(record)
        kept = runtime.hibernated_dir / record.id
        assert (kept / RESUME_MARKER).exists() and (kept / "memory.state").stat().st_size > 0
        await runtime.settle_hibernations([record])
        assert not kept.exists()
        assert await runtime.start([record]) == {record.id: RuntimeState.RUNNING}
        before = await counting(runtime, record, before)

        # Killed after the commit, before the teardown: the next agent finishes it.
        state = await runtime.hibernate(record)
        qemu_pid, qemu_ticks = int(record.driver_state["pid"]), int(record.driver_state["ticks"])
        hibernated = dataclasses.replace(record, driver_state=state, state=RuntimeState.PAUSED)
        assert set(state) == {HIBERNATION, TEARDOWN}
        await runtime.settle_hibernations([hibernated])
        assert set(hibernated.driver_state) == {HIBERNATION}
        assert not host_processes.is_same_process(qemu_pid, qemu_ticks), "QEMU still runs"
        assert not Path(record.driver_state["dir"]).exists() and kept.is_dir()
        record = None  # nothing of it runs: the wake makes the next record
        await runtime.start([])  # a start with it hibernated reclaims nothing of it

        started = time.monotonic()
        record = await runtime.wake(hibernated, spec)
        print(f"VM wake (driver): {(time.monotonic() - started) * 1000:.0f} ms")
        await runtime.forget_hibernation(spec.id)
        assert record.driver_state["boot"] == WOKEN and record.ip == hibernated.ip
        assert await sh(runtime, record, identity) == who
        assert await sh(runtime, record, "cat /root/kept") == "kept\n"
        assert (await sh(runtime, record, "cat /root/bg.pid")).strip() == pid
        await sh(runtime, record, f"kill -0 {pid}")
        assert await counting(runtime, record, before - 1) >= before  # on from where it stopped
        assert not kept.exists()
    finally:
        if record is not None:
            await runtime.destroy(record)
