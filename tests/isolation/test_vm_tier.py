"""The VM tier (drivers/vm/qemu.py) against a real QEMU: Debian's cloud kernel, our initramfs, the catalog image.

Under TCG (this kind of machine: KVM hangs) a VM boots in seconds, so the module boots one VM and
shares it; every test leaves it running. What runs here, driver-level (the runtime, the real network
manager and egress firewall, a fake internet in its own namespace):

- create → running under the VM's own kernel (uname), with the sandbox's address and hostname
- exec: stdout, stderr, exit codes, stdin; concurrent execs over the one virtio-serial channel
- commands hold the container tier's capabilities: mount, sysctl and sysrq writes, mknod, raw memory
  are refused
- files: write then read back through the guest agent
- pause/resume (QMP stop/cont): a counter stops while paused and goes on after
- egress: an allowlisted address answers, any other is refused; the veth's counters count it; a
  denylist refuses the address it names and lets another out
- ingress: the host reaches a server inside the VM at the sandbox's address (as the ingress proxy does)
- a restarted host agent re-adopts the running VM and reaches its agent again (channel reset)
- fork: the fork continues a process started before the fork (a counter keeps counting from where it
  was), with its own address and hostname; the source goes on too
- a memory hog (under a memory cgroup in the VM) is killed by the guest kernel, the VM lives on, and
  the OOM kill is reported
- destroy leaves no QEMU, namespace, socket or file behind

Not run here (see docs/isolation-vm.md): streams and managed processes through the full platform,
private networks, S3 disks and online disk growth (unsupported on this tier).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord, SandboxSpec, Shape
from paddock_hostagent.drivers.net.egress_rules import EgressFirewall, EgressPolicy
from paddock_hostagent.drivers.net.network import NETNS_DIR, VETH_PREFIX, NetworkManager
from paddock_hostagent.drivers.vm.qemu import CONSOLE_FILE_BYTES, QemuOptions, QemuRuntime
from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from paddock_hostagent.guest import GuestClient
from tests.hostagent.conftest import debian_image, guest_binary_dir, private_subnet
from tests.isolation.vm_support import guest_run
from tests.network.internet import FakeInternet

__all__ = ["debian_image", "guest_binary_dir"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]

SHAPE = Shape(vcpu=1, mem_mib=512, disk_mib=2048)
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/c.tmp; mv /tmp/c.tmp /tmp/counter; sleep 0.1; done"


class Tier:
    def __init__(self, runtime: QemuRuntime, firewall: EgressFirewall, internet: FakeInternet) -> None:
        self.runtime = runtime
        self.firewall = firewall
        self.internet = internet

    async def sh(
        self, record: SandboxRecord, script: str, stdin: bytes | None = None
    ) -> tuple[int, str, str]:
        return await guest_run(self.runtime, record, script, stdin)

    async def start_counter(self, record: SandboxRecord) -> None:
        """A background counter, started once (a fork inherits it running), and counting: its first
        value is written before this returns (a test that read it at once found no file, under TCG)."""
        script = "[ -f /tmp/counter.pid ] && kill -0 $(cat /tmp/counter.pid) 2>/dev/null || "
        script += f"{{ nohup bash -c '{COUNTER}' >/dev/null 2>&1 & echo $! > /tmp/counter.pid; }}"
        script += "; for _ in $(seq 300); do [ -f /tmp/counter ] && exit 0; sleep 0.1; done; exit 1"
        assert (await self.sh(record, script))[0] == 0, "the counter wrote nothing in 30 s"

    async def counts_past(self, record: SandboxRecord, value: int, timeout_s: float = 30.0) -> int:
        """Waits until the counter is above ``value`` (TCG on a loaded machine runs it slowly)."""
        deadline = time.monotonic() + timeout_s
        current = await self.counter(record)
        while current <= value and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            current = await self.counter(record)
        assert current > value, f"the counter stood at {current}, never above {value}"
        return current

    async def counter(self, record: SandboxRecord) -> int:
        code, out, _ = await self.sh(record, "cat /tmp/counter")
        assert code == 0, out
        return int(out)


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    with FakeInternet() as fake:
        yield fake


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tier(
    tmp_path_factory: pytest.TempPathFactory, guest_binary_dir: Path, internet: FakeInternet
) -> AsyncIterator[Tier]:
    state_dir = tmp_path_factory.mktemp("vmstate")
    table = f"pdkvm{secrets.token_hex(3)}"
    subnet = private_subnet()
    network = NetworkManager(subnet, state_dir / "network", table, [])
    network.setup_host()
    firewall = EgressFirewall(table, subnet, network.gateway)
    firewall.setup_host()
    run_root = Path(f"/run/{table}")
    runtime = QemuRuntime(
        QemuOptions(
            state_dir=state_dir,
            guest_binary=guest_binary_dir / "paddock-guest",
            network=network,
            runtime_root=run_root,
        )
    )
    await runtime.start([])
    try:
        yield Tier(runtime, firewall, internet)
    finally:
        await runtime.close()
        firewall.teardown_host()
        network.teardown_host()
        leftovers = list((state_dir / "vm" / "slots").glob("*")) + list((run_root / "vm").glob("*"))
        subprocess.run(["rm", "-rf", str(run_root)], check=False)
        assert not leftovers, f"the VM tier left these behind: {leftovers}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vm(tier: Tier, debian_image: Path) -> AsyncIterator[SandboxRecord]:
    spec = SandboxSpec("sb_vmtier1", "vm-one", "debian:13", debian_image, SHAPE)
    started = time.monotonic()
    record = await tier.runtime.create(spec)
    print(f"create → running: {time.monotonic() - started:.2f}s under {tier.runtime.accel}")
    try:
        yield record
    finally:
        await tier.runtime.destroy(record)


async def test_create_boots_its_own_kernel_with_the_sandboxs_identity(tier: Tier, vm: SandboxRecord) -> None:
    assert tier.runtime.probe(vm) == RuntimeState.RUNNING
    code, out, _ = await tier.sh(
        vm, "uname -r; hostname; grep -c . /etc/os-release >/dev/null && echo debian"
    )
    kernel_version = next((KERNEL_ROOT / "boot").glob("vmlinuz-*")).name.removeprefix("vmlinuz-")
    assert code == 0
    assert out.split() == [kernel_version, "vm-one", "debian"]
    assert kernel_version != os.uname().release  # not the host's kernel
    code, out, _ = await tier.sh(
        vm, "cat /proc/net/fib_trie | grep -B1 '/32 host LOCAL' | grep -o '[0-9.]*' | sort -u"
    )
    assert vm.ip in out.split()


async def test_qemu_runs_in_the_slots_network_namespace_and_the_hosts_mounts(
    tier: Tier, vm: SandboxRecord
) -> None:
    """QEMU enters only the slot's network namespace. Under ``ip netns exec`` it had a mount namespace of
    its own, a copy of every host mount at its start: on a host whose mounts do not propagate, other
    sandboxes' disks stayed mounted in it (their loop devices bound) for as long as the VM ran."""
    pid = int(vm.driver_state["pid"])
    slot_netns = NETNS_DIR / f"{VETH_PREFIX}-{vm.driver_state['slot']}"
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == slot_netns.stat().st_ino
    assert os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")


async def test_the_guest_console_on_the_host_stays_bounded_whatever_root_writes_to_it(
    tier: Tier, vm: SandboxRecord
) -> None:
    """Root in the VM writes 768 KiB to its serial console: the host keeps the last 256 KiB of it (the
    console was a file QEMU appended to without end)."""
    code, _, err = await tier.sh(
        vm, "head -c 786432 /dev/zero | tr '\\0' x > /dev/ttyS0; echo console-tail-mark > /dev/ttyS0"
    )
    assert code == 0, err
    await tier.runtime.flush_log(vm, "guest")
    console = tier.runtime.log_path(vm, "guest")
    size = console.stat().st_size
    assert 0 < size <= CONSOLE_FILE_BYTES, size
    assert b"console-tail-mark" in console.read_bytes()[-200:]


async def test_exec_reports_output_exit_codes_and_takes_stdin(tier: Tier, vm: SandboxRecord) -> None:
    assert await tier.sh(vm, "echo out; echo err >&2; exit 3") == (3, "out\n", "err\n")
    assert await tier.sh(vm, "tr a-z A-Z", stdin=b"hello vm") == (0, "HELLO VM", "")
    results = await asyncio.gather(*(tier.sh(vm, f"sleep 0.2; echo {n}") for n in range(8)))
    assert [out for _, out, _ in results] == [f"{n}\n" for n in range(8)]


async def test_commands_hold_the_container_tiers_capabilities(tier: Tier, vm: SandboxRecord) -> None:
    """Root in the VM, but with a container's capability set: what needs more is refused."""
    attempts = {
        "mount": "mount -t tmpfs none /mnt",
        "sysctl": "echo 1 > /proc/sys/net/ipv4/ip_forward",
        "hostname sysctl": "echo other > /proc/sys/kernel/hostname",
        "sysrq": "echo h > /proc/sysrq-trigger",
        "mknod": "mknod /tmp/disk b 254 0",
        "raw memory": "head -c1 /dev/mem >/dev/null",
    }
    for name, script in attempts.items():
        code, _, _ = await tier.sh(vm, script)
        assert code != 0, f"{name} was allowed inside the VM"
    _, out, _ = await tier.sh(vm, "grep CapBnd /proc/self/status")
    # Docker's default set less NET_RAW and MKNOD: chown, dac_override, fowner, fsetid, kill, setgid,
    # setuid, setpcap, net_bind_service, sys_chroot, audit_write, setfcap
    kept = (0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 29, 31)
    assert int(out.split()[1], 16) == sum(1 << cap for cap in kept)


async def test_files_written_are_read_back(tier: Tier, vm: SandboxRecord) -> None:
    payload = os.urandom(300_000)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 65536):
            yield payload[start : start + 65536]

    client: GuestClient = tier.runtime.guest(vm)
    assert await client.write_file("/root/blob.bin", chunks()) == len(payload)
    received = b""
    async with client.read_file("/root/blob.bin") as download:
        async for chunk in download:
            received += chunk
    assert received == payload
    assert await tier.sh(vm, "sha256sum < /root/blob.bin | cut -c1-16") == (
        0,
        hashlib.sha256(payload).hexdigest()[:16] + "\n",
        "",
    )


async def test_pause_stops_every_process_and_resume_goes_on(tier: Tier, vm: SandboxRecord) -> None:
    await tier.start_counter(vm)
    await asyncio.sleep(1.0)
    await tier.runtime.pause(vm)
    assert tier.runtime.probe(vm) == RuntimeState.PAUSED
    await asyncio.sleep(0.2)  # a counter write in flight lands before the guest stops
    await tier.runtime.resume(vm)
    before = await tier.counter(vm)
    await tier.runtime.pause(vm)
    await asyncio.sleep(1.5)
    await tier.runtime.resume(vm)
    after_pause = await tier.counter(vm)
    assert tier.runtime.probe(vm) == RuntimeState.RUNNING
    assert after_pause - before <= 3, "the counter ran on while the VM was paused"
    await tier.counts_past(vm, after_pause + 2)  # it goes on after resume


async def test_egress_follows_the_allowlist_and_is_counted(tier: Tier, vm: SandboxRecord) -> None:
    veth = tier.runtime.host_interface(vm)
    assert veth is not None
    allowed, blocked = tier.internet.address("raw-a"), tier.internet.address("raw-b")
    await tier.firewall.install(veth, vm.ip, EgressPolicy.parse([allowed]), quota_bytes=-1, used_bytes=0)
    try:
        fetch = 'curl -sS --max-time 4 http://{}/; echo " rc=$?"'
        _, out, _ = await tier.sh(vm, fetch.format(allowed))
        assert out.strip() == "raw-a:80 rc=0"
        _, out, _ = await tier.sh(vm, fetch.format(blocked))
        assert "rc=0" not in out
        usage = await tier.firewall.usage(veth, metered=False)
        assert usage is not None and usage.egress_bytes > 0 and usage.ingress_bytes > 0
        # A denylist the other way round: the address it names is refused, the rest goes out.
        await tier.firewall.install(
            veth, vm.ip, EgressPolicy.parse([f"!{allowed}"]), quota_bytes=-1, used_bytes=0
        )
        _, out, _ = await tier.sh(vm, fetch.format(blocked))
        assert out.strip() == "raw-b:80 rc=0"
        _, out, _ = await tier.sh(vm, fetch.format(allowed))
        assert "rc=0" not in out
    finally:
        await tier.firewall.remove(veth)


async def test_ingress_reaches_a_server_in_the_vm(tier: Tier, vm: SandboxRecord) -> None:
    script = "mkdir -p /tmp/www && echo hello-from-vm > /tmp/www/index.html && "
    script += "nohup /run/paddock/busybox httpd -f -p 8000 -h /tmp/www >/dev/null 2>&1 &"
    assert (await tier.sh(vm, script))[0] == 0
    deadline = time.monotonic() + 10
    body = b""
    while time.monotonic() < deadline and b"hello-from-vm" not in body:
        with contextlib.suppress(OSError):
            body = await asyncio.to_thread(_http_get, vm.ip, 8000)
        await asyncio.sleep(0.2)
    assert b"hello-from-vm" in body


async def test_a_restarted_host_agent_adopts_the_running_vm(tier: Tier, vm: SandboxRecord) -> None:
    await tier.start_counter(vm)
    await tier.runtime.close()  # the agent goes away; the VM keeps running
    assert tier.runtime.probe(vm) == RuntimeState.RUNNING
    successor = QemuRuntime(tier.runtime.options)
    states = await successor.start([vm])
    tier.runtime = successor
    assert states == {vm.id: RuntimeState.RUNNING}
    before = await tier.counter(vm)
    await tier.counts_past(vm, before)  # its processes survived the agent restart


async def test_a_fork_continues_the_processes_of_its_source(
    tier: Tier, vm: SandboxRecord, debian_image: Path
) -> None:
    await tier.start_counter(vm)
    await asyncio.sleep(1.0)
    at_fork = await tier.counter(vm)
    spec = SandboxSpec("sb_vmtier2", "vm-fork", "debian:13", debian_image, SHAPE)
    started = time.monotonic()
    fork = await tier.runtime.fork(vm, spec)
    print(f"fork: {time.monotonic() - started:.2f}s")
    try:
        assert fork.forked_from == vm.id and fork.ip != vm.ip
        first = await tier.counter(fork)
        assert first >= at_fork, "the fork did not start from its source's memory"
        await tier.counts_past(fork, first + 3)  # the fork's copy of the counter goes on
        await tier.counts_past(vm, at_fork + 3)  # and so does its source's
        code, out, _ = await tier.sh(fork, "hostname; cat /proc/net/fib_trie | grep -c " + fork.ip)
        assert code == 0 and out.split()[0] == "vm-fork" and int(out.split()[1]) > 0
        # the fork's network works from its new address (the host's source-address guard would drop
        # anything it sent from its source's)
        veth = tier.runtime.host_interface(fork)
        assert veth is not None
        await tier.firewall.install(veth, fork.ip, EgressPolicy.parse([]), quota_bytes=-1, used_bytes=0)
        address = tier.internet.address("raw-a")
        _, out, _ = await tier.sh(fork, f"curl -sS --max-time 4 http://{address}/")
        assert out == "raw-a:80"
        await tier.firewall.remove(veth)
    finally:
        await tier.runtime.destroy(fork)
    assert tier.runtime.probe(fork) == RuntimeState.STOPPED
    assert not Path(fork.driver_state["dir"]).exists() and not Path(fork.driver_state["run_dir"]).exists()
    assert not Path(f"/run/netns/pdk-{fork.driver_state['slot']}").exists()


def _http_get(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=3) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data


async def test_a_memory_hog_is_killed_inside_and_reported(tier: Tier, vm: SandboxRecord) -> None:
    """The hog runs under a 32 MiB memory cgroup inside the VM: the guest kernel kills it at once (a
    hog against the whole VM's memory first thrashes the page cache, for minutes under TCG)."""
    before = tier.runtime.oom_kills(vm)
    script = (
        "echo +memory > /sys/fs/cgroup/cgroup.subtree_control; mkdir -p /sys/fs/cgroup/hog; "
        "echo 32M > /sys/fs/cgroup/hog/memory.max; "
        # tail keeps a newline-free stream whole until the kernel kills it
        "bash -c 'echo $$ > /sys/fs/cgroup/hog/cgroup.procs; head -c 200M /dev/zero | tail -n 1 >/dev/null'; "
        "echo $?"
    )
    code, out, err = await asyncio.wait_for(tier.sh(vm, script), 120)
    assert code == 0 and out.strip() == "137", (out, err)  # tail died of SIGKILL
    deadline = time.monotonic() + 10
    while tier.runtime.oom_kills(vm) == before and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert tier.runtime.oom_kills(vm) > before
    assert await tier.sh(vm, "echo still-here") == (0, "still-here\n", "")
