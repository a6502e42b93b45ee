"""The QEMU driver: each sandbox a virtual machine with its own kernel (the ``vm`` isolation tier).

Create: a network namespace and veth pair exactly as a container's (``NetworkManager``), plus a tap
device inside the namespace joined to the namespace's ``eth0`` by two tc ``mirred`` redirects, so
every frame of the VM leaves by the sandbox's host veth: the egress rules, bandwidth counters and
ingress of the container tier apply unchanged. The disk is a qcow2 overlay on the image as ext4
(``vmimage.build_base_disk``, made once per image and size). QEMU (``-M q35``, KVM where it works,
else TCG) boots Debian's cloud kernel with our initramfs, which mounts the disk, configures eth0 and
switch_roots to ``paddock-vminit``; that starts the same guest agent as PID 1 and multiplexes its
connections over a virtio-serial port (``vmchannel.py`` is the host end). Create returns once the
agent answers.

Pause and resume are QMP ``stop``/``cont``. Fork stops the source, migrates its memory to a file,
copies its (flushed) overlay and lets the source go on; the fork boots with ``-incoming`` from that
file on the copy, so **processes carry over**: a fork continues what its source was running. It then
gets its own address and hostname over the channel (CONFIG). Destroy kills QEMU and removes the
namespace (with the tap), the files and the sockets; every step tolerates having been done before.

OOM kills are the guest kernel's: ``paddock-vminit`` reports ``/proc/vmstat`` ``oom_kill`` over the
channel when it changes. Not done on this tier: private networks, S3 disks (no mount namespace to
mount into) and online disk growth.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import (
    DISK_RESIZE,
    PRIVATE_NETWORKS,
    S3_DISKS,
    BootError,
    CommandFailedError,
    DriverError,
    NetworkHook,
    NotRunningError,
    ResourceSample,
    RuntimeState,
    SandboxRecord,
    SandboxRuntime,
    SandboxSpec,
    TierUnsupportedError,
)
from paddock_hostagent.drivers.net.network import NetworkManager, SandboxNetwork
from paddock_hostagent.drivers.system import host_processes
from paddock_hostagent.drivers.system.commands import run
from paddock_hostagent.drivers.vm import qmp, vmimage
from paddock_hostagent.drivers.vm.vmchannel import GuestChannel
from paddock_hostagent.guest import GuestClient, GuestError, GuestVersionError

log = get_logger(__name__)

TAP = "tap0"
#: What the VM tier does not offer, and why (docs/isolation.md).
_NOT_ON_VMS = {
    PRIVATE_NETWORKS: "the VM's only interface is its tap, joined to the namespace's eth0",
    S3_DISKS: "the VM has its own kernel, and the host cannot mount into it",
    DISK_RESIZE: "the VM's kernel sees its disk's size at boot",
}
KVM_PROBE_TIMEOUT_S = 8.0
#: The guest console's ring in QEMU (a power of two); what the guest writes past it overwrites the oldest.
CONSOLE_RING_BYTES = 1 << 18
#: How much of the console ``console.log`` keeps on the host once drained (its last bytes).
CONSOLE_FILE_BYTES = 1 << 18


@dataclass(frozen=True)
class QemuOptions:
    state_dir: Path
    guest_binary: Path
    network: NetworkManager
    boot_timeout_s: float = 60.0  # TCG on a loaded 2-core machine boots in 3-10 s
    # Sockets live here (a unix socket path holds ~107 bytes; state dirs can be long).
    runtime_root: Path = Path("/run/paddock")
    kernel_root: Path = vmimage.KERNEL_ROOT
    accel: str = "auto"  # "auto" (KVM if a probe boot works, else TCG), "kvm" or "tcg"


@dataclass
class _Handle:
    """The QEMU part of a record's ``driver_state``."""

    slot: str
    dir: Path
    run_dir: Path
    network: SandboxNetwork
    base_disk: Path
    accel: str
    mac: str
    pid: int = 0
    ticks: int = 0

    @property
    def overlay(self) -> Path:
        return self.dir / "overlay.qcow2"

    @property
    def qmp_socket(self) -> Path:
        return self.run_dir / "qmp.sock"

    @property
    def port_socket(self) -> Path:
        return self.run_dir / "chan.sock"

    @property
    def guest_socket(self) -> Path:
        return self.run_dir / "guest.sock"

    @property
    def paused_marker(self) -> Path:
        return self.run_dir / "paused"

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "dir": str(self.dir),
            "run_dir": str(self.run_dir),
            "ip": self.network.ip,
            "gateway": self.network.gateway,
            "base_disk": str(self.base_disk),
            "accel": self.accel,
            "mac": self.mac,
            "pid": self.pid,
            "ticks": self.ticks,
        }

    @classmethod
    def of(cls, record: SandboxRecord) -> _Handle:
        data = record.driver_state
        return cls(
            data["slot"],
            Path(data["dir"]),
            Path(data["run_dir"]),
            SandboxNetwork(slot=data["slot"], ip=data["ip"], gateway=data["gateway"]),
            Path(data["base_disk"]),
            data["accel"],
            data["mac"],
            data["pid"],
            data["ticks"],
        )


@dataclass
class _Boot:
    """What one QEMU start needs beyond the handle."""

    vcpu: int
    mem_mib: int
    hostname: str
    incoming: Path | None = None
    extra: list[str] = field(default_factory=list)


class QemuRuntime(SandboxRuntime):
    name = "qemu"

    def __init__(self, options: QemuOptions) -> None:
        self.options = options
        self.vm_dir = options.state_dir / "vm"
        self.run_root = options.runtime_root / "vm"
        # Names this agent's private-network bridges (drivers/net/bridges.py), as the OCI driver's tag does.
        self.layout_tag = hashlib.sha256(str(options.state_dir.resolve()).encode()).hexdigest()[:8]
        self._channels: dict[str, GuestChannel] = {}
        self._kernel: vmimage.Kernel | None = None
        self._initramfs: Path | None = None
        self._accel: str | None = None

    # -- lifecycle of the driver ----------------------------------------------------------------

    async def prepare(self) -> None:
        """Finds the kernel, builds the initramfs and decides KVM or TCG (cached on disk)."""
        if self._initramfs is not None:
            return
        self.vm_dir.mkdir(parents=True, exist_ok=True)
        kernel = vmimage.Kernel.find(self.options.kernel_root)
        vminit = await asyncio.to_thread(vmimage.build_vminit, self.vm_dir)
        self._initramfs = await asyncio.to_thread(
            vmimage.build_initramfs, self.vm_dir, kernel, self.options.guest_binary, vminit
        )
        self._kernel = kernel
        self._accel = await self._choose_accel(kernel, self._initramfs)
        log.info("qemu_ready", kernel=kernel.version, accel=self._accel)

    @property
    def accel(self) -> str:
        return self._accel or "tcg"

    def boot_files(self) -> tuple[Path, Path]:
        """The kernel and initramfs VMs boot (after ``prepare``)."""
        if self._kernel is None or self._initramfs is None:
            raise DriverError("the QEMU driver is not prepared")
        return self._kernel.vmlinuz, self._initramfs

    async def qmp(self, record: SandboxRecord, command: str) -> Any:
        """One raw QMP command to a sandbox's QEMU (bench and diagnostics)."""
        return await qmp.execute(self._alive(record).qmp_socket, command)

    async def start(self, records: list[SandboxRecord]) -> dict[str, RuntimeState]:
        await self.prepare()
        mine = [record for record in records if record.driver == self.name]
        states: dict[str, RuntimeState] = {}
        for record in mine:
            states[record.id] = self.probe(record)
            if states[record.id] != RuntimeState.STOPPED:
                with contextlib.suppress(Exception):
                    await self._open_channel(record.id, _Handle.of(record))
        await self._reclaim(mine)
        return states

    async def retire(self, records: list[SandboxRecord]) -> None:
        mine = [record for record in records if record.driver == self.name]
        for record in mine:
            handle = _Handle.of(record)
            if host_processes.is_same_process(handle.pid, handle.ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(handle.pid, signal.SIGKILL)
                await host_processes.wait_gone(handle.pid, handle.ticks, timeout_s=10)
        await self._reclaim(mine)

    async def _reclaim(self, mine: list[SandboxRecord]) -> None:
        """Removes the VM slots no record of ``mine`` owns (a QEMU still running in one is killed)."""
        owned = {_Handle.of(record).slot for record in mine}
        slots_dir = self.vm_dir / "slots"
        for leftover in sorted(slots_dir.iterdir()) if slots_dir.is_dir() else []:
            if leftover.name not in owned:
                log.info("reclaiming_orphan_vm_slot", slot=leftover.name)
                await self._remove_slot(leftover.name)

    async def close(self) -> None:
        for channel in list(self._channels.values()):
            await channel.close()
        self._channels.clear()

    async def _choose_accel(self, kernel: vmimage.Kernel, initramfs: Path) -> str:
        if self.options.accel in ("kvm", "tcg"):
            return self.options.accel
        if not os.access("/dev/kvm", os.R_OK | os.W_OK):
            return "tcg"
        cache = self.vm_dir / "accel.json"
        with contextlib.suppress(OSError, ValueError, KeyError):
            cached = json.loads(cache.read_text())
            if cached["kernel"] == kernel.version:
                return str(cached["accel"])
        accel = "kvm" if await _kvm_boots(kernel, initramfs) else "tcg"
        cache.write_text(json.dumps({"kernel": kernel.version, "accel": accel}))
        return accel

    # -- create, fork ---------------------------------------------------------------------------

    async def create(
        self, spec: SandboxSpec, *, start_paused: bool = False, on_network: NetworkHook | None = None
    ) -> SandboxRecord:
        await self.prepare()
        handle = await self._new_handle(spec, None)
        try:
            handle.base_disk = await asyncio.to_thread(
                vmimage.build_base_disk, self.vm_dir / "images", spec.rootfs, spec.shape.disk_mib
            )
            qemu_img = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(handle.base_disk)]
            await run([*qemu_img, str(handle.overlay), f"{spec.shape.disk_mib}M"])
            await self._launch(handle, _Boot(spec.shape.vcpu, spec.shape.mem_mib, spec.name))
            record = self._record(spec, handle)
            if on_network is not None:
                await on_network(record)
            await self._await_guest(spec.id, handle)
            if start_paused:
                await self.pause(record)
                record.state = RuntimeState.PAUSED
        except BaseException:
            await self._destroy_handle(spec.id, handle)
            raise
        return record

    async def fork(
        self,
        source: SandboxRecord,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        source_handle = _Handle.of(source)
        if self.probe(source) == RuntimeState.STOPPED:
            raise NotRunningError(f"sandbox {source.id} is not running")
        handle = await self._new_handle(spec, source_handle)
        memory = handle.dir / "memory.state"
        try:
            await self._snapshot(source, source_handle, memory, handle.overlay)
            boot = _Boot(source.vcpu, source.mem_mib, spec.name, incoming=memory)
            await self._launch(handle, boot)
            await self._await_incoming(handle)
            memory.unlink(missing_ok=True)
            channel = await self._open_channel(spec.id, handle)
            await qmp.execute(handle.qmp_socket, "cont")
            await channel.wait_ready(self.options.boot_timeout_s)
            channel.configure(handle.network.ip, handle.network.gateway, spec.name)
            record = self._record(spec, handle)
            record.vcpu, record.mem_mib, record.disk_mib = source.vcpu, source.mem_mib, source.disk_mib
            record.forked_from = source.id
            if on_network is not None:
                await on_network(record)
            await self._await_guest(spec.id, handle)
            if start_paused:
                await self.pause(record)
                record.state = RuntimeState.PAUSED
        except BaseException:
            memory.unlink(missing_ok=True)
            await self._destroy_handle(spec.id, handle)
            raise
        return record

    async def _snapshot(self, source: SandboxRecord, handle: _Handle, memory: Path, overlay: Path) -> None:
        """Source memory to ``memory`` and its disk to ``overlay``, at one instant; the source then
        goes on in the state it was in."""
        was_running = not handle.paused_marker.exists()
        await qmp.execute(handle.qmp_socket, "stop")
        try:
            await qmp.execute(handle.qmp_socket, "migrate", {"uri": f"exec:cat > {memory}"})
            deadline = time.monotonic() + 120
            while True:
                status = await qmp.execute(handle.qmp_socket, "query-migrate")
                if status.get("status") == "completed":
                    break
                if status.get("status") in ("failed", "cancelled") or time.monotonic() > deadline:
                    raise DriverError(f"snapshot of {source.id} failed: {status}")
                await asyncio.sleep(0.02)
            # Migration flushed and let go of the overlay: a copy now is the disk at that instant.
            await run(["cp", "--sparse=always", str(handle.overlay), str(overlay)])
        finally:
            if was_running:
                await qmp.execute(handle.qmp_socket, "cont")

    async def _await_incoming(self, handle: _Handle) -> None:
        deadline = time.monotonic() + self.options.boot_timeout_s
        while True:
            status = await qmp.execute(handle.qmp_socket, "query-status")
            if status.get("status") not in ("inmigrate", "prelaunch") or status.get("running"):
                break
            if time.monotonic() > deadline:
                raise BootError(f"restoring {handle.slot} did not finish: {status}")
            await asyncio.sleep(0.02)
        migrate = await qmp.execute(handle.qmp_socket, "query-migrate")
        if migrate.get("status") == "failed":
            raise BootError(f"restoring {handle.slot} failed: {migrate}")

    async def _new_handle(self, spec: SandboxSpec, source: _Handle | None) -> _Handle:
        slot = secrets.token_hex(4)
        handle = _Handle(
            slot=slot,
            dir=self.vm_dir / "slots" / slot,
            run_dir=self.run_root / slot,
            network=SandboxNetwork(slot=slot, ip="", gateway=self.options.network.gateway),
            base_disk=source.base_disk if source else Path(),
            accel=self.accel,
            mac=source.mac if source else "52:54:00:" + secrets.token_bytes(3).hex(":"),
        )
        handle.dir.mkdir(parents=True)
        handle.run_dir.mkdir(parents=True, exist_ok=True)
        (handle.dir / "slot.json").write_text(json.dumps({"sandbox": spec.id}))
        try:
            handle.network = await asyncio.to_thread(self.options.network.create, slot)
            await _join_tap(handle.network)
        except BaseException:
            await self._destroy_handle(spec.id, handle)
            raise
        return handle

    def _record(self, spec: SandboxSpec, handle: _Handle) -> SandboxRecord:
        return SandboxRecord.running(
            spec, ip=handle.network.ip, driver=self.name, driver_state=handle.to_json()
        )

    async def _launch(self, handle: _Handle, boot: _Boot) -> None:
        assert self._kernel is not None and self._initramfs is not None
        net = handle.network
        append = (
            f"console=ttyS0 quiet loglevel=3 panic=-1 tsc=reliable ipv6.disable=1 paddock.ip={net.ip}"
            f" paddock.gw={net.gateway} paddock.host={boot.hostname}"
        )
        accel = ["-accel", "kvm", "-cpu", "host"] if handle.accel == "kvm" else ["-accel", "tcg,thread=multi"]
        argv = [
            *("ip", "netns", "exec", net.netns, vmimage.qemu_binary()),
            *("-name", f"paddock-{handle.slot}", "-M", "q35", *accel),
            *("-m", str(boot.mem_mib), "-smp", str(boot.vcpu)),
            *("-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"),
            *("-kernel", str(self._kernel.vmlinuz), "-initrd", str(self._initramfs), "-append", append),
            # The guest's console goes to a ring in QEMU's memory, not a file: the tenant's root can
            # write to ttyS0 without end (rule 5). The ring is drained into console.log when read.
            *("-chardev", f"ringbuf,id=console,size={CONSOLE_RING_BYTES}", "-serial", "chardev:console"),
            *("-drive", f"file={handle.overlay},if=none,id=root,format=qcow2,discard=unmap"),
            *("-device", "virtio-blk-pci,drive=root"),
            *("-netdev", f"tap,id=net0,ifname={TAP},script=no,downscript=no,vnet_hdr=off"),
            *("-device", f"virtio-net-pci,netdev=net0,mac={handle.mac}"),
            *("-device", "virtio-serial-pci,id=vser"),
            *("-chardev", f"socket,id=chan,path={handle.port_socket},server=on,wait=off"),
            *("-device", "virtserialport,bus=vser.0,chardev=chan,name=paddock.0"),
            *("-qmp", f"unix:{handle.qmp_socket},server=on,wait=off"),
            *("-pidfile", str(handle.dir / "qemu.pid"), "-daemonize"),
        ]
        if boot.incoming is not None:
            argv += ["-S", "-incoming", f"exec:cat {boot.incoming}"]
        await _daemonize([*argv, *boot.extra], handle.dir / "qemu.log")
        handle.pid = int((handle.dir / "qemu.pid").read_text().strip())
        handle.ticks = host_processes.start_ticks(handle.pid) or 0

    async def _await_guest(self, sandbox_id: str, handle: _Handle) -> None:
        channel = self._channels.get(sandbox_id) or await self._open_channel(sandbox_id, handle)
        try:
            await channel.wait_ready(self.options.boot_timeout_s)
            await GuestClient(handle.guest_socket).wait_ready(self.options.boot_timeout_s)
        except GuestVersionError as exc:
            raise BootError(f"guest agent of {sandbox_id} refused: {exc}") from exc
        except (GuestError, TimeoutError) as exc:
            await self._drain_console(handle)
            raise BootError(
                f"guest agent of {sandbox_id} did not answer: {exc}{self._console(handle)}"
            ) from exc

    async def _open_channel(self, sandbox_id: str, handle: _Handle) -> GuestChannel:
        old = self._channels.pop(sandbox_id, None)
        if old is not None:
            await old.close()
        channel = GuestChannel(handle.port_socket, handle.guest_socket)
        await channel.start()
        self._channels[sandbox_id] = channel
        return channel

    @staticmethod
    async def _drain_console(handle: _Handle) -> None:
        """Moves what the guest's console ring holds to ``console.log``, keeping the file's last
        ``CONSOLE_FILE_BYTES`` (QEMU's ``ringbuf-read`` takes what it returns out of the ring)."""
        with contextlib.suppress(DriverError, OSError, ValueError):
            data = await qmp.execute(
                handle.qmp_socket,
                "ringbuf-read",
                {"device": "console", "size": CONSOLE_RING_BYTES, "format": "base64"},
            )
            chunk = base64.b64decode(data or "")
            if chunk:
                await asyncio.to_thread(_append_bounded, handle.dir / "console.log", chunk)

    @staticmethod
    def _console(handle: _Handle) -> str:
        with contextlib.suppress(OSError):
            text = (handle.dir / "console.log").read_text(errors="replace")[-2000:]
            if text.strip():
                return f"\nconsole:\n{text}"
        return ""

    # -- pause, resume, resize ------------------------------------------------------------------

    async def pause(self, record: SandboxRecord) -> None:
        handle = self._alive(record)
        await qmp.execute(handle.qmp_socket, "stop")
        handle.paused_marker.touch()

    async def resume(self, record: SandboxRecord) -> None:
        handle = self._alive(record)
        await qmp.execute(handle.qmp_socket, "cont")
        handle.paused_marker.unlink(missing_ok=True)

    async def resize(self, record: SandboxRecord, disk_mib: int) -> None:
        self.refuse(DISK_RESIZE, record)

    def refuse(self, operation: str, record: SandboxRecord | None = None) -> None:
        why = _NOT_ON_VMS.get(operation)
        if why is not None:
            raise TierUnsupportedError("vm", operation, why)

    def log_path(self, record: SandboxRecord, source: str) -> Path:
        # QEMU's own output (qemu.log) and the guest kernel's serial console (console.log), both in the
        # VM's directory on the host; the logs route reads only their ends (bootlog.read_tail).
        handle = _Handle.of(record)
        return handle.dir / ("qemu.log" if source == "boot" else "console.log")

    async def flush_log(self, record: SandboxRecord, source: str) -> None:
        if source == "guest":
            await self._drain_console(_Handle.of(record))

    def network_namespace(self, record: SandboxRecord) -> str:
        self.refuse(PRIVATE_NETWORKS, record)
        raise AssertionError("refused above")  # pragma: no cover

    def mount_namespace_pid(self, record: SandboxRecord) -> int:
        self.refuse(S3_DISKS, record)
        raise AssertionError("refused above")  # pragma: no cover

    def _alive(self, record: SandboxRecord) -> _Handle:
        handle = _Handle.of(record)
        if not host_processes.is_same_process(handle.pid, handle.ticks):
            raise NotRunningError(f"sandbox {record.id} has stopped")
        return handle

    # -- destroy --------------------------------------------------------------------------------

    async def destroy(self, record: SandboxRecord) -> None:
        await self._destroy_handle(record.id, _Handle.of(record))

    async def _destroy_handle(self, sandbox_id: str, handle: _Handle) -> None:
        channel = self._channels.pop(sandbox_id, None)
        if channel is not None:
            await channel.close()
        if not handle.pid:  # a launch that failed half-way: QEMU may have written its pid file
            handle.pid = _qemu_pid(handle.dir, handle.slot)
            handle.ticks = (host_processes.start_ticks(handle.pid) or 0) if handle.pid else 0
        if host_processes.is_same_process(handle.pid, handle.ticks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, signal.SIGKILL)
            await host_processes.wait_gone(handle.pid, handle.ticks, timeout_s=10)
        await asyncio.to_thread(self.options.network.destroy, handle.network)
        shutil.rmtree(handle.dir, ignore_errors=True)
        shutil.rmtree(handle.run_dir, ignore_errors=True)

    async def _remove_slot(self, slot: str) -> None:
        """An orphan slot (no record): kill its QEMU if one runs, remove its network and files."""
        slot_dir = self.vm_dir / "slots" / slot
        pid = _qemu_pid(slot_dir, slot)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        net = SandboxNetwork(slot=slot, ip="", gateway=self.options.network.gateway)
        await asyncio.to_thread(self.options.network.destroy, net)
        shutil.rmtree(slot_dir, ignore_errors=True)
        shutil.rmtree(self.run_root / slot, ignore_errors=True)

    # -- observation ----------------------------------------------------------------------------

    def probe(self, record: SandboxRecord) -> RuntimeState:
        handle = _Handle.of(record)
        if not host_processes.is_same_process(handle.pid, handle.ticks):
            return RuntimeState.STOPPED
        if handle.paused_marker.exists():
            return RuntimeState.PAUSED
        return RuntimeState.RUNNING

    def guest(self, record: SandboxRecord) -> GuestClient:
        return GuestClient(_Handle.of(record).guest_socket)

    def host_interface(self, record: SandboxRecord) -> str | None:
        return _Handle.of(record).network.host_veth

    def oom_kills(self, record: SandboxRecord) -> int:
        """The guest kernel's OOM kills, as the VM's channel last reported them (once a second)."""
        channel = self._channels.get(record.id)
        return channel.oom_kills if channel is not None else 0

    def memory_usage_bytes(self, record: SandboxRecord) -> int:
        handle = _Handle.of(record)
        with contextlib.suppress(OSError, ValueError):
            for line in host_processes.read_small(f"/proc/{handle.pid}/status").splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def resource_sample(self, record: SandboxRecord) -> ResourceSample | None:
        """The VM as the host sees it: CPU is the QEMU process's (every vCPU thread and the emulator's
        own), memory its resident set (the guest's touched RAM plus QEMU's own, not what the guest
        kernel counts as used), disk the blocks its qcow2 overlay holds on the host (the guest's disk
        is not mounted on the host, so the guest filesystem's free space is not seen)."""
        handle = _Handle.of(record)
        if not host_processes.is_same_process(handle.pid, handle.ticks):
            return None
        try:
            stat = host_processes.read_small(f"/proc/{handle.pid}/stat")
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu_ns = (int(fields[11]) + int(fields[12])) * 1_000_000_000 // _CLOCK_TICKS  # utime + stime
        return ResourceSample(
            cpu_ns,
            self.memory_usage_bytes(record),
            record.mem_mib << 20,
            self.disk_usage_bytes(record),
            record.disk_mib << 20,
        )

    def disk_usage_bytes(self, record: SandboxRecord) -> int:
        try:
            return os.stat(_Handle.of(record).overlay).st_blocks * 512
        except FileNotFoundError:
            return 0

    def disk_free_bytes(self) -> int:
        stats = os.statvfs(self.vm_dir if self.vm_dir.exists() else self.options.state_dir)
        return stats.f_bavail * stats.f_frsize


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _qemu_pid(slot_dir: Path, slot: str) -> int:
    """The pid in a slot's QEMU pid file if that process is this slot's QEMU, else 0."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((slot_dir / "qemu.pid").read_text().strip())
        if f"paddock-{slot}\0" in host_processes.read_small(f"/proc/{pid}/cmdline"):
            return pid
    return 0


async def _daemonize(argv: list[str], log_path: Path, timeout_s: float = 30.0) -> None:
    """Runs QEMU with ``-daemonize`` until its foreground process exits (the VM is then set up).

    Its output goes to a file, not a pipe: the daemon keeps the inherited descriptors while it sets
    up, and a pipe would also stay open as long as any other process happened to inherit it."""
    with open(log_path, "ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file
        )
    try:
        async with asyncio.timeout(timeout_s):
            code = await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise BootError(f"QEMU did not start in {timeout_s:.0f}s: {_tail(log_path)}") from None
    if code != 0:
        raise CommandFailedError(argv, code, _tail(log_path))


def _append_bounded(path: Path, chunk: bytes) -> None:
    """Appends ``chunk`` to ``path`` (the agent's own file in the VM's slot) and keeps its last
    ``CONSOLE_FILE_BYTES``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+b") as file:
        file.write(chunk)
        size = file.seek(0, os.SEEK_END)
        if size > CONSOLE_FILE_BYTES:
            file.seek(size - CONSOLE_FILE_BYTES)
            kept = file.read()
            file.truncate(0)
            file.write(kept)


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-1500:]
    return ""


async def _join_tap(net: SandboxNetwork) -> None:
    """A tap in the sandbox's namespace, joined to its eth0 both ways by tc redirects: the VM's
    frames leave through the veth (and its host-side rules) as a container's packets do."""
    await run(["ip", "-n", net.netns, "tuntap", "add", TAP, "mode", "tap"])
    await run(["ip", "-n", net.netns, "link", "set", TAP, "up"])
    redirect = "protocol all u32 match u32 0 0 action mirred egress redirect dev"
    batch = (
        f"qdisc add dev eth0 ingress\nfilter add dev eth0 parent ffff: {redirect} {TAP}\n"
        f"qdisc add dev {TAP} ingress\nfilter add dev {TAP} parent ffff: {redirect} eth0\n"
    )
    await run(["tc", "-n", net.netns, "-batch", "-"], input_text=batch)


async def _kvm_boots(kernel: vmimage.Kernel, initramfs: Path) -> bool:
    """Boots the initramfs under KVM in probe mode: True when it reaches userspace in time (on some
    nested hosts KVM exists but hangs at early boot)."""
    argv = [
        *(vmimage.qemu_binary(), "-M", "q35", "-accel", "kvm", "-m", "256", "-nodefaults"),
        *("-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio"),
        *("-kernel", str(kernel.vmlinuz), "-initrd", str(initramfs)),
        *("-append", "console=ttyS0 quiet panic=-1 paddock.probe=1"),
    ]
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(KVM_PROBE_TIMEOUT_S):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        log.info("kvm_probe_hung", timeout_s=KVM_PROBE_TIMEOUT_S)
        return False
    return vmimage.PROBE_MARKER.encode() in output
