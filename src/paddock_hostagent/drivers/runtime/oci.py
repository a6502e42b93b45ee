"""The OCI driver: sandboxes as crun, runc or runsc (gVisor) containers on an overlay of the image and a
loop disk.

Create: take a warm slot (disk + netns), write /etc identity files into the upper layer, mount the
overlay, write ``config.json``, bind the guest agent's socket and start the runtime with that socket as
fd 3; return once the guest agent answers. A create of the pool image that finds a sandbox parked in a
warm slot (``drivers/runtime/pool.py``; crun and runc) *claims* it instead: it writes the sandbox's memory and
CPU limits into the parked cgroup, its identity files through the mounted overlay and its hostname
into the running UTS namespace (``drivers/runtime/hostname.py``), and is done in about a millisecond of the
agent's time. A claimed sandbox keeps the slot's container id and cgroup path (``_Handle``).

Pause and resume freeze the cgroup v1 freezer directly (well under a millisecond). Fork freezes the
source in its cgroup, syncs its filesystem and clones its disk image onto the loop device of a warm
slot (``rootdisks.clone_disk``), then boots a new container from the clone: **files carry over,
processes do not** (CRIU does not work on this kernel); a paused source stays paused. Each fork logs
``fork_phases``, the milliseconds of each step.

Destroy kills the container's init (its pid namespace dies with it), deletes the runtime state,
unmounts, detaches the loop device and removes the netns, veth, cgroups and files; the host agent's
destroy keeps a pristine netns and veth for the next slot (``destroy_keeping_network``, ``pool.py``).
Every step tolerates having been done before, so destroy is idempotent and also cleans up
half-created sandboxes.

gVisor (``runsc``) runs the same bundle with its own user-space kernel (docs/isolation.md): the sandbox
joins its prepared netns with ``--network=host`` (gVisor's netstack cannot run from the root netns in
the Debian build), so the veth, nft rules, counters and ingress are the same; the guest agent binds its
socket itself on a directory bound from the host (``--host-uds=create`` lets the sandbox create a
host unix socket), since runsc passes no extra fds. The cgroup (freezer, memory, cpu, pids, blkio)
holds the sentry and gofer, so pause/resume and limits are the same code. A fork first asks the guest
to ``sync`` so that the sentry's cached writes reach the disk before it is copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import (
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
    Shape,
    SnapshotInfo,
    TierUnsupportedError,
    UnsupportedError,
)
from paddock_hostagent.drivers.net.network import NetworkManager, netns_sysctl
from paddock_hostagent.drivers.runtime.bootlog import BootLog
from paddock_hostagent.drivers.runtime.cgroups import CgroupLayout, SandboxCgroup, pids_budget
from paddock_hostagent.drivers.runtime.hostname import set_hostname
from paddock_hostagent.drivers.runtime.ocispec import (
    GUEST_SOCKET_NAME,
    BundleSpec,
    IoLimits,
    cpu_quota_us,
    runtime_config,
    write_identity_files,
)
from paddock_hostagent.drivers.runtime.pool import Parked, Slot, SlotFactory, SlotPool
from paddock_hostagent.drivers.storage import mounts, rootdisks
from paddock_hostagent.drivers.system import host_processes
from paddock_hostagent.guest import ExecRequest, GuestClient, GuestError, GuestVersionError

log = get_logger(__name__)


@dataclass(frozen=True)
class OciOptions:
    state_dir: Path
    runtime: str  # "crun", "runc" or "runsc"
    guest_binary: Path
    network: NetworkManager
    filesystem: rootdisks.Filesystem
    pool_size: int = 2
    pool_disk_mib: int = 10240
    boot_timeout_s: float = 10.0
    runtime_root: Path = Path("/run/paddock")
    # Tasks one sandbox may hold, and all sandboxes together (0: the kernel's limit less a quarter).
    sandbox_pids_max: int = 4096
    pids_budget: int = 0
    io: IoLimits = field(default_factory=IoLimits)
    # gVisor's platform ("ptrace" or "kvm", host.choose_runsc_platform); only read for runsc.
    runsc_platform: str = "ptrace"
    # The root filesystem of the image the warm pool parks sandboxes of, when it is on this host now;
    # None (or no callable) parks nothing. Only crun and runc park.
    pool_rootfs: Callable[[], Path | None] | None = None


PARKING_RUNTIMES = ("crun", "runc")
#: In a snapshot being written: the id of its source, frozen for the copy by this agent.
THAW_MARKER = "thaw-source"
HIBERNATE = "hibernating a sandbox"
#: Hibernated sandboxes' disks, ``<store>/snapshots/snap_hibernated/<sandbox id>/disk.img``: in the
#: snapshots' directory so that the disk store stays mounted while one is kept (``rootdisks.close_store``
#: keeps it for ``snapshots/snap_*``); it has no ``meta.json`` of its own, so it never boots as a
#: snapshot. One being written is ``.partial-<sandbox id>`` beside them.
HIBERNATED_DIR = "snap_hibernated"
#: A hibernated sandbox's ``driver_state``: ``{"hibernated": {image, fs, disk_mib, hibernated_at}}``,
#: and while the stopped container is still being taken down, ``"teardown"``: its former driver_state.
HIBERNATION = "hibernated"
TEARDOWN = "teardown"


def hibernation_of(record: SandboxRecord) -> dict[str, Any] | None:
    """The hibernation a record describes (its disk kept, nothing running), or None."""
    value = record.driver_state.get(HIBERNATION)
    return value if isinstance(value, dict) else None


# A parked sandbox's limits until a create claims it (its guest agent uses ~1 MiB).
PARKED_SHAPE_MEM_MIB = 256


GVISOR_SOCKET_DIR = "guest"  # under the slot's directory, bound at ocispec.GUEST_SOCKET_DIR
GVISOR_TMP_DIR = "tmp"  # on the sandbox's disk beside the overlay's layers, bound at /tmp under runsc
RUNSC_SYNC_TIMEOUT_S = 10.0
RUNSC_TCP_WMEM = {"ipv4/tcp_wmem": f"4096 {16 << 20} {32 << 20}"}


def gvisor_tmp_dir(slot: Slot) -> Path:
    """A gVisor sandbox's /tmp: a directory on its own disk (so a fork's copy and a restart keep it,
    as the overlay's /tmp on the container tier), outside the overlay's layers, made by the agent. It
    is the root of a bind mount inside, which the sandbox cannot replace with a symlink, so the runtime
    (root on the host) follows no path the sandbox wrote."""
    return slot.disk.mount_dir / GVISOR_TMP_DIR


def bind_unix(listener: socket.socket, path: Path) -> None:
    """Binds a unix socket at ``path`` through a descriptor of its directory (``/proc/self/fd/N/name``):
    a socket's address holds at most 107 bytes, and a deep ``PADDOCK_HOST_STATE_DIR`` makes the slot's
    path longer than that (the connect side goes through a descriptor too: ``guest.client``). The
    directory is the host's own (the slot's), never a tenant's."""
    dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        listener.bind(f"/proc/self/fd/{dir_fd}/{path.name}")
    finally:
        os.close(dir_fd)


def guest_socket_path(slot: Slot, runtime: str) -> Path:
    """Where the host reaches a sandbox's guest agent: a socket the agent made for crun/runc (handed
    over as fd 3), one the guest binds in a directory shared with the host for runsc."""
    if runtime == "runsc":
        return slot.dir / GVISOR_SOCKET_DIR / GUEST_SOCKET_NAME
    return slot.socket_path


@dataclass
class _Handle:
    """The OCI part of a record's ``driver_state``. The runtime knows the container as
    ``container_id``: the sandbox's id, or the slot's for a sandbox claimed from the pool."""

    slot: Slot
    runtime: str
    cgroups_path: str
    container_id: str
    init_pid: int = 0
    init_ticks: int = 0
    #: Host directories bound at the start (gVisor's S3 disks and volumes): a woken one would lack them.
    start_binds: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "slot": self.slot.to_json(),
            "runtime": self.runtime,
            "cgroups_path": self.cgroups_path,
            "container_id": self.container_id,
            "init_pid": self.init_pid,
            "init_ticks": self.init_ticks,
            "start_binds": self.start_binds,
        }

    @classmethod
    def of_parked(cls, slot: Slot, runtime: str, parked: Parked) -> _Handle:
        """The handle of the sandbox parked in ``slot`` (its container and cgroup are the slot's)."""
        return cls(
            slot, runtime, parked.cgroups_path, parked.container_id, parked.init_pid, parked.init_ticks
        )

    @classmethod
    def of(cls, record: SandboxRecord) -> _Handle:
        """Parses ``driver_state`` once per dict object (hot paths call this on every request)."""
        cached = _PARSED.get(record.id)
        if cached is not None and cached[0] is record.driver_state:
            return cached[1]
        data = record.driver_state
        handle = cls(
            Slot.from_json(data["slot"]),
            data["runtime"],
            data["cgroups_path"],
            data.get("container_id") or record.id,  # records of older agents: the sandbox's id
            data["init_pid"],
            data["init_ticks"],
            int(data.get("start_binds", 0)),
        )
        _PARSED[record.id] = (data, handle)
        return handle


_PARSED: dict[str, tuple[dict[str, object], _Handle]] = {}


class _Phases:
    """Milliseconds spent in each step of a boot, for the log line that tells where a fork's time goes."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[f"{name}_ms"] = round((now - self._last) * 1000, 2)
        self._last = now


class OciRuntime(SandboxRuntime):
    name = "oci"

    def __init__(self, options: OciOptions) -> None:
        self.options = options
        tag = hashlib.sha256(str(options.state_dir.resolve()).encode()).hexdigest()[:8]
        self.layout_tag = tag
        self.layout = CgroupLayout.discover(tag=tag)
        self._booting = 0  # creates and forks in flight: their runtime may be creating cgroup parents
        self.pids_budget = pids_budget(options.pids_budget)
        self.sandbox_pids_max = min(options.sandbox_pids_max, self.pids_budget)
        self.memory_cap_mib = 0  # all sandboxes together (cap_memory); 0: none
        factory = SlotFactory(
            options.state_dir / "slots", options.network, options.filesystem, options.guest_binary
        )
        self.pool = SlotPool(
            factory,
            options.pool_size,
            options.pool_disk_mib,
            runtime=self,
            busy=lambda: self._booting > 0,
            parks=options.runtime in PARKING_RUNTIMES and options.pool_rootfs is not None,
            pool_rootfs=options.pool_rootfs,
        )
        self._binaries = {name: shutil.which(name) or name for name in ("crun", "runc", "runsc")}

    # -- lifecycle of the driver ----------------------------------------------------------------

    async def start(self, records: list[SandboxRecord]) -> dict[str, RuntimeState]:
        """Adopts the records' sandboxes; hibernated ones are not sandboxes here (nothing of them runs,
        ``settle_hibernations`` has taken care of them)."""
        mine = [record for record in records if record.driver == self.name and hibernation_of(record) is None]
        self._thaw_what_a_killed_agent_froze(mine)
        states = {record.id: self.probe(record) for record in mine}
        owned = await self._reclaim(mine)
        # Sandboxes of another driver (a host switched from the VM tier) keep their addresses until
        # they are destroyed: a new sandbox must not take one.
        addresses = self.options.network.addresses.owners()
        owned |= {
            addresses[record.ip]
            for record in records
            if record.driver != self.name and record.ip in addresses
        }
        self.options.network.addresses.retain_owners(owned)
        self.pool.start()
        return states

    async def retire(self, records: list[SandboxRecord]) -> None:
        mine = [record for record in records if record.driver == self.name]
        for record in mine:
            await self._stop_container(_Handle.of(record))
        await self._reclaim(mine)

    def _thaw_what_a_killed_agent_froze(self, mine: list[SandboxRecord]) -> None:
        """A snapshot an earlier agent died writing may have left its source frozen for the copy: that
        source runs again (the half-made snapshot itself is removed when the store opens). Every disk
        is thawed too: an agent killed in a fork's or a snapshot's quiesce left its filesystem frozen."""
        for adopted in mine:
            mounts.thaw_if_frozen(_Handle.of(adopted).slot.disk.mount_dir)
        running = {record.id: record for record in mine if record.state == RuntimeState.RUNNING}
        for marker in self.snapshots_dir.glob(f"{rootdisks.PARTIAL_SNAPSHOT_PREFIX}*/{THAW_MARKER}"):
            with contextlib.suppress(OSError):
                record = running.get(marker.read_text().strip())
                if record is not None:
                    SandboxCgroup(_Handle.of(record).cgroups_path).thaw()
                    log.warning("snapshot_source_thawed", sandbox_id=record.id)

    async def _reclaim(self, mine: list[SandboxRecord]) -> set[str]:
        """Removes the slots (warm, parked or half-made) and loop devices no record of ``mine`` owns;
        returns the ids of the slots that are owned."""
        owned = {_Handle.of(record).slot.id for record in mine}
        kept = {str(_Handle.of(record).slot.disk.image_path) for record in mine}
        await self.pool.reclaim(owned, kept)
        return owned

    async def close(self) -> None:
        await self.pool.close()
        if not self._booting:
            self.layout.prune(ancestors=True)

    # -- create, fork ---------------------------------------------------------------------------

    async def create(
        self,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
        before_start: BeforeStart | None = None,
    ) -> SandboxRecord:
        """``before_start`` (gVisor's S3 disks): called with the record once the slot's netns exists and
        before the container starts; the host directories it returns are bound into the container."""
        phases = _Phases()
        with self._in_flight():
            taken = await self.pool.take(spec.shape.disk_mib, spec.rootfs)
        phases.mark("slot")
        slot, parked, warm = taken.slot, taken.parked, taken.warm
        if parked is not None:
            handle = _Handle.of_parked(slot, self.options.runtime, parked)
        else:
            handle = _Handle(slot, self.options.runtime, self.layout.sandbox_path(spec.id), spec.id)
        record = self._record(spec, handle)
        beside = _Beside(on_network, record)
        beside.start()  # the slot's veth exists: its egress rules go in now
        # One turn of the loop: the hook's first step hands its nftables batch to a thread, which then
        # runs beside the claim (synchronous, on the loop) instead of after it (~1 ms at 1 live, 2-3
        # at 1,000).
        await asyncio.sleep(0)
        async with self._boot_attempt(handle, beside):
            if slot.disk_mib < spec.shape.disk_mib:
                await rootdisks.grow(slot.disk, spec.shape.disk_mib)
                slot.disk_mib = spec.shape.disk_mib
            if parked is not None and before_start is not None:  # runsc parks none (PARKING_RUNTIMES)
                raise BootError("disks bound at the start need a container not started yet")
            if parked is not None:
                self._claim(spec, handle)
                phases.mark("claim")
            else:
                binds: tuple[tuple[Path, str], ...] = ()
                if before_start is not None:
                    # s3fs connects from the sandbox's netns: only once its egress rules are in.
                    await beside.result()
                    binds = tuple(await before_start(record))
                    handle.start_binds = len(binds)
                    phases.mark("disks")
                await self._boot(spec, handle, phases=phases, disk_binds=binds)
            await self._started(record, handle, start_paused=start_paused)
            phases.mark("started")
            await beside.result()  # what the boot left of the egress rules' install (``_Beside``)
            phases.mark("network")
            log.info(
                "create_phases", sandbox_id=spec.id, warm_slot=warm, parked=parked is not None, **phases.ms
            )
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
        phases = _Phases()
        with self._in_flight():
            slot = await self.pool.take_for_fork()
        warm = bool(slot.disk.loop_device)  # a slot built on demand has no disk of its own
        phases.mark("slot")
        handle = _Handle(slot, self.options.runtime, self.layout.sandbox_path(spec.id), spec.id)
        record = self._record(spec, handle)
        record.forked_from = source.id
        beside = _Beside(on_network, record)
        async with self._boot_attempt(handle, beside):
            slot.disk_mib = source.disk_mib
            slot.disk.fs = source_handle.slot.disk.fs
            device = slot.disk.loop_device  # its numbers go into the bundle

            def meanwhile() -> None:
                # Started here, not before the source's freeze: the hook's own work on the event
                # loop would delay the freeze's polls.
                beside.start()
                if device:
                    self._write_bundle(spec, handle)

            await self._copy_disk(source_handle, slot, phases, meanwhile=meanwhile)
            beside.start()  # (a no-op once started)
            bundled = bool(device) and slot.disk.loop_device == device
            slot.save()
            await self._boot(spec, handle, phases=phases, bundled=bundled)
            await self._started(record, handle, start_paused=start_paused)
            await beside.result()
            log.info("fork_phases", sandbox_id=spec.id, warm_slot=warm, **phases.ms)
        return record

    # -- snapshots ------------------------------------------------------------------------------

    @property
    def snapshots_dir(self) -> Path:
        return rootdisks.snapshots_dir(self.pool.slots_dir)

    async def snapshot_store(self) -> Path:
        """Where snapshots fetched from another host go (``image_transfer.SnapshotFetcher``)."""
        await self.pool.factory.images_dir()
        return self.snapshots_dir

    async def snapshot(self, record: SandboxRecord, snapshot_id: str) -> SnapshotInfo:
        """Freezes the sandbox (unless paused), copies its disk as a fork does (``syncfs`` and a clone,
        ``rootdisks.snapshot_image``) into ``.partial-<id>`` under the store's ``snapshots``, lets it run
        again, writes the snapshot's description and renames the directory into place: a snapshot is
        there whole or not at all (an agent killed half-way leaves a partial one, removed when the next
        agent opens the store)."""
        handle = _Handle.of(record)
        if self.probe(record) == RuntimeState.STOPPED:
            raise NotRunningError(f"sandbox {record.id} is not running")
        await self.pool.factory.images_dir()  # the store is open (it is, once a sandbox has a disk)
        final = self.snapshots_dir / snapshot_id
        if final.exists():
            raise DriverError(f"snapshot {snapshot_id} exists")
        partial = self.snapshots_dir / f"{rootdisks.PARTIAL_SNAPSHOT_PREFIX}{snapshot_id}"
        partial.mkdir(parents=True, exist_ok=True)
        try:
            cgroup = SandboxCgroup(handle.cgroups_path)
            was_frozen = cgroup.is_frozen()
            if handle.runtime == "runsc" and not was_frozen:
                # gVisor's sentry caches file writes: written back before the copy, as a fork does. A
                # paused gVisor sandbox gives what a crash at its pause would have left on its disk.
                await _sync_guest(GuestClient(guest_socket_path(handle.slot, handle.runtime)))
            if not was_frozen:
                # An agent killed while the source is frozen for the copy: the next one thaws it (``start``).
                (partial / THAW_MARKER).write_text(record.id)
                await _freeze(cgroup)
            try:
                await asyncio.to_thread(rootdisks.snapshot_image, handle.slot.disk, partial / "disk.img")
            finally:
                if not was_frozen:
                    cgroup.thaw()
            info = SnapshotInfo(
                id=snapshot_id,
                path=final / "disk.img",
                image=record.image,
                fs=handle.slot.disk.fs,
                disk_mib=record.disk_mib,
                source_id=record.id,
                created_at=time.time(),
                size_bytes=os.stat(partial / "disk.img").st_blocks * 512,
            )
            await asyncio.to_thread(_write_snapshot_meta, partial, info)
            partial.replace(final)
            await asyncio.to_thread(_fsync_dir, self.snapshots_dir)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, partial, True)
            raise
        return info

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo | None:
        if not snapshot_id.startswith("snap_") or "/" in snapshot_id:
            return None
        directory = self.snapshots_dir / snapshot_id
        try:
            meta = json.loads((directory / "meta.json").read_text())
            size = os.stat(directory / "disk.img").st_blocks * 512
        except (OSError, ValueError):
            return None
        return SnapshotInfo(
            id=snapshot_id,
            path=directory / "disk.img",
            image=str(meta["image"]),
            fs=str(meta["fs"]),
            disk_mib=int(meta["disk_mib"]),
            source_id=str(meta.get("source_id", "")),
            created_at=float(meta.get("created_at", 0.0)),
            size_bytes=size,
        )

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        if not snapshot_id.startswith("snap_") or "/" in snapshot_id:
            return False
        directory = self.snapshots_dir / snapshot_id
        if not directory.is_dir():
            return False
        # Renamed away first: a delete cut short leaves a partial (removed at the next start), never
        # a snapshot without its disk. Sandboxes booted from it share blocks, which the store counts.
        doomed = self.snapshots_dir / f"{rootdisks.PARTIAL_SNAPSHOT_PREFIX}{snapshot_id}"
        directory.replace(doomed)
        await asyncio.to_thread(shutil.rmtree, doomed, True)
        return True

    async def create_from_snapshot(
        self,
        snapshot: SnapshotInfo,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        """A fork whose source is the snapshot's image: a warm slot's disk becomes a clone of it
        (``rootdisks.restore_disk``), then the container boots on it. Where a sandbox is parked on a
        clone of the snapshot (``SlotPool.take_snapshot``), it is claimed instead, as a create claims
        one of its image."""
        phases = _Phases()
        if self._is_snapshot(snapshot):
            with self._in_flight():
                taken = await self.pool.take_snapshot(
                    spec.rootfs, snapshot.path, _fs(snapshot.fs), spec.shape.disk_mib
                )
            if taken is not None and taken.parked is not None:
                phases.mark("slot")
                return await self._claim_snapshot(
                    snapshot, spec, taken.slot, taken.parked, phases, start_paused, on_network
                )
        with self._in_flight():
            slot = await self.pool.take_for_fork()
        phases.mark("slot")
        handle = _Handle(slot, self.options.runtime, self.layout.sandbox_path(spec.id), spec.id)
        record = self._record(spec, handle)
        beside = _Beside(on_network, record)
        beside.start()
        async with self._boot_attempt(handle, beside):
            slot.disk.fs = "xfs" if snapshot.fs == "xfs" else "ext4"
            await rootdisks.restore_disk(snapshot.path, slot.disk)
            slot.disk_mib = snapshot.disk_mib
            phases.mark("clone")
            if slot.disk_mib < spec.shape.disk_mib:
                await rootdisks.grow(slot.disk, spec.shape.disk_mib)
                slot.disk_mib = spec.shape.disk_mib
            slot.save()
            await self._boot(spec, handle, phases=phases)
            await self._started(record, handle, start_paused=start_paused)
            await beside.result()
            log.info(
                "snapshot_boot_phases", sandbox_id=spec.id, snapshot_id=snapshot.id, parked=False, **phases.ms
            )
        return record

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Counts a boot in flight (``_booting``, the pools' ``busy``): the pools' building and stopping
        holds off meanwhile. Taking a slot counts too, a grow on claim included: a create of a kind not
        parked yet wakes the per-image pools, whose build of one for it took the CPU from that very
        create (~10 ms of a new disk size's ~25)."""
        self._booting += 1
        try:
            yield
        finally:
            self._booting -= 1

    @contextlib.asynccontextmanager
    async def _boot_attempt(self, handle: _Handle, beside: _Beside) -> AsyncIterator[None]:
        """A boot in flight (``_in_flight``): one that fails has its network hook settled and its
        container, slot and cgroup torn down before the error goes on."""
        try:
            with self._in_flight():
                yield
        except BaseException:
            await beside.settle()
            await self._destroy_handle(handle)
            raise

    def _is_snapshot(self, snapshot: SnapshotInfo) -> bool:
        """A snapshot of this host's store (not a hibernated sandbox's kept disk, booted the same way)."""
        return "/" not in snapshot.id and snapshot.path == self.snapshots_dir / snapshot.id / "disk.img"

    def expect_snapshot_boots(self, snapshot: SnapshotInfo, rootfs: Path) -> None:
        """A snapshot just taken: a sandbox is parked on a clone of it ahead of the first boot
        (``SlotPool.expect_snapshot_boots``), where this runtime parks, on the disk the last create on
        this host asked for (the shapes' default, mostly), or the snapshot's if larger."""
        if self.options.runtime in PARKING_RUNTIMES and self._is_snapshot(snapshot):
            disk_mib = max(snapshot.disk_mib, self.pool.last_disk_mib)
            self.pool.expect_snapshot_boots(rootfs, snapshot.path, disk_mib, _fs(snapshot.fs))

    async def _claim_snapshot(
        self,
        snapshot: SnapshotInfo,
        spec: SandboxSpec,
        slot: Slot,
        parked: Parked,
        phases: _Phases,
        start_paused: bool,
        on_network: NetworkHook | None,
    ) -> SandboxRecord:
        """Makes the sandbox parked on a clone of ``snapshot`` this one (``_claim``: its limits, identity
        files and hostname), as a create claims a parked sandbox of its image."""
        handle = _Handle.of_parked(slot, self.options.runtime, parked)
        record = self._record(spec, handle)
        beside = _Beside(on_network, record)
        beside.start()
        async with self._boot_attempt(handle, beside):
            self._claim(spec, handle)
            phases.mark("claim")
            await self._started(record, handle, start_paused=start_paused)
            await beside.result()
            phases.mark("network")
            log.info(
                "snapshot_boot_phases", sandbox_id=spec.id, snapshot_id=snapshot.id, parked=True, **phases.ms
            )
        return record

    # -- hibernation ----------------------------------------------------------------------------

    @property
    def hibernated_dir(self) -> Path:
        return self.snapshots_dir / HIBERNATED_DIR

    def refuse_hibernation(self, record: SandboxRecord) -> None:
        """gVisor binds a sandbox's S3 disks and volumes at its start only (docs/isolation.md), so a woken
        one could not have them back: such a sandbox stays frozen-paused only."""
        handle = _Handle.of(record)
        if handle.runtime == "runsc" and (record.disks or handle.start_binds):
            raise TierUnsupportedError(
                "gvisor",
                f"{HIBERNATE} with S3 disks or volumes",
                "its disks and volumes are bound at its start only; pause keeps it",
            )

    async def hibernate(self, record: SandboxRecord) -> dict[str, Any]:
        """Copies a running or frozen sandbox's disk as a snapshot does (freeze, ``syncfs``, a clone) into
        ``.partial-<id>``, writes its description and renames it into place; answers the record's
        driver_state once hibernated. The sandbox is left frozen: saving that state is the commit
        (the caller's), then ``release_hibernated`` takes the container down. Until the commit the
        sandbox is as it was: ``abandon_hibernation`` (or the next agent's start) thaws it again."""
        handle = _Handle.of(record)
        self.refuse_hibernation(record)
        self._require_alive(record)
        await self.pool.factory.images_dir()  # the store is open (it is, once a sandbox has a disk)
        base = self.hibernated_dir
        final, partial = base / record.id, base / f"{rootdisks.PARTIAL_SNAPSHOT_PREFIX}{record.id}"
        for stale in (final, partial):  # of an earlier attempt the agent died in, never committed
            await asyncio.to_thread(shutil.rmtree, stale, True)
        partial.mkdir(parents=True)
        cgroup = SandboxCgroup(handle.cgroups_path)
        was_frozen = cgroup.is_frozen()
        try:
            if handle.runtime == "runsc" and not was_frozen:
                # gVisor's sentry caches file writes: written back first, as for a snapshot or a fork.
                await _sync_guest(GuestClient(guest_socket_path(handle.slot, handle.runtime)))
            if not was_frozen:
                # Killed from here to the commit, the next agent thaws it (``settle_hibernations``).
                (partial / THAW_MARKER).write_text(record.id)
                await _freeze(cgroup)
            await asyncio.to_thread(rootdisks.snapshot_image, handle.slot.disk, partial / "disk.img")
            meta: dict[str, Any] = {
                "image": record.image,
                "fs": handle.slot.disk.fs,
                "disk_mib": record.disk_mib,
                "hibernated_at": time.time(),
                "was_frozen": was_frozen,
            }
            await asyncio.to_thread(_write_json_synced, partial / "meta.json", meta)
            partial.replace(final)
            for directory in (base, base.parent, base.parent.parent):  # made on the first hibernation
                await asyncio.to_thread(_fsync_dir, directory)
        except BaseException:
            if not was_frozen:
                cgroup.thaw()
            await asyncio.to_thread(shutil.rmtree, partial, True)
            raise
        return {HIBERNATION: meta, TEARDOWN: record.driver_state}

    def abandon_hibernation(self, record: SandboxRecord) -> None:
        """A hibernation whose commit failed: the copy goes and the sandbox runs as it did."""
        final = self.hibernated_dir / record.id
        if (final / THAW_MARKER).exists():
            SandboxCgroup(_Handle.of(record).cgroups_path).thaw()
        shutil.rmtree(final, ignore_errors=True)

    async def release_hibernated(self, sandbox_id: str, teardown: dict[str, Any]) -> None:
        """Takes down what ran of a hibernated sandbox (``teardown``: its former driver_state): its
        container, its cgroup, and its slot with the disk image, loop device, netns and address."""
        await self._destroy_handle(_handle_of_state(teardown, sandbox_id))
        _PARSED.pop(sandbox_id, None)

    def hibernated_disk(self, sandbox_id: str) -> Path:
        return self.hibernated_dir / sandbox_id / "disk.img"

    async def wake(
        self,
        record: SandboxRecord,
        spec: SandboxSpec,
        *,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        """Boots a hibernated sandbox again from its kept disk, as a sandbox boots from a snapshot (a
        warm slot's disk becomes a clone of it): a new container, netns and address."""
        meta = hibernation_of(record)
        if meta is None:
            raise DriverError(f"sandbox {record.id} is not hibernated")
        await self.pool.factory.images_dir()
        image = self.hibernated_disk(record.id)
        if not image.exists():
            raise DriverError(f"the kept disk of sandbox {record.id} is missing on this host")
        info = SnapshotInfo(
            id=f"{HIBERNATED_DIR}/{record.id}",
            path=image,
            image=str(meta["image"]),
            fs=str(meta["fs"]),
            disk_mib=int(meta["disk_mib"]),
            source_id=record.id,
            created_at=float(meta.get("hibernated_at", 0.0)),
            size_bytes=0,
        )
        return await self.create_from_snapshot(info, spec, on_network=on_network)

    async def forget_hibernation(self, sandbox_id: str) -> None:
        """The kept disk of a sandbox that woke (it runs on a clone) or was destroyed."""
        await asyncio.to_thread(shutil.rmtree, self.hibernated_dir / sandbox_id, True)
        with contextlib.suppress(OSError):  # the last one: the store may close (``close_store``)
            self.hibernated_dir.rmdir()

    async def settle_hibernations(self, records: list[SandboxRecord]) -> None:
        """At the agent's start, before adopting: a hibernation the previous agent died in is finished or
        undone. Committed (the record says hibernated): what still ran of it goes (its container
        in the teardown's slot, or one a wake had booted and not recorded). Not committed: the copy
        goes and a sandbox frozen for it runs again. Never a sandbox half-hibernated."""
        by_id = {record.id: record for record in records if record.driver == self.name}
        # The store is not opened here: opening it removes half-made snapshots, whose marks
        # ``_thaw_what_a_killed_agent_froze`` reads first. Not mounted (after a reboot), nothing of a hibernation
        # can be running; its leftovers go at the next start, or with the sandbox.
        base = self.hibernated_dir
        for record in by_id.values():
            meta = hibernation_of(record)
            if meta is None:
                continue
            teardown = record.driver_state.get(TEARDOWN)
            if isinstance(teardown, dict):
                with contextlib.suppress(Exception):
                    await self._stop_container(_handle_of_state(teardown, record.id))
            # A wake that booted a container and died before its record was saved: its slot, unowned,
            # is reclaimed by ``start``; its container (under the sandbox's own id) is stopped here.
            cgroups_path = self.layout.sandbox_path(record.id)
            if SandboxCgroup(cgroups_path).exists():
                with contextlib.suppress(Exception):
                    await self._stop(self.options.runtime, cgroups_path, record.id)
            record.driver_state = {HIBERNATION: meta}
        for directory in list(base.iterdir()) if base.is_dir() else []:
            sandbox_id = directory.name.removeprefix(rootdisks.PARTIAL_SNAPSHOT_PREFIX)
            owner = by_id.get(sandbox_id)
            if directory.name == sandbox_id and owner is not None and hibernation_of(owner) is not None:
                continue  # a whole hibernation, committed
            if owner is not None and (directory / THAW_MARKER).exists():
                with contextlib.suppress(OSError, KeyError):
                    SandboxCgroup(_Handle.of(owner).cgroups_path).thaw()
                    log.warning("hibernation_undone", sandbox_id=sandbox_id)
            await asyncio.to_thread(shutil.rmtree, directory, True)

    async def _copy_disk(
        self, source: _Handle, slot: Slot, phases: _Phases, *, meanwhile: Callable[[], None]
    ) -> None:
        """Freezes the source (unless paused), clones its disk onto the slot's and mounts the clone,
        letting the source run again as soon as the clone is made; ``meanwhile`` runs on the event
        loop while the disk work is in its thread (the fork writes its bundle there)."""
        cgroup = SandboxCgroup(source.cgroups_path)
        was_frozen = cgroup.is_frozen()
        if source.runtime == "runsc" and not was_frozen:
            await _sync_guest(GuestClient(guest_socket_path(source.slot, source.runtime)))
        if not was_frozen:
            await _freeze(cgroup)
        phases.mark("freeze")
        await rootdisks.clone_disk(
            source.slot.disk,
            slot.disk,
            release=(lambda: None) if was_frozen else cgroup.thaw,
            step=phases.mark,
            meanwhile=meanwhile,
        )

    async def _started(self, record: SandboxRecord, handle: _Handle, *, start_paused: bool) -> None:
        """Records the running container (its init) and freezes it if the caller asked to start paused."""
        record.driver_state = handle.to_json()
        if start_paused:
            await _freeze(SandboxCgroup(handle.cgroups_path))
            record.state = RuntimeState.PAUSED

    def _write_identity(self, spec: SandboxSpec, slot: Slot, etc_root: Path) -> None:
        """The sandbox's /etc/hostname, /etc/hosts and /etc/resolv.conf under ``etc_root``."""
        write_identity_files(
            etc_root, hostname=spec.name, ip=slot.network.ip, resolv_conf=self.options.network.resolv_conf()
        )

    def _record(self, spec: SandboxSpec, handle: _Handle) -> SandboxRecord:
        return SandboxRecord.running(
            spec, ip=handle.slot.network.ip, driver=self.name, driver_state=handle.to_json()
        )

    async def _boot(
        self,
        spec: SandboxSpec,
        handle: _Handle,
        *,
        phases: _Phases | None = None,
        bundled: bool = False,
        disk_binds: tuple[tuple[Path, str], ...] = (),
    ) -> None:
        """Mounts the overlay, writes the bundle (unless ``bundled``: a fork writes it while its disk
        mounts), starts the runtime and waits for the guest agent."""
        phases = phases or _Phases()
        slot = handle.slot
        self._write_identity(spec, slot, slot.disk.upper_dir)
        phases.mark("identity")
        mounts.mount_overlay(spec.rootfs, slot.disk.upper_dir, slot.disk.work_dir, slot.rootfs_dir)
        phases.mark("overlay")
        # A fork's disk already holds the binary; a disk from an older agent may hold another one.
        if not rootdisks.guest_is_current(slot.disk, self.options.guest_binary):
            await asyncio.to_thread(rootdisks.install_guest, slot.disk, self.options.guest_binary)
        if handle.runtime == "runsc":
            await asyncio.to_thread(_make_tmp_dir, gvisor_tmp_dir(slot))
        if not bundled:
            self._write_bundle(spec, handle, disk_binds)
        phases.mark("bundle")
        if handle.runtime == "runsc":
            # Debian's runsc (2022) hands a blocking write on a host socket EAGAIN once the host's send
            # buffer is full; a large default buffer keeps that out of reach of ordinary writes
            # (docs/isolation.md). The netns is the sandbox's own.
            await asyncio.to_thread(netns_sysctl, slot.network.netns_path, RUNSC_TCP_WMEM)
        boot_log = await self._run_container(handle)
        phases.mark("runtime")
        try:
            try:
                await GuestClient(guest_socket_path(slot, handle.runtime)).wait_ready(
                    self.options.boot_timeout_s
                )
                phases.mark("guest")
                boot_log.note(f"the guest agent answered; booted in {round(sum(phases.ms.values()))} ms")
            except GuestVersionError as exc:
                raise BootError(f"guest agent of {spec.id} refused: {exc}") from exc
            except GuestError as exc:
                raise BootError(f"guest agent of {spec.id} did not answer: {exc}{boot_log.suffix()}") from exc
        finally:
            boot_log.close()

    def _claim(self, spec: SandboxSpec, handle: _Handle) -> None:
        """Makes a parked sandbox this one: its limits, identity files and hostname."""
        if not host_processes.is_same_process(handle.init_pid, handle.init_ticks):
            raise BootError(f"the sandbox parked for {spec.id} has stopped")
        SandboxCgroup(handle.cgroups_path).set_limits(spec.shape.mem_mib << 20, cpu_quota_us(spec.shape))
        # Through the mounted overlay (the parked sandbox may have looked these files up already).
        self._write_identity(spec, handle.slot, handle.slot.rootfs_dir)
        set_hostname(handle.init_pid, spec.name)

    # -- parking (pool.py's ParkingRuntime: the pool decides what to park, where and when) ---------

    def cgroups_path(self, container_id: str) -> str:
        return self.layout.sandbox_path(container_id)

    async def boot_parked(self, slot: Slot, parked: Parked, rootfs: Path) -> None:
        handle = _Handle(slot, self.options.runtime, parked.cgroups_path, parked.container_id)
        spec = SandboxSpec(
            parked.container_id,
            parked.container_id,
            "",
            rootfs,
            Shape(1, PARKED_SHAPE_MEM_MIB, slot.disk_mib),
        )
        try:
            with self._in_flight():
                await self._boot(spec, handle)
        except BaseException:
            await self._stop_container(handle)
            raise
        parked.init_pid, parked.init_ticks = handle.init_pid, handle.init_ticks

    async def stop_parked(self, slot: Slot, parked: Parked) -> None:
        await self._stop_container(_Handle.of_parked(slot, self.options.runtime, parked))

    def _write_bundle(
        self, spec: SandboxSpec, handle: _Handle, disk_binds: tuple[tuple[Path, str], ...] = ()
    ) -> None:
        """The runtime's ``config.json`` (and the limits of the sandboxes' parent cgroups)."""
        slot = handle.slot
        self.layout.limit_pids(self.pids_budget)
        self.layout.limit_memory(self.memory_cap_mib << 20)
        bundle = BundleSpec(
            hostname=spec.name,
            shape=spec.shape,
            cgroups_path=handle.cgroups_path,
            netns_path=slot.network.netns_path,
            guest_binary=slot.disk.guest_binary,  # where install_guest puts it, or the source did
            guest_socket_dir=slot.dir / GVISOR_SOCKET_DIR if handle.runtime == "runsc" else None,
            tmp_dir=gvisor_tmp_dir(slot) if handle.runtime == "runsc" else None,
            disk_binds=disk_binds,
            pids_limit=self.sandbox_pids_max,
            disk_device=_device_numbers(slot.disk.loop_device),
            io=self.options.io,
        )
        (slot.bundle_dir / "config.json").write_text(json.dumps(runtime_config(bundle)))

    async def _run_container(self, handle: _Handle) -> BootLog:
        """Starts the container; returns the log of its boot, still reading, for the caller to close
        once the guest agent has answered.

        The runtime's stderr is a pipe, not a file: the container's init inherits the runtime's stdio,
        so whatever PID 1 holds as fd 2 a sandbox can reach as ``/proc/1/fd/2``. The agent keeps at most
        ``BootLog.limit_bytes`` of it (for boot errors) and closes its end after the boot; the guest
        agent moves its own stdio to /dev/null once it serves, so later writes go nowhere on the host.
        """
        slot = handle.slot
        gvisor = handle.runtime == "runsc"
        socket_path = guest_socket_path(slot, handle.runtime)
        socket_path.unlink(missing_ok=True)
        socket_path.parent.mkdir(mode=0o700, exist_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        boot_log = BootLog(slot.dir / "runtime.log")
        try:
            if not gvisor:  # runsc passes no extra fds: its guest binds the socket itself
                bind_unix(listener, socket_path)
                listener.listen(128)
            pid_file = slot.dir / "init.pid"
            pid_file.unlink(missing_ok=True)
            argv = [*self._runtime_argv(handle.runtime), "run"]
            if gvisor:
                argv += [
                    "--detach",
                    "--pid-file",
                    str(pid_file),
                    "--bundle",
                    str(slot.bundle_dir),
                    handle.container_id,
                ]
            else:
                argv += ["-d", "--pid-file", str(pid_file), "--preserve-fds", "1"]
                argv += ["-b", str(slot.bundle_dir), handle.container_id]
            boot_log.note(f"starting the sandbox with {handle.runtime}")
            pid = host_processes.spawn(argv, stderr_fd=boot_log.write_fd, pass_fd_as_3=listener.fileno())
            boot_log.start()
            try:
                code = await asyncio.wait_for(host_processes.wait_child(pid), self.options.boot_timeout_s)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise BootError(
                    f"{handle.runtime} did not start {handle.container_id} in {self.options.boot_timeout_s:.0f}s"
                    f"{boot_log.suffix()}"
                ) from None
            if code != 0:
                raise CommandFailedError(argv, code, boot_log.text()[-2000:])
            handle.init_pid = int(pid_file.read_text().strip())
            handle.init_ticks = host_processes.start_ticks(handle.init_pid) or 0
        except BaseException:
            boot_log.close()
            raise
        finally:
            listener.close()  # the container holds its own copy
        return boot_log

    def _runtime_argv(self, runtime: str) -> list[str]:
        argv = [self._binaries[runtime], "--root", str(self.options.runtime_root / runtime)]
        if runtime == "crun":
            argv.append("--cgroup-manager=cgroupfs")
        elif runtime == "runsc":
            # The sandbox's own netns (the spec's network namespace) with the host kernel's stack;
            # the guest agent's socket is a host unix socket the sandbox creates.
            argv += [f"--platform={self.options.runsc_platform}", "--network=host", "--host-uds=create"]
        return argv

    # -- pause, resume, resize ------------------------------------------------------------------

    async def pause(self, record: SandboxRecord) -> None:
        self._require_alive(record)
        await _freeze(SandboxCgroup(_Handle.of(record).cgroups_path))

    async def resume(self, record: SandboxRecord) -> None:
        self._require_alive(record)
        SandboxCgroup(_Handle.of(record).cgroups_path).thaw()

    async def resize(self, record: SandboxRecord, disk_mib: int) -> None:
        handle = _Handle.of(record)
        self._require_alive(record)
        await rootdisks.grow(handle.slot.disk, disk_mib)
        handle.slot.disk_mib = disk_mib
        handle.slot.save()
        record.driver_state = handle.to_json()

    def _require_alive(self, record: SandboxRecord) -> None:
        if self.probe(record) == RuntimeState.STOPPED:
            raise NotRunningError(f"sandbox {record.id} has stopped")

    # -- destroy --------------------------------------------------------------------------------

    async def destroy(self, record: SandboxRecord) -> None:
        await self._destroy_handle(_Handle.of(record))
        _PARSED.pop(record.id, None)

    async def _destroy_handle(self, handle: _Handle) -> None:
        await self._stop_container(handle)
        mounts.unmount(handle.slot.rootfs_dir)
        await self.pool.destroy(handle.slot)

    async def destroy_keeping_network(self, record: SandboxRecord) -> None:
        """A destroy whose slot's network may serve the next sandbox (``SlotPool.retire``): the
        container, its cgroup and the disk go now, the namespace, veth and address stay until
        ``recycle`` (once the caller has removed the sandbox's egress rules)."""
        handle = _Handle.of(record)
        await self._stop_container(handle)
        mounts.unmount(handle.slot.rootfs_dir)
        await self.pool.retire(handle.slot, record.id)
        _PARSED.pop(record.id, None)

    async def recycle(self, sandbox_id: str) -> None:
        """The network of a sandbox destroyed by ``destroy_keeping_network`` goes to the next slot
        built if it is pristine (``NetworkManager.pristine``), else it is destroyed."""
        await self.pool.recycle(sandbox_id)

    async def _stop_container(self, handle: _Handle) -> None:
        """Kills the container and removes its runtime state and cgroup; the slot stays."""
        await self._stop(
            handle.runtime, handle.cgroups_path, handle.container_id, handle.init_pid, handle.init_ticks
        )

    async def _stop(
        self, runtime: str, cgroups_path: str, container_id: str, init_pid: int = 0, init_ticks: int = 0
    ) -> None:
        cgroup = SandboxCgroup(cgroups_path)
        if host_processes.is_same_process(init_pid, init_ticks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(init_pid, signal.SIGKILL)
        cgroup.thaw()  # a frozen task cannot die
        if init_pid:
            await host_processes.wait_gone(init_pid, init_ticks, timeout_s=10)
        for pid in cgroup.pids():  # stragglers that escaped the pid namespace's teardown
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        force = "--force" if runtime == "runsc" else "-f"  # runsc's flags have no short forms
        await _run_quietly([*self._runtime_argv(runtime), "delete", force, container_id])
        with contextlib.suppress(OSError):
            cgroup.remove()
        if not self._booting:  # a runtime starting a sandbox may be creating these parents right now
            self.layout.prune()

    # -- observation ----------------------------------------------------------------------------

    def probe(self, record: SandboxRecord) -> RuntimeState:
        handle = _Handle.of(record)
        if not host_processes.is_same_process(handle.init_pid, handle.init_ticks):
            return RuntimeState.STOPPED
        if SandboxCgroup(handle.cgroups_path).is_frozen():
            return RuntimeState.PAUSED
        return RuntimeState.RUNNING

    def guest(self, record: SandboxRecord) -> GuestClient:
        handle = _Handle.of(record)
        return GuestClient(guest_socket_path(handle.slot, handle.runtime))

    def refuse(self, operation: str, record: SandboxRecord | None = None) -> None:
        runtime = _Handle.of(record).runtime if record is not None else self.options.runtime
        if runtime == "runsc" and operation == PRIVATE_NETWORKS:
            # The sentry reads the namespace's interfaces once, at its start: a later eth1 is unseen.
            raise TierUnsupportedError(
                "gvisor", operation, "gVisor's sentry (runsc 2022) does not see interfaces added once it runs"
            )
        if runtime == "runsc" and operation == S3_DISKS and record is not None:
            # A running sandbox's mounts live in its sentry; the host's are bound only at its start.
            raise TierUnsupportedError(
                "gvisor",
                f"{operation} into a running sandbox",
                "gVisor binds host directories only when the sandbox starts; name the disk in the create",
            )

    def log_path(self, record: SandboxRecord, source: str) -> Path:
        handle = _Handle.of(record)
        if source == "boot":
            return handle.slot.dir / "runtime.log"  # bootlog.py: the runtime's and init's stderr, bounded
        tier = "gvisor" if handle.runtime == "runsc" else "container"
        raise TierUnsupportedError(
            tier,
            "a guest console log",
            "a container has no kernel of its own; its boot log has its init's output",
        )

    def network_namespace(self, record: SandboxRecord) -> str:
        return _Handle.of(record).slot.network.netns

    def mount_namespace_pid(self, record: SandboxRecord) -> int:
        handle = _Handle.of(record)
        if handle.runtime == "runsc":
            # The sentry's mount namespace is not what the guest sees: its mounts live in gVisor.
            raise UnsupportedError("mounting into a running sandbox is not supported on gVisor")
        if not host_processes.is_same_process(handle.init_pid, handle.init_ticks):
            raise NotRunningError(f"sandbox {record.id} has stopped")
        return handle.init_pid

    def host_interface(self, record: SandboxRecord) -> str | None:
        return _Handle.of(record).slot.network.host_veth

    def warm_slots(self) -> int:
        return self.pool.free_count

    def parked_slots(self) -> int:
        return self.pool.parked_count

    def oom_kills(self, record: SandboxRecord) -> int:
        return SandboxCgroup(_Handle.of(record).cgroups_path).oom_kills()

    def memory_usage_bytes(self, record: SandboxRecord) -> int:
        return SandboxCgroup(_Handle.of(record).cgroups_path).memory_usage_bytes()

    def disk_usage_bytes(self, record: SandboxRecord) -> int:
        try:
            return os.stat(_Handle.of(record).slot.disk.image_path).st_blocks * 512
        except FileNotFoundError:
            return 0

    def resource_sample(self, record: SandboxRecord) -> ResourceSample | None:
        """CPU and memory from the sandbox's cgroup (under gVisor the group holds the sentry and the
        gofer, so what the host spends running the guest is what is counted); disk from ``statvfs`` of
        the host-made mount point of the sandbox's disk (its root, never a path the sandbox wrote)."""
        handle = _Handle.of(record)
        cgroup = SandboxCgroup(handle.cgroups_path)
        cpu_ns = cgroup.cpu_usage_ns()
        memory = cgroup.memory_in_use()
        if cpu_ns is None or memory is None:
            return None
        disk_used, disk_limit = mounts.filesystem_use(handle.slot.disk.mount_dir)
        if disk_limit == 0:  # not mounted: what the image holds on the host, of its full size
            disk_used, disk_limit = self.disk_usage_bytes(record), record.disk_mib << 20
        return ResourceSample(cpu_ns, memory[0], min(memory[1], record.mem_mib << 20), disk_used, disk_limit)

    def cap_memory(self, total_mib: int) -> None:
        self.memory_cap_mib = total_mib
        self.layout.limit_memory(total_mib << 20)

    def disk_free_bytes(self) -> int:
        stats = os.statvfs(self.pool.slots_dir if self.pool.slots_dir.exists() else self.options.state_dir)
        return stats.f_bavail * stats.f_frsize


RUNTIME_DELETE_TIMEOUT_S = 60.0


async def _run_quietly(argv: list[str]) -> int:
    """Runs a runtime command whose output nobody reads (``delete``) and returns its exit code.

    Started with ``posix_spawn`` (a vfork: the agent's memory is not copied) and waited for through
    a pidfd, where the event loop's subprocess machinery (uvloop's ``uv_spawn``) forks the whole
    agent, copying its page tables with the loop held: that fork was the largest part of a
    destroy's CPU."""
    devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    try:
        pid = os.posix_spawnp(
            argv[0], argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
        )
    finally:
        os.close(devnull)
    try:
        return await asyncio.wait_for(host_processes.wait_child(pid), RUNTIME_DELETE_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return -signal.SIGKILL


def _fs(name: str) -> rootdisks.Filesystem:
    return "xfs" if name == "xfs" else "ext4"


def _make_tmp_dir(path: Path) -> None:
    """``path`` as a directory with /tmp's mode (1777); a fork's copied disk already has it."""
    path.mkdir(exist_ok=True)
    os.chmod(path, 0o1777)


def _device_numbers(device: str) -> tuple[int, int] | None:
    """(major, minor) of a block device node, for the blkio throttle; None without one."""
    if not device:
        return None
    try:
        rdev = os.stat(device).st_rdev
    except FileNotFoundError:
        return None
    return os.major(rdev), os.minor(rdev)


async def _sync_guest(guest: GuestClient) -> None:
    """``sync`` inside a gVisor sandbox: the sentry writes back what it caches of the disk's files."""
    try:
        async with asyncio.timeout(RUNSC_SYNC_TIMEOUT_S), guest.exec(ExecRequest(cmd="/bin/sync")) as session:
            async for _ in session:
                pass
    except (GuestError, TimeoutError) as exc:
        raise DriverError(f"could not sync the source's files before the fork: {exc}") from exc


#: ``create``'s ``before_start``: the host directories to bind, as (source, path in the sandbox).
BeforeStart = Callable[[SandboxRecord], Awaitable[list[tuple[Path, str]]]]


class _Beside:
    """A create's or fork's ``NetworkHook``, running beside its boot from the moment the slot is taken
    (its egress rules no longer wait for the boot: ~3 ms of a create or fork)."""

    def __init__(self, hook: NetworkHook | None, record: SandboxRecord) -> None:
        self._hook, self._record = hook, record
        self._task: asyncio.Future[None] | None = None

    def start(self) -> None:
        """Starts the hook, once."""
        if self._hook is not None and self._task is None:
            self._task = asyncio.ensure_future(self._hook(self._record))

    async def result(self) -> None:
        """Waits for the hook; raises what it raised."""
        if self._task is not None:
            await self._task

    async def settle(self) -> None:
        """After a failed boot: lets the hook end (never cancelled: a rule it is installing would land
        after its caller removed them) and drops its outcome, the boot's error being the one raised."""
        if self._task is None:
            return
        await asyncio.wait([self._task])
        if not self._task.cancelled():
            self._task.exception()


async def _freeze(cgroup: SandboxCgroup) -> None:
    try:
        await cgroup.freeze()
    except TimeoutError as exc:
        raise DriverError(str(exc)) from exc


def _write_snapshot_meta(directory: Path, info: SnapshotInfo) -> None:
    meta = {
        "id": info.id,
        "image": info.image,
        "fs": info.fs,
        "disk_mib": info.disk_mib,
        "source_id": info.source_id,
        "created_at": info.created_at,
    }
    with open(directory / "meta.json", "w") as out:
        json.dump(meta, out)
        out.flush()
        os.fsync(out.fileno())
    _fsync_dir(directory)


def _write_json_synced(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as out:
        json.dump(data, out)
        out.flush()
        os.fsync(out.fileno())


def _handle_of_state(data: dict[str, Any], sandbox_id: str) -> _Handle:
    """The handle a (former) driver_state describes."""
    return _Handle(
        Slot.from_json(data["slot"]),
        data["runtime"],
        data["cgroups_path"],
        data.get("container_id") or sandbox_id,
        int(data.get("init_pid") or 0),
        int(data.get("init_ticks") or 0),
    )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
