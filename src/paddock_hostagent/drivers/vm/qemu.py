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

A create does not boot when a **saved state** matches (``vmsaved.py``: per image disk, kernel,
initramfs, memory, vCPUs, QEMU version, machine and accelerator). A guest is booted once for that key,
its agent let come up, its memory migrated to a file and its overlay kept; each create copies that
overlay, starts QEMU with ``-incoming`` from the file, and gives the guest its own address, MAC,
hostname, clock and random seed over the channel (CONFIG) before the agent's first answer. With no
state (or a stale or corrupt one, which is removed) the create boots cold and the state is built in
the background.

Pause and resume are QMP ``stop``/``cont``. Fork stops the source, migrates its memory to a file,
copies its (flushed) overlay and lets the source go on; the fork boots with ``-incoming`` from that
file on the copy, so **processes carry over**: a fork continues what its source was running. It then
gets its own address, MAC and hostname over the channel (CONFIG), as a restored create does. A
**snapshot** is the same copy kept on the host (``vmsnapshots.py``), memory and disk, and a create from
it boots as a fork's child does, so its processes carry over too. Destroy
kills QEMU and removes the namespace (with the tap), the files and the sockets; every step tolerates
having been done before.

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
from collections.abc import Callable, Sequence
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
    SnapshotInfo,
    TierUnsupportedError,
    UnsupportedError,
)
from paddock_hostagent.drivers.net.network import NetworkManager, SandboxNetwork
from paddock_hostagent.drivers.system import host_processes
from paddock_hostagent.drivers.system.commands import run
from paddock_hostagent.drivers.vm import qmp, vmimage, vmsaved, vmsnapshots
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
MACHINE = "q35"
#: The guest kernel's command line before the sandbox's own words. ``init_on_free=1``: pages the guest
#: frees (the unpacked initramfs, boot-time buffers) are zeroed, so a saved state's memory file holds
#: them as zero pages (a few bytes each) and a restore reads less.
KERNEL_ARGS = "console=ttyS0 quiet loglevel=3 panic=-1 tsc=reliable ipv6.disable=1 init_on_free=1"
#: After a saved state failed to build, creates of its key boot cold without retrying it for this long
#: (a full state disk or a broken image would otherwise cost a second boot per create).
SAVED_STATE_RETRY_S = 600.0
#: How a VM came up (``driver_state["boot"]``).
COLD, RESTORED, FORKED, FROM_SNAPSHOT, WOKEN = "cold", "restored", "forked", "snapshot", "woken"
#: A hibernated VM's ``driver_state`` (as the OCI driver's, drivers/runtime/oci.py): ``{"hibernated":
#: meta}``, and while its stopped QEMU is still being taken down, ``"teardown"``: its former driver_state.
HIBERNATION, TEARDOWN = "hibernated", "teardown"
HIBERNATE = "hibernating a sandbox"
#: What a VM holding volumes cannot do: its memory has them mounted, and a copy would write them too.
VOLUME_HELD = "its memory holds its volumes mounted (a copy would be a second writer); destroy it first"
#: The most the volume words may add to the guest's command line (the kernel keeps 2048 bytes of it).
MAX_VOLUME_ARGS = 1400


@dataclass(frozen=True)
class VolumeDrive:
    """A local volume given to a VM at its boot: the volume's image file as an extra virtio-blk drive
    (read-only on QEMU's side for a read-only mount), mounted by ``paddock-vminit`` at ``mount_path``."""

    image: Path
    mount_path: str
    read_only: bool

    def to_json(self) -> dict[str, Any]:
        return {"image": str(self.image), "mount_path": self.mount_path, "read_only": self.read_only}

    @classmethod
    def of_json(cls, data: dict[str, Any]) -> VolumeDrive:
        return cls(Path(str(data["image"])), str(data["mount_path"]), bool(data["read_only"]))


def volume_args(drives: Sequence[VolumeDrive]) -> tuple[list[str], str]:
    """QEMU's ``-drive``/``-device`` arguments for ``drives`` and the guest's ``paddock.vol=`` words
    (``<serial>,<ro|rw>,<mount path in base64>``: a path may hold any printable character but space)."""
    argv: list[str] = []
    words: list[str] = []
    for index, drive in enumerate(drives):
        serial = f"paddockvol{index}"
        mode = "ro" if drive.read_only else "rw"
        argv += [
            "-drive",
            f"file={drive.image},if=none,id=vol{index},format=raw,readonly={'on' if drive.read_only else 'off'}",
            "-device",
            f"virtio-blk-pci,drive=vol{index},serial={serial}",
        ]
        path = base64.b64encode(drive.mount_path.encode()).decode()
        words.append(f"paddock.vol={serial},{mode},{path}")
    line = " ".join(words)
    if len(line) > MAX_VOLUME_ARGS:
        raise UnsupportedError(
            f"the volumes' mount paths are too long for the VM's boot ({len(line)} of {MAX_VOLUME_ARGS} bytes)"
        )
    return argv, line


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
    # Creates restore a saved state where one matches (and build one in the background where none does).
    saved_states: bool = True


@dataclass
class _Handle:
    """The QEMU part of a record's ``driver_state``."""

    slot: str
    dir: Path
    run_dir: Path
    network: SandboxNetwork
    base_disk: Path
    accel: str
    mac: str  # the guest's eth0 address, this VM's own
    # The MAC on QEMU's command line: a restored or forked VM's is the device state's it was saved with
    # (the guest then sets its own ``mac`` on eth0).
    qemu_mac: str = ""
    boot: str = COLD
    pid: int = 0
    ticks: int = 0
    #: Local volumes given at its boot (drives of its machine and mounts in its memory).
    volumes: int = 0
    #: Those drives, in their order on the machine: a restore of its memory (a wake) must give the same
    #: drives at the same places. Empty with ``volumes`` set: a VM an older agent booted.
    drives: tuple[VolumeDrive, ...] = ()

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
            "qemu_mac": self.qemu_mac or self.mac,
            "boot": self.boot,
            "pid": self.pid,
            "ticks": self.ticks,
            "volumes": self.volumes,
            "drives": [drive.to_json() for drive in self.drives],
        }

    @classmethod
    def of(cls, record: SandboxRecord) -> _Handle:
        return cls.of_state(record.driver_state)

    @classmethod
    def of_state(cls, data: dict[str, Any]) -> _Handle:
        return cls(
            data["slot"],
            Path(data["dir"]),
            Path(data["run_dir"]),
            SandboxNetwork(slot=data["slot"], ip=data["ip"], gateway=data["gateway"]),
            Path(data["base_disk"]),
            data["accel"],
            data["mac"],
            data.get("qemu_mac") or data["mac"],
            data.get("boot", COLD),
            data["pid"],
            data["ticks"],
            int(data.get("volumes", 0)),
            tuple(VolumeDrive.of_json(drive) for drive in data.get("drives", ())),
        )


@dataclass
class _Boot:
    """What one QEMU start needs beyond the handle."""

    vcpu: int
    mem_mib: int
    hostname: str
    incoming: Path | None = None
    extra: list[str] = field(default_factory=list)
    #: Extra words for the guest's command line (its volumes).
    append: str = ""


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
        self.saved = vmsaved.SavedStates(self.vm_dir / "saved")
        #: Whether creates restore saved states (``options.saved_states``; the bench turns it off to
        #: time the cold boot in the same run).
        self.restore = options.saved_states
        self._builds: dict[str, asyncio.Task[vmsaved.SavedState | None]] = {}
        self._build_lock = asyncio.Lock()  # one background boot at a time: each takes a core under TCG
        self._build_failed_at: dict[str, float] = {}  # key digest -> time.monotonic() of the failure
        self.snapshots = vmsnapshots.VmSnapshots(self.vm_dir / "snapshots")

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
        # saved states of another kernel, initramfs, QEMU … can never be restored: removed
        now = self._saved_key(Path(), 0, 0)
        current = {name: getattr(now, name) for name in vmsaved.HOST_FIELDS}
        await asyncio.to_thread(self.saved.sweep, current, self.vm_dir / "images")
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
        mine = _mine(records)
        states: dict[str, RuntimeState] = {}
        for record in mine:
            states[record.id] = self.probe(record)
            if states[record.id] != RuntimeState.STOPPED:
                with contextlib.suppress(Exception):
                    await self._open_channel(record.id, _Handle.of(record))
        await self._resume_snapshot_sources(mine)
        await self._reclaim(mine)
        return states

    async def retire(self, records: list[SandboxRecord]) -> None:
        mine = _mine(records)
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
        for task in list(self._builds.values()):
            task.cancel()
        for task in list(self._builds.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._builds.clear()
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
        self,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
        volume_drives: Callable[[], Sequence[VolumeDrive]] | None = None,
    ) -> SandboxRecord:
        """``volume_drives``: the local volumes to give the VM at its boot (called once). A VM with
        volumes boots cold: a saved state's machine has no drives for them."""
        drives = tuple(volume_drives()) if volume_drives is not None else ()
        drive_argv, drive_words = volume_args(drives)
        await self.prepare()
        base_disk = await asyncio.to_thread(
            vmimage.build_base_disk, self.vm_dir / "images", spec.rootfs, spec.shape.disk_mib
        )
        key = self._saved_key(base_disk, spec.shape.mem_mib, spec.shape.vcpu)
        saved = await asyncio.to_thread(self.saved.load, key) if self.restore and not drives else None
        if saved is not None:
            try:
                return await self._create_restored(spec, saved, base_disk, start_paused, on_network)
            except _RestoreFailedError as exc:
                # a state QEMU cannot load, or whose guest does not come up, never runs a sandbox
                # again: it is removed and this create boots cold
                log.warning("vm_saved_state_failed", sandbox=spec.id, dir=str(saved.dir), error=str(exc))
                await asyncio.to_thread(self.saved.discard, key)
        failed_at = self._build_failed_at.get(key.digest)
        if self.restore and (failed_at is None or time.monotonic() - failed_at > SAVED_STATE_RETRY_S):
            self._build_in_background(key, base_disk)
        handle = await self._new_handle(spec.id, None)
        handle.base_disk = base_disk
        handle.volumes, handle.drives = len(drives), drives
        try:
            await self._create_overlay(handle)
            boot = _Boot(spec.shape.vcpu, spec.shape.mem_mib, spec.name, extra=drive_argv, append=drive_words)
            await self._launch(handle, boot)
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

    async def _create_restored(
        self,
        spec: SandboxSpec,
        saved: vmsaved.SavedState,
        base_disk: Path,
        start_paused: bool,
        on_network: NetworkHook | None,
    ) -> SandboxRecord:
        """A create from a saved state: a copy of its overlay, its memory read into a new QEMU, then
        this sandbox's identity set before the agent answers. ``_RestoreFailedError`` when the state
        is at fault (QEMU does not load it, the guest does not come up); other errors as they are."""
        phases = _Phases()
        handle = await self._new_handle(spec.id, None)
        handle.base_disk, handle.qemu_mac, handle.boot = base_disk, saved.mac, RESTORED
        phases.mark("network")
        try:
            try:
                await run(["cp", "--reflink=auto", "--sparse=always", str(saved.disk), str(handle.overlay)])
                phases.mark("disk")
                boot = _Boot(spec.shape.vcpu, spec.shape.mem_mib, spec.name, incoming=saved.memory)
                await self._load_memory(spec, handle, boot, phases)
            except (DriverError, OSError, TimeoutError) as exc:
                raise _RestoreFailedError(str(exc)) from exc
            record = self._record(spec, handle)
            if on_network is not None:
                await on_network(record)
            try:
                await self._await_guest(spec.id, handle)
            except BootError as exc:
                raise _RestoreFailedError(str(exc)) from exc
            phases.mark("agent")
            log.info("vm_restored", sandbox=spec.id, **phases.ms())
            if start_paused:
                await self.pause(record)
                record.state = RuntimeState.PAUSED
        except BaseException:
            await self._destroy_handle(spec.id, handle)
            raise
        return record

    async def _create_overlay(self, handle: _Handle) -> None:
        size = os.stat(handle.base_disk).st_size
        qemu_img = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(handle.base_disk)]
        await run([*qemu_img, str(handle.overlay), str(size)])

    async def _load_memory(self, spec: SandboxSpec, handle: _Handle, boot: _Boot, phases: _Phases) -> None:
        """A QEMU started on ``boot.incoming`` (a saved state, a fork's or a snapshot's memory), the
        memory read in, then this sandbox's own identity set before its agent answers: what a restored
        create, a fork and a boot from a snapshot share."""
        await self._launch(handle, boot)
        phases.mark("qemu")
        await self._await_incoming(handle)
        phases.mark("memory")
        await self._continue_incoming(spec.id, handle, spec.name)
        phases.mark("identity")

    async def _continue_incoming(self, sandbox_id: str, handle: _Handle, hostname: str) -> None:
        """After ``-incoming`` has loaded the memory: lets the guest run and gives it its own
        identity (address, MAC, hostname, clock, random seed) before any request reaches the agent."""
        channel = await self._open_channel(sandbox_id, handle)
        await qmp.execute(handle.qmp_socket, "cont")
        await channel.wait_ready(self.options.boot_timeout_s)
        channel.configure(handle.network.ip, handle.network.gateway, hostname, handle.mac)

    def _saved_key(self, base_disk: Path, mem_mib: int, vcpu: int) -> vmsaved.SavedKey:
        assert self._kernel is not None and self._initramfs is not None
        return vmsaved.SavedKey(
            base_disk=base_disk.name,
            kernel=self._kernel.version,
            initramfs=self._initramfs.name,
            mem_mib=mem_mib,
            vcpu=vcpu,
            qemu=vmsaved.qemu_version(vmimage.qemu_binary()),
            machine=MACHINE,
            accel=self.accel,
            kernel_args=KERNEL_ARGS,
        )

    # -- saved states ---------------------------------------------------------------------------

    async def ensure_saved_state(
        self, rootfs: Path, mem_mib: int, vcpu: int, disk_mib: int
    ) -> vmsaved.SavedState:
        """The saved state creates of this image and shape restore, built now if there is none (an
        operator's warm-up, the bench's and the tests')."""
        await self.prepare()
        base_disk = await asyncio.to_thread(vmimage.build_base_disk, self.vm_dir / "images", rootfs, disk_mib)
        key = self._saved_key(base_disk, mem_mib, vcpu)
        saved = await asyncio.to_thread(self.saved.load, key)
        if saved is not None:
            return saved
        task = self._build_in_background(key, base_disk)
        built = await asyncio.shield(task)
        if built is None:
            raise BootError(f"saving a booted VM for {rootfs} failed (see the host agent's log)")
        return built

    async def wait_saved_states(self) -> None:
        """Waits for the saved states being built in the background (tests, the bench)."""
        for task in list(self._builds.values()):
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def _build_in_background(
        self, key: vmsaved.SavedKey, base_disk: Path
    ) -> asyncio.Task[vmsaved.SavedState | None]:
        task = self._builds.get(key.digest)
        if task is None or task.done():
            task = asyncio.create_task(self._build_saved(key, base_disk))
            self._builds[key.digest] = task
            task.add_done_callback(lambda done: self._forget_build(key.digest, done))
        return task

    def _forget_build(self, digest: str, task: asyncio.Task[vmsaved.SavedState | None]) -> None:
        if self._builds.get(digest) is task:
            del self._builds[digest]

    async def _build_saved(self, key: vmsaved.SavedKey, base_disk: Path) -> vmsaved.SavedState | None:
        """Boots a guest for ``key``, waits for its agent, and saves its memory and disk; None if that
        failed (logged: the next create boots cold and tries again)."""
        async with self._build_lock:
            existing = await asyncio.to_thread(self.saved.load, key)
            if existing is not None:
                return existing
            sandbox_id = f"saved-{key.digest[:12]}"
            started = time.monotonic()
            handle: _Handle | None = None
            building = await asyncio.to_thread(self.saved.building_dir, key)
            try:
                handle = await self._new_handle(sandbox_id, None)
                handle.base_disk = base_disk
                await self._create_overlay(handle)
                await self._launch(handle, _Boot(key.vcpu, key.mem_mib, "paddock-saved"))
                await self._await_guest(sandbox_id, handle)
                await self._snapshot(
                    sandbox_id, handle, building / "memory.state", building / "disk.qcow2", resume=False
                )
                saved = await asyncio.to_thread(self.saved.commit, key, building, handle.mac)
                log.info(
                    "vm_saved_state_built", dir=str(saved.dir), ms=round((time.monotonic() - started) * 1000)
                )
                self._build_failed_at.pop(key.digest, None)
                return saved
            except Exception as exc:
                log.warning("vm_saved_state_build_failed", key=key.digest, error=str(exc))
                self._build_failed_at[key.digest] = time.monotonic()
                return None
            finally:
                if handle is not None:
                    await self._destroy_handle(sandbox_id, handle)
                shutil.rmtree(building, ignore_errors=True)

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
        if source_handle.volumes:
            raise TierUnsupportedError("vm", "forking a VM that holds a volume", VOLUME_HELD)
        handle = await self._new_handle(spec.id, source_handle)
        memory = handle.dir / "memory.state"
        try:
            await self._snapshot(source.id, source_handle, memory, handle.overlay)
            boot = _Boot(source.vcpu, source.mem_mib, spec.name, incoming=memory)
            await self._load_memory(spec, handle, boot, _Phases())
            memory.unlink(missing_ok=True)
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

    async def _snapshot(
        self, source_id: str, handle: _Handle, memory: Path, overlay: Path, *, resume: bool = True
    ) -> None:
        """Source memory to ``memory`` and its disk to ``overlay``, at one instant; the source then
        goes on in the state it was in (unless not ``resume``)."""
        was_running = resume and not handle.paused_marker.exists()
        await qmp.execute(handle.qmp_socket, "stop")
        try:
            await qmp.execute(handle.qmp_socket, "migrate", {"uri": f"exec:cat > {memory}"})
            deadline = time.monotonic() + 120
            while True:
                status = await qmp.execute(handle.qmp_socket, "query-migrate")
                if status.get("status") == "completed":
                    break
                if status.get("status") in ("failed", "cancelled") or time.monotonic() > deadline:
                    raise DriverError(f"snapshot of {source_id} failed: {status}")
                await asyncio.sleep(0.02)
            # Migration flushed and let go of the overlay: a copy now is the disk at that instant.
            await run(["cp", "--reflink=auto", "--sparse=always", str(handle.overlay), str(overlay)])
        except BaseException:
            # a migration still writing (timed out, or this task cancelled) ends before the VM goes on
            with contextlib.suppress(DriverError, OSError):
                await qmp.execute(handle.qmp_socket, "migrate_cancel")
            raise
        finally:
            if was_running:
                await qmp.execute(handle.qmp_socket, "cont")

    # -- snapshots ------------------------------------------------------------------------------

    async def snapshot(self, record: SandboxRecord, snapshot_id: str) -> SnapshotInfo:
        """The sandbox's memory and disk at one instant, kept until ``delete_snapshot``: the VM is stopped
        (QMP ``stop``), its memory migrated to ``memory.state`` (which flushes and lets go of its
        overlay), the overlay copied (``cp --reflink=auto``), and the VM let go on unless it was paused.
        Written in ``.partial-<id>`` and renamed once whole (``vmsnapshots.py``); an agent killed while
        the source is stopped for it leaves a mark, and the next agent lets the source go on (``start``)."""
        handle = self._alive(record)
        if handle.volumes:
            raise TierUnsupportedError("vm", "a snapshot of a VM that holds a volume", VOLUME_HELD)
        await self.prepare()
        final = self.snapshots.path(snapshot_id)  # ValueError for anything but an id
        if final.exists():
            raise DriverError(f"snapshot {snapshot_id} exists")
        partial = await asyncio.to_thread(self.snapshots.partial_dir, snapshot_id)
        try:
            if not handle.paused_marker.exists():
                (partial / vmsnapshots.RESUME_MARKER).write_text(record.id)
            await self._snapshot(record.id, handle, partial / "memory.state", partial / "disk.qcow2")
            host = self._saved_key(Path(), 0, 0)
            meta = {
                "image": record.image,
                "disk_mib": record.disk_mib,
                "mem_mib": record.mem_mib,
                "vcpu": record.vcpu,
                "base_disk": handle.base_disk.name,
                "qemu_mac": handle.qemu_mac or handle.mac,
                "host": {name: getattr(host, name) for name in vmsaved.HOST_FIELDS},
                "source_id": record.id,
                "created_at": time.time(),
            }
            snap = await asyncio.to_thread(self.snapshots.commit, snapshot_id, partial, meta)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, partial, True)
            raise
        return _snapshot_info(snap)

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo | None:
        snap = self.snapshots.load(snapshot_id)
        return _snapshot_info(snap) if snap is not None else None

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await asyncio.to_thread(self.snapshots.delete, snapshot_id)

    async def create_from_snapshot(
        self,
        snapshot: SnapshotInfo,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        """A new VM from the snapshot, as a fork's child from its source: a copy of its overlay, its
        memory read with ``-incoming``, then its own address, MAC, hostname, clock and random seed
        (CONFIG). The processes the source ran carry over. It has the snapshot's vCPUs and memory (a
        memory state restores only into the machine it was taken of) and its disk size."""
        await self.prepare()
        snap = await asyncio.to_thread(self.snapshots.load, snapshot.id)
        if snap is None:
            raise DriverError(f"snapshot {snapshot.id} is not on this host")
        meta = snap.meta
        host = self._saved_key(Path(), 0, 0)
        changed = [name for name in vmsaved.HOST_FIELDS if meta["host"].get(name) != getattr(host, name)]
        if changed:
            raise BootError(
                f"snapshot {snapshot.id} holds the memory of a VM under another {', '.join(changed)} than"
                " this host's now: it cannot be restored"
            )
        base_disk = self.vm_dir / "images" / str(meta["base_disk"])
        if not base_disk.is_file():
            raise BootError(f"the image disk under snapshot {snapshot.id} is gone from this host")
        vcpu, mem_mib, disk_mib = int(meta["vcpu"]), int(meta["mem_mib"]), int(meta["disk_mib"])
        phases = _Phases()
        handle = await self._new_handle(spec.id, None)
        handle.base_disk, handle.qemu_mac, handle.boot = base_disk, str(meta["qemu_mac"]), FROM_SNAPSHOT
        phases.mark("network")
        try:
            await run(["cp", "--reflink=auto", "--sparse=always", str(snap.disk), str(handle.overlay)])
            phases.mark("disk")
            await self._load_memory(
                spec, handle, _Boot(vcpu, mem_mib, spec.name, incoming=snap.memory), phases
            )
            record = self._record(spec, handle)
            record.vcpu, record.mem_mib, record.disk_mib = vcpu, mem_mib, disk_mib
            if on_network is not None:
                await on_network(record)
            await self._await_guest(spec.id, handle)
            phases.mark("agent")
            log.info("vm_snapshot_booted", sandbox=spec.id, snapshot_id=snapshot.id, **phases.ms())
            if start_paused:
                await self.pause(record)
                record.state = RuntimeState.PAUSED
        except BaseException:
            await self._destroy_handle(spec.id, handle)
            raise
        return record

    # -- hibernation ----------------------------------------------------------------------------

    @property
    def hibernated_dir(self) -> Path:
        return self.vm_dir / "hibernated"

    def refuse_hibernation(self, record: SandboxRecord) -> None:
        """A VM holding a volume has it mounted in its memory: its wake gives the same drives back at
        the same places (``_Handle.drives``; the volume stays held by the sandbox meanwhile, so nothing
        else writes it). A VM an older agent booted did not record its drives, and is refused."""
        handle = _Handle.of(record)
        if handle.volumes and len(handle.drives) != handle.volumes:
            raise TierUnsupportedError("vm", f"{HIBERNATE} that holds a volume", VOLUME_HELD)

    async def hibernate(self, record: SandboxRecord) -> dict[str, Any]:
        """Stops the VM (QMP ``stop``), migrates its memory to ``memory.state`` (which flushes and lets
        go of its overlay) and copies the overlay to ``disk.qcow2``, in ``<vm>/hibernated/.partial-<id>``;
        writes ``meta.json``, syncs and renames the directory to the id. Answers the record's
        driver_state once hibernated. The VM is left stopped: saving that state is the commit (the
        caller's), then ``release_hibernated`` kills QEMU and frees the slot. Until the commit the VM is
        as it was: ``abandon_hibernation`` (or the next agent's start) lets it go on."""
        self.refuse_hibernation(record)
        handle = self._alive(record)
        await self.prepare()
        base = self.hibernated_dir
        final, partial = base / record.id, base / f"{vmsnapshots.PARTIAL_PREFIX}{record.id}"
        for stale in (final, partial):  # of an earlier attempt the agent died in, never committed
            await asyncio.to_thread(shutil.rmtree, stale, True)
        partial.mkdir(parents=True)
        was_paused = handle.paused_marker.exists()
        try:
            if not was_paused:  # killed from here to the commit, the next agent lets it go on
                (partial / vmsnapshots.RESUME_MARKER).write_text(record.id)
            await self._snapshot(
                record.id, handle, partial / "memory.state", partial / "disk.qcow2", resume=False
            )
            host = self._saved_key(Path(), 0, 0)
            meta: dict[str, Any] = {
                "image": record.image,
                "disk_mib": record.disk_mib,
                "mem_mib": record.mem_mib,
                "vcpu": record.vcpu,
                "base_disk": handle.base_disk.name,
                "ip": handle.network.ip,
                "mac": handle.mac,
                "qemu_mac": handle.qemu_mac or handle.mac,
                "host": {name: getattr(host, name) for name in vmsaved.HOST_FIELDS},
                "hibernated_at": time.time(),
                "was_paused": was_paused,
                # QEMU's migration flushed the drives: each volume's file holds what the guest wrote.
                "drives": [drive.to_json() for drive in handle.drives],
            }
            await asyncio.to_thread(_seal_hibernation, partial, final, meta)
        except BaseException:
            if not was_paused:
                with contextlib.suppress(DriverError, OSError):
                    await qmp.execute(handle.qmp_socket, "cont")
            await asyncio.to_thread(shutil.rmtree, partial, True)
            raise
        return {HIBERNATION: meta, TEARDOWN: record.driver_state}

    async def abandon_hibernation(self, record: SandboxRecord) -> None:
        """A hibernation whose commit failed: the copy goes and the VM runs as it did."""
        final = self.hibernated_dir / record.id
        if (final / vmsnapshots.RESUME_MARKER).exists():
            with contextlib.suppress(DriverError, OSError):
                await qmp.execute(_Handle.of(record).qmp_socket, "cont")
        await asyncio.to_thread(shutil.rmtree, final, True)

    async def release_hibernated(self, sandbox_id: str, teardown: dict[str, Any]) -> None:
        """Takes down what ran of a hibernated VM (``teardown``: its former driver_state): its QEMU (and
        with it the guest's memory), its slot, overlay, tap, namespace and address."""
        await self._destroy_handle(sandbox_id, _Handle.of_state(teardown))

    async def wake(
        self,
        record: SandboxRecord,
        spec: SandboxSpec,
        *,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        """Restores a hibernated VM from its kept memory and overlay, as a boot from a snapshot but as
        itself: its MAC, hostname and (when still free on this host) its address again. Its processes
        go on where they stopped."""
        meta = record.driver_state.get(HIBERNATION)
        if not isinstance(meta, dict):
            raise DriverError(f"sandbox {record.id} is not hibernated")
        await self.prepare()
        kept = self.hibernated_dir / record.id
        memory, disk = kept / "memory.state", kept / "disk.qcow2"
        host = self._saved_key(Path(), 0, 0)
        changed = [name for name in vmsaved.HOST_FIELDS if meta["host"].get(name) != getattr(host, name)]
        if changed:
            raise BootError(
                f"sandbox {record.id} was hibernated under another {', '.join(changed)} than this host's"
                " now: its memory cannot be restored"
            )
        base_disk = self.vm_dir / "images" / str(meta["base_disk"])
        if not (memory.is_file() and disk.is_file() and base_disk.is_file()):
            raise DriverError(f"the kept memory or disk of sandbox {record.id} is missing on this host")
        vcpu, mem_mib, disk_mib = int(meta["vcpu"]), int(meta["mem_mib"]), int(meta["disk_mib"])
        drives = tuple(VolumeDrive.of_json(drive) for drive in meta.get("drives", ()))
        missing = [str(drive.image) for drive in drives if not drive.image.is_file()]
        if missing:
            raise DriverError(f"the volumes of sandbox {record.id} are missing on this host: {missing}")
        drive_argv, drive_words = volume_args(drives)  # the same machine as the one saved
        phases = _Phases()
        handle = await self._new_handle(
            record.id, None, prefer_ip=str(meta.get("ip") or ""), mac=str(meta["mac"])
        )
        handle.base_disk, handle.qemu_mac, handle.boot = base_disk, str(meta["qemu_mac"]), WOKEN
        handle.volumes, handle.drives = len(drives), drives
        phases.mark("network")
        try:
            await run(["cp", "--reflink=auto", "--sparse=always", str(disk), str(handle.overlay)])
            phases.mark("disk")
            boot = _Boot(vcpu, mem_mib, spec.name, incoming=memory, extra=drive_argv, append=drive_words)
            await self._load_memory(spec, handle, boot, phases)
            woken = self._record(spec, handle)
            woken.vcpu, woken.mem_mib, woken.disk_mib = vcpu, mem_mib, disk_mib
            if on_network is not None:
                await on_network(woken)
            await self._await_guest(record.id, handle)
            phases.mark("agent")
            log.info(
                "vm_woken", sandbox=record.id, same_ip=handle.network.ip == meta.get("ip"), **phases.ms()
            )
        except BaseException:
            await self._destroy_handle(record.id, handle)
            raise
        return woken

    async def forget_hibernation(self, sandbox_id: str) -> None:
        """The kept memory and disk of a VM that woke (it runs on copies) or was destroyed."""
        await asyncio.to_thread(shutil.rmtree, self.hibernated_dir / sandbox_id, True)

    async def settle_hibernations(self, records: list[SandboxRecord]) -> None:
        """At the agent's start, before adopting: a hibernation the previous agent died in is finished or
        undone. Committed (the record says hibernated): its QEMU and slot go (a slot a wake made and
        never recorded is reclaimed by ``start``, no record owning it). Not committed: the copy goes and
        the VM stopped for it goes on."""
        by_id = {record.id: record for record in records if record.driver == self.name}
        for record in by_id.values():
            meta = record.driver_state.get(HIBERNATION)
            if not isinstance(meta, dict):
                continue
            teardown = record.driver_state.get(TEARDOWN)
            if isinstance(teardown, dict):
                with contextlib.suppress(Exception):
                    await self._destroy_handle(record.id, _Handle.of_state(teardown))
            record.driver_state = {HIBERNATION: meta}
        base = self.hibernated_dir
        for directory in sorted(base.iterdir()) if base.is_dir() else []:
            sandbox_id = directory.name.removeprefix(vmsnapshots.PARTIAL_PREFIX)
            owner = by_id.get(sandbox_id)
            if directory.name == sandbox_id and owner is not None and HIBERNATION in owner.driver_state:
                continue  # a whole hibernation, committed
            if (
                owner is not None
                and "slot" in owner.driver_state
                and (directory / vmsnapshots.RESUME_MARKER).exists()
            ):
                handle = _Handle.of(owner)
                with contextlib.suppress(DriverError, OSError):
                    await qmp.execute(handle.qmp_socket, "migrate_cancel")
                with contextlib.suppress(DriverError, OSError):
                    await qmp.execute(handle.qmp_socket, "cont")
                    log.warning("hibernation_undone", sandbox_id=sandbox_id)
            await asyncio.to_thread(shutil.rmtree, directory, True)

    async def _resume_snapshot_sources(self, mine: list[SandboxRecord]) -> None:
        """A snapshot an earlier agent died writing may have left its source stopped for the copy:
        its migration is cancelled and the source goes on (the half-made snapshot is removed)."""
        stopped = set(await asyncio.to_thread(self.snapshots.sweep))
        for record in mine:
            if record.id not in stopped or self.probe(record) != RuntimeState.RUNNING:
                continue
            handle = _Handle.of(record)
            with contextlib.suppress(DriverError, OSError):
                await qmp.execute(handle.qmp_socket, "migrate_cancel")
            with contextlib.suppress(DriverError, OSError):
                await qmp.execute(handle.qmp_socket, "cont")
                log.warning("vm_snapshot_source_resumed", sandbox_id=record.id)

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

    async def _new_handle(
        self, sandbox_id: str, source: _Handle | None, *, prefer_ip: str | None = None, mac: str = ""
    ) -> _Handle:
        """A slot with its network; a fork's QEMU keeps its source's device MAC, every VM gets its own
        guest MAC (a woken one its own again: ``mac``, and its address ``prefer_ip`` if still free)."""
        slot = secrets.token_hex(4)
        handle = _Handle(
            slot=slot,
            dir=self.vm_dir / "slots" / slot,
            run_dir=self.run_root / slot,
            network=SandboxNetwork(slot=slot, ip="", gateway=self.options.network.gateway),
            base_disk=source.base_disk if source else Path(),
            accel=self.accel,
            mac=mac or _new_mac(),
            qemu_mac=source.qemu_mac if source else "",
            boot=FORKED if source else COLD,
        )
        handle.qemu_mac = handle.qemu_mac or handle.mac
        handle.dir.mkdir(parents=True)
        handle.run_dir.mkdir(parents=True, exist_ok=True)
        (handle.dir / "slot.json").write_text(json.dumps({"sandbox": sandbox_id}))
        try:
            handle.network = await asyncio.to_thread(self.options.network.create, slot, prefer_ip)
            await _join_tap(handle.network)
        except BaseException:
            await self._destroy_handle(sandbox_id, handle)
            raise
        return handle

    def _record(self, spec: SandboxSpec, handle: _Handle) -> SandboxRecord:
        return SandboxRecord.running(
            spec, ip=handle.network.ip, driver=self.name, driver_state=handle.to_json()
        )

    async def _launch(self, handle: _Handle, boot: _Boot) -> None:
        assert self._kernel is not None and self._initramfs is not None
        net = handle.network
        append = f"{KERNEL_ARGS} paddock.ip={net.ip} paddock.gw={net.gateway} paddock.host={boot.hostname}"
        if boot.append:
            append = f"{append} {boot.append}"
        accel = ["-accel", "kvm", "-cpu", "host"] if handle.accel == "kvm" else ["-accel", "tcg,thread=multi"]
        argv = [
            # Into the slot's network namespace only: ``ip netns exec`` also gives the process a mount
            # namespace of its own, a copy of every host mount at that moment. On a host whose mounts do
            # not propagate (``/`` private, as in a container) QEMU would hold every other sandbox's
            # disk mounted for as long as the VM runs, long after those sandboxes were destroyed.
            *("nsenter", f"--net=/run/netns/{net.netns}", "--", vmimage.qemu_binary()),
            *("-name", f"paddock-{handle.slot}", "-M", MACHINE, *accel),
            *("-m", str(boot.mem_mib), "-smp", str(boot.vcpu)),
            *("-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"),
            *("-kernel", str(self._kernel.vmlinuz), "-initrd", str(self._initramfs), "-append", append),
            # The guest's console goes to a ring in QEMU's memory, not a file: the tenant's root can
            # write to ttyS0 without end (rule 5). The ring is drained into console.log when read.
            *("-chardev", f"ringbuf,id=console,size={CONSOLE_RING_BYTES}", "-serial", "chardev:console"),
            *("-drive", f"file={handle.overlay},if=none,id=root,format=qcow2,discard=unmap"),
            *("-device", "virtio-blk-pci,drive=root"),
            *("-netdev", f"tap,id=net0,ifname={TAP},script=no,downscript=no,vnet_hdr=off"),
            *("-device", f"virtio-net-pci,netdev=net0,mac={handle.qemu_mac or handle.mac}"),
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


class _RestoreFailedError(DriverError):
    """A saved state could not be restored (the create falls back to a cold boot)."""


class _Phases:
    """Milliseconds between marks (a restored create's log line: where its time went)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._ms: dict[str, int] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self._ms[f"{name}_ms"] = round((now - self._last) * 1000)
        self._last = now

    def ms(self) -> dict[str, int]:
        return dict(self._ms)


def _snapshot_info(snap: vmsnapshots.VmSnapshot) -> SnapshotInfo:
    return SnapshotInfo(
        id=snap.id,
        path=snap.disk,
        image=str(snap.meta["image"]),
        fs="ext4",
        disk_mib=int(snap.meta["disk_mib"]),
        source_id=str(snap.meta.get("source_id", "")),
        created_at=float(snap.meta.get("created_at", 0.0)),
        size_bytes=snap.size_bytes,
    )


def _seal_hibernation(partial: Path, final: Path, meta: dict[str, Any]) -> None:
    """The kept files' sizes into ``meta``, everything synced, then ``partial`` renamed to ``final``."""
    meta["files"] = {name: {"size": (partial / name).stat().st_size} for name in vmsaved.FILES}
    for name in vmsaved.FILES:
        vmsaved.fsync_path(partial / name)
    vmsaved.write_meta(partial, meta)
    os.rename(partial, final)
    vmsaved.fsync_path(final.parent)
    vmsaved.fsync_path(final.parent.parent)


def _mine(records: list[SandboxRecord]) -> list[SandboxRecord]:
    """This driver's records of VMs with a slot (a hibernated one has none: nothing of it runs)."""
    return [
        record for record in records if record.driver == QemuRuntime.name and "slot" in record.driver_state
    ]


def _new_mac() -> str:
    """A locally administered unicast MAC in QEMU's 52:54:00 range, random in its last three bytes."""
    return "52:54:00:" + secrets.token_bytes(3).hex(":")


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
