"""VM creates from a saved state (drivers/vm/vmsaved.py, qemu.py), against a real QEMU under TCG.

One module, kept lean (each boot here is ~10 s): a saved state per shape is built once, then

- a truncated saved state is never restored: the create boots cold and succeeds, and the state is
  built again in the background; one with a flipped byte (same size) fails its checksum; one that
  passes the file checks but QEMU cannot load is dropped, and the create boots cold
- two VMs restored from saved states of the same image each have their own hostname, guest MAC,
  address, vCPUs and memory, clock and random numbers; each runs commands, and a file written in one
  is not in the other; the host reaches each at its own address
- a fork of a restored VM has a MAC of its own, not its source's
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from paddock_hostagent.drivers.base import SandboxRecord, SandboxSpec, Shape
from paddock_hostagent.drivers.vm.qemu import COLD, FORKED, RESTORED, QemuRuntime
from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from paddock_hostagent.drivers.vm.vmsaved import SavedStates
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
LARGE = Shape(vcpu=2, mem_mib=640, disk_mib=2048)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime(
    tmp_path_factory: pytest.TempPathFactory, guest_binary_dir: Path
) -> AsyncIterator[QemuRuntime]:
    state_dir = tmp_path_factory.mktemp("vmsaved")
    async with qemu_runtime(state_dir, guest_binary_dir, "pdkvs") as qemu:
        yield qemu


async def test_a_truncated_saved_state_is_not_restored_and_the_create_boots_cold(
    runtime: QemuRuntime, debian_image: Path
) -> None:
    saved = await runtime.ensure_saved_state(debian_image, SMALL.mem_mib, SMALL.vcpu, SMALL.disk_mib)
    size = saved.memory.stat().st_size
    os.truncate(saved.memory, size // 2)
    record = await runtime.create(SandboxSpec("sb_vmsv0", "vm-cold", "debian:13", debian_image, SMALL))
    try:
        assert record.driver_state["boot"] == COLD
        assert (await sh(runtime, record, "hostname")).split() == ["vm-cold"]
    finally:
        await runtime.destroy(record)
    await runtime.wait_saved_states()  # the create started a rebuild in the background
    rebuilt = runtime.saved.load(saved.key)
    assert rebuilt is not None and rebuilt.memory.stat().st_size > size // 2

    # a byte changed in place (same size) fails the checksum of a host agent that has not read it yet
    with open(rebuilt.memory, "r+b") as file:
        file.seek(rebuilt.memory.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    assert SavedStates(runtime.saved.root).load(saved.key) is None
    assert not rebuilt.dir.exists()


async def test_a_saved_state_qemu_cannot_load_is_dropped_and_the_create_boots_cold(
    runtime: QemuRuntime, debian_image: Path
) -> None:
    """A state whose files match their record but hold no migration stream (a record rewritten along
    with them): QEMU refuses it, the create boots cold all the same and the state is rebuilt."""
    saved = await runtime.ensure_saved_state(debian_image, SMALL.mem_mib, SMALL.vcpu, SMALL.disk_mib)
    saved.memory.write_bytes(b"not a migration stream\n" * 4096)
    meta = json.loads((saved.dir / "meta.json").read_text())
    meta["files"]["memory.state"] = {
        "size": saved.memory.stat().st_size,
        "sha256": hashlib.sha256(saved.memory.read_bytes()).hexdigest(),
    }
    (saved.dir / "meta.json").write_text(json.dumps(meta))
    assert SavedStates(runtime.saved.root).load(saved.key) is not None  # it passes the file checks

    record = await runtime.create(SandboxSpec("sb_vmsv9", "vm-cold-2", "debian:13", debian_image, SMALL))
    try:
        assert record.driver_state["boot"] == COLD
        assert (await sh(runtime, record, "hostname")).split() == ["vm-cold-2"]
    finally:
        await runtime.destroy(record)
    await runtime.wait_saved_states()
    rebuilt = runtime.saved.load(saved.key)
    assert rebuilt is not None
    with open(rebuilt.memory, "rb") as file:
        assert not file.read(64).startswith(b"not a migration stream")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def restored(runtime: QemuRuntime, debian_image: Path) -> AsyncIterator[list[SandboxRecord]]:
    records: list[SandboxRecord] = []
    try:
        for index, shape in enumerate((SMALL, LARGE)):
            await runtime.ensure_saved_state(debian_image, shape.mem_mib, shape.vcpu, shape.disk_mib)
            spec = SandboxSpec(
                f"sb_vmsv{index + 1}", f"vm-restored-{index + 1}", "debian:13", debian_image, shape
            )
            started = time.monotonic()
            records.append(await runtime.create(spec))
            print(f"restored create: {(time.monotonic() - started) * 1000:.0f} ms ({shape})")
        yield records
    finally:
        for record in records:
            await runtime.destroy(record)


async def test_restored_vms_each_have_their_own_identity_limits_and_disk(
    runtime: QemuRuntime, restored: list[SandboxRecord]
) -> None:
    script = (
        "hostname; cat /sys/class/net/eth0/address; nproc; grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2;"
        " date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo;"
        " ip -4 -o addr show dev eth0 | tr -s ' ' | cut -d' ' -f4; ip route show default | cut -d' ' -f3"
    )
    seen = []
    for record, shape in zip(restored, (SMALL, LARGE), strict=True):
        assert record.driver_state["boot"] == RESTORED
        host_now = time.time()
        hostname, mac, cpus, mem_kib, guest_now, random_hex, address, gateway = (
            await sh(runtime, record, script)
        ).split()
        assert hostname == record.name
        assert mac == record.driver_state["mac"]
        assert address == f"{record.ip}/32" and gateway == record.driver_state["gateway"]
        assert int(cpus) == shape.vcpu
        # MemTotal is the VM's memory less what the kernel keeps for itself
        assert shape.mem_mib * 1024 * 0.75 < int(mem_kib) <= shape.mem_mib * 1024
        assert abs(int(guest_now) - host_now) < 30, "the guest kept its saved state's clock"
        seen.append((hostname, mac, address, cpus, mem_kib, random_hex))
    first, second = seen
    assert all(a != b for a, b in zip(first, second, strict=True)), (first, second)
    # /etc/hosts names the sandbox, not the saved guest
    assert restored[0].name in await sh(runtime, restored[0], "cat /etc/hosts")

    await sh(runtime, restored[0], "echo mine > /root/only-here && sync")
    assert (await sh(runtime, restored[0], "cat /root/only-here")).strip() == "mine"
    assert (await sh(runtime, restored[1], "ls /root/only-here 2>&1 || true")).find("No such file") >= 0


async def test_the_host_reaches_each_restored_vm_at_its_own_address(
    runtime: QemuRuntime, restored: list[SandboxRecord]
) -> None:
    """The saved guest's address and routes are gone: each VM answers at its sandbox's address, as
    the ingress proxy reaches it, with its own page."""
    for record in restored:
        script = f"mkdir -p /tmp/www && echo {record.name} > /tmp/www/index.html && "
        script += "{ nohup /run/paddock/busybox httpd -f -p 8000 -h /tmp/www >/dev/null 2>&1 & }"
        await sh(runtime, record, script)
    for record in restored:
        deadline = time.monotonic() + 15
        body = b""
        while time.monotonic() < deadline and record.name.encode() not in body:
            with contextlib.suppress(OSError):
                body = await asyncio.to_thread(_http_get, record.ip, 8000)
            await asyncio.sleep(0.2)
        assert body.endswith(f"{record.name}\n".encode()), body[-200:]


def _http_get(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=3) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data


async def test_two_vms_restored_from_one_saved_state_draw_different_random_numbers(
    runtime: QemuRuntime, restored: list[SandboxRecord], debian_image: Path
) -> None:
    """Both start from the same kernel random state; the host's seed (CONFIG) makes them part."""
    twins = []
    try:
        for index in (3, 4):
            spec = SandboxSpec(f"sb_vmsv{index}", f"vm-twin-{index}", "debian:13", debian_image, SMALL)
            twins.append(await runtime.create(spec))
        script = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
        first, second = [await sh(runtime, twin, script) for twin in twins]
        assert [twin.driver_state["boot"] for twin in twins] == [RESTORED, RESTORED]
        assert len(first) == 32 and first != second
    finally:
        for twin in twins:
            await runtime.destroy(twin)


async def test_a_fork_of_a_restored_vm_has_its_own_mac(
    runtime: QemuRuntime, restored: list[SandboxRecord], debian_image: Path
) -> None:
    source = restored[0]
    await sh(runtime, source, "echo before-fork > /root/forked && sync")
    spec = SandboxSpec("sb_vmsv5", "vm-fork", "debian:13", debian_image, SMALL)
    fork = await runtime.fork(source, spec)
    try:
        assert fork.driver_state["boot"] == FORKED
        script = "hostname; cat /sys/class/net/eth0/address; cat /root/forked"
        fork_host, fork_mac, carried = (await sh(runtime, fork, script)).split()
        source_mac = (await sh(runtime, source, "cat /sys/class/net/eth0/address")).strip()
        assert fork_host == "vm-fork" and carried == "before-fork"  # a fork keeps its source's disk
        assert fork_mac == fork.driver_state["mac"] and fork_mac != source_mac
    finally:
        await runtime.destroy(fork)
