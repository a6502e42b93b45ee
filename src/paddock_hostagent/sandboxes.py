"""The sandboxes of this host: their records, lifecycle rules, activity, and what runs inside them.

Routes call one method each. Lifecycle operations on one sandbox are serialised by its lock; a
command or file transfer does not take the lock, but a pause or destroy ends every exchange still in
flight (an exec ends with ``{"error": "sandbox paused"}`` and exit code -1; the guest agent then kills
the command when it thaws).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.builds import BuildManager
from paddock_hostagent.capacity import MIB, DiskView, MemoryView, Promise, available_memory_mib
from paddock_hostagent.diskwatch import DiskWatch
from paddock_hostagent.drivers.base import (
    DISK_RESIZE,
    PRIVATE_NETWORKS,
    S3_DISKS,
    CapacityError,
    DriverError,
    NetworkHook,
    NotRunningError,
    RuntimeState,
    SandboxRecord,
    SandboxRuntime,
    SandboxSpec,
    Shape,
    TierUnsupportedError,
    UnsupportedError,
)
from paddock_hostagent.drivers.net.bridges import BridgeNetworks, Membership
from paddock_hostagent.drivers.net.egress_rules import EgressPolicy, EgressRuleError, Usage
from paddock_hostagent.drivers.runtime.oci import OciRuntime
from paddock_hostagent.drivers.runtime.ocispec import DEFAULT_PATH
from paddock_hostagent.drivers.storage.s3mounts import S3Mount, S3Mounter
from paddock_hostagent.egress import Attachment, EgressService
from paddock_hostagent.execution import DESTROYED_MESSAGE, PAUSED_MESSAGE, ExecStream
from paddock_hostagent.guest import (
    ExecRequest,
    GuestBadPathError,
    GuestError,
    GuestFileNotFoundError,
    GuestIsDirectoryError,
    GuestParentNotFoundError,
)
from paddock_hostagent.guest.client import GuestBusyError, GuestNoSpaceError
from paddock_hostagent.guest.protocol import GuestTooOldError, GuestUserError
from paddock_hostagent.host import ISOLATION
from paddock_hostagent.images import ImageError, ImageStore, UnknownImageError
from paddock_hostagent.records import RecordStore
from paddock_hostagent.schemas import (
    BandwidthResult,
    CreateSandboxBody,
    CreateSandboxResult,
    DiskMountBody,
    DiskMountView,
    ExecBody,
    ForkBody,
    HostInfo,
    NetworkAttachBody,
    NetworkAttachment,
    SandboxView,
)
from paddock_hostagent.settings import HostAgentSettings

log = get_logger(__name__)
#: How long after a pause or resume its record is saved; several in a row are saved once.
SAVE_DELAY_S = 0.02

#: How often the agent checks that every mounted disk's s3fs still serves it.
DISK_CHECK_INTERVAL_S = 10.0

#: How long a destroy of an id this host does not hold refuses a create of that id arriving later (a
#: destroy that overtook its create: they come on different connections). As long as a client waits
#: for a create (client.py's ``_CREATE_TIMEOUT``), so no create the destroy answered for can still come.
DESTROYED_UNSEEN_S = 900.0


@dataclass
class _Entry:
    record: SandboxRecord
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    streams: set[ExecStream] = field(default_factory=set)
    active: int = 0  # commands and transfers in flight
    # What the sandbox used at the last read (refresh_usage, before every heartbeat). Admission counts
    # these instead of reading every sandbox's cgroup and disk image on each create, which cost ~0.1 ms
    # a sandbox: 100 ms a create beside 1,000 of them.
    mem_used_bytes: int = 0
    disk_used_bytes: int = 0
    # Its processes are gone (its init died: on gVisor a memory overrun kills the whole sandbox), seen by
    # a probe; for good, as no sandbox is started again. It then holds no memory: admission and the
    # free memory reported to the scheduler stop counting its limit (its disk stays until destroyed).
    stopped: bool = False

    def touch(self) -> None:
        self.record.last_activity_at = time.time()


def _pause_satisfies_self_request(record: SandboxRecord) -> None:
    """A paused sandbox's own request to pause is done (else a resume would be followed by a pause)."""
    if record.self_request and record.self_request["action"] == "pause":
        record.self_request = None


def machine_memory_mib() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


class SandboxManager:
    def __init__(
        self,
        settings: HostAgentSettings,
        runtime: SandboxRuntime,
        images: ImageStore,
        records: RecordStore,
        bridges: BridgeNetworks | None = None,
        egress: EgressService | None = None,
        disks: S3Mounter | None = None,
        retired: Mapping[str, SandboxRuntime] | None = None,
    ) -> None:
        self.settings = settings
        # The other drivers, by name: what a record of one of them (made before the host switched tier)
        # is stopped and destroyed with. Such a sandbox is held apart in ``_stopped`` with its reason.
        self.retired = dict(retired or {})
        self._stopped: dict[str, tuple[_Entry, str]] = {}
        self.disks = disks
        self.bridges = bridges
        self.egress = egress
        self._usage: dict[str, Usage] = {}  # the last counters read for the heartbeat
        self.runtime = runtime
        self.images = images
        self.records = records
        self.runtime_label = runtime.name
        self.total_mib = settings.total_mib or max(machine_memory_mib() - settings.reserved_mib, 0)
        self._entries: dict[str, _Entry] = {}
        self._pending: dict[str, tuple[int, int]] = {}  # ids being created -> (mem_mib, disk_mib)
        self._born: dict[str, asyncio.Event] = {}  # ids being created -> set when the attempt ends
        # Ids destroyed while this host held no such sandbox nor a create of it -> when (monotonic),
        # oldest first: a create or fork of one within DESTROYED_UNSEEN_S is refused (``_reserve``).
        self._destroyed_unseen: dict[str, float] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._unsaved: set[str] = set()  # records that pause/resume changed, saved by _save_unsaved
        self._save_timer: asyncio.TimerHandle | None = None
        self.builds: BuildManager | None = None  # template builds; set by the app when buildah is there
        # The disk store's watermarks: holds the sandboxes filling a host that runs low (diskwatch.py).
        self.diskwatch = DiskWatch(
            runtime,
            lambda: [entry.record for entry in list(self._entries.values())],
            store_dir=settings.state_dir / "disks",
            holds_path=settings.state_dir / "disk-holds.json",
            low_mib=settings.disk_low_watermark_mib,
            high_mib=settings.disk_high_watermark_mib,
            interval_s=settings.disk_watch_interval_s,
        )

    # -- start-up and shutdown ------------------------------------------------------------------

    async def start(self) -> None:
        records = self.records.load_all()
        # All sandboxes together stay within the budget whatever the overcommit (capacity.py).
        self.runtime.cap_memory(self.total_mib)
        await self._stop_other_tiers(records)
        states = await self.runtime.start(records)  # all: a driver keeps the others' addresses
        records = [record for record in records if record.id not in self._stopped]
        for record in records:
            entry = _Entry(record)
            self._entries[record.id] = entry
            state = states.get(record.id, RuntimeState.STOPPED)
            entry.stopped = state == RuntimeState.STOPPED
            on_hold = record.state == RuntimeState.RUNNING and record.id in self.diskwatch.held
            if state == RuntimeState.PAUSED and on_hold:  # frozen by the disk's watermark, not its user
                state = RuntimeState.RUNNING
            if state != RuntimeState.STOPPED:
                # The runtime's probe is the truth (the freezer, the VM's marker): a pause or resume
                # answered just before a crash may not have reached the record (``_save_soon``).
                record.state = state
            if state == RuntimeState.PAUSED:
                _pause_satisfies_self_request(record)
            if state == RuntimeState.RUNNING and not on_hold:  # a held sandbox's guest is frozen
                with contextlib.suppress(GuestError, TimeoutError):
                    guest_info = await asyncio.wait_for(self.runtime.guest(record).info(), 1.0)
                    record.last_activity_at = max(record.last_activity_at, guest_info.last_activity_at)
            log.info("sandbox_adopted", sandbox_id=record.id, state=state.value)
            if state != RuntimeState.STOPPED:
                await self._restore_networks(record)
                await self._restore_disks(record)
        if self.bridges is not None:
            held = records + [entry.record for entry, _ in self._stopped.values()]
            keep = {str(m["bridge"]) for record in held for m in record.networks}
            for bridge in await asyncio.to_thread(self.bridges.prune, keep):
                log.info("removed_orphan_bridge", bridge=bridge)
        if self.egress is not None:
            await self.egress.start([a for a in map(self._attachment, records) if a is not None])
        if self.disks is not None:
            await self.disks.prune({record.id for record in records} | set(self._stopped))
        await self.drop_deleted_images()  # those whose last sandbox went while the agent was down
        self._watcher = asyncio.create_task(self._watch_guests(), name="guest-watcher")
        self.diskwatch.start()

    async def _stop_other_tiers(self, records: list[SandboxRecord]) -> None:
        """Sandboxes recorded by another driver than this agent's (the host was restarted on another
        tier: a VM among containers, or the reverse) cannot be served: each is stopped by its own
        driver and held, reported ``error`` with the reason, until it is destroyed. Whatever goes
        wrong with one, the agent starts."""
        here = f"the {ISOLATION.get(self.runtime_label, self.runtime_label)} tier ({self.runtime_label})"
        others = [record for record in records if record.driver != self.runtime.name]
        for driver_name in sorted({record.driver for record in others}):
            driver = self.retired.get(driver_name)
            theirs = [record for record in others if record.driver == driver_name]
            try:
                if driver is None:
                    raise DriverError(f"this agent has no {driver_name} driver")
                await driver.retire(theirs)
                outcome = "stopped"
            except Exception as exc:  # the agent starts whatever one old sandbox does
                log.error("retiring_sandboxes_failed", driver=driver_name, error=repr(exc))
                outcome = f"could not be stopped ({exc})"
            for record in theirs:
                runtime = str(record.driver_state.get("runtime") or record.driver)
                tier = f"the {ISOLATION.get(runtime, runtime)} tier ({runtime})"
                reason = (
                    f"sandbox ran on {tier}; its host now runs {here}, so it {outcome}: destroy it, or"
                    f" restart the host on {tier} to keep its disk"
                )
                record.state = RuntimeState.STOPPED
                self._stopped[record.id] = (_Entry(record), reason)
                log.warning("sandbox_of_another_tier", sandbox_id=record.id, tier=runtime, outcome=outcome)

    async def close(self) -> None:
        if self._save_timer is not None:
            self._save_timer.cancel()  # every record is saved just below
        await self.diskwatch.close()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for entry in self._entries.values():
            with contextlib.suppress(OSError):
                self.records.save(entry.record)
        if self.builds is not None:  # before the network and egress they borrow go
            await self.builds.close()
        await self.runtime.close()
        for driver in self.retired.values():  # what they opened to stop or destroy (the disk store)
            await driver.close()
        if self.egress is not None:
            await self.egress.close()

    # -- queries --------------------------------------------------------------------------------

    def status(self, entry: _Entry) -> str:
        live = self.runtime.probe(entry.record)
        if live == RuntimeState.STOPPED:
            entry.stopped = True
            return RuntimeState.STOPPED.value
        return entry.record.state.value

    def view(self, entry: _Entry) -> SandboxView:
        record = entry.record
        return _view_of(
            record,
            status=self.status(entry),
            last_activity_at=time.time() if entry.active else record.last_activity_at,
            oom_kills=self.runtime.oom_kills(record),
            self_request=record.self_request,
        )

    def _stopped_view(self, entry: _Entry, reason: str) -> SandboxView:
        """A sandbox of another tier's driver, stopped at start (``_stop_other_tiers``)."""
        record = entry.record
        return _view_of(
            record,
            status="error",
            status_reason=reason,
            last_activity_at=record.last_activity_at,
            oom_kills=0,
        )

    def get(self, sandbox_id: str) -> SandboxView:
        stopped = self._stopped.get(sandbox_id)
        if stopped is not None:
            return self._stopped_view(*stopped)
        return self.view(self._entry(sandbox_id))

    def uses_image(self, image: str) -> bool:
        """Whether a sandbox here boots from ``image`` (its overlay's lower layer must stay)."""
        held = [*self._entries.values(), *(entry for entry, _ in self._stopped.values())]
        return any(entry.record.image == image for entry in held)

    async def drop_deleted_images(self) -> None:
        """Removes the images of deleted templates no sandbox here boots from any more, those marked
        before a restart too (``ImageStore.mark_deleted``), on a host with or without builds."""
        for name in self.images.deleted_templates(self.settings.id):
            if not self.uses_image(name):
                await asyncio.to_thread(self.images.remove_template, name)
                log.info("template_image_removed", template_id=name)

    def views(self) -> list[SandboxView]:
        views = [self.view(entry) for entry in list(self._entries.values())]
        return views + [self._stopped_view(*stopped) for stopped in list(self._stopped.values())]

    @property
    def schedulable_mib(self) -> int:
        """The memory this host offers for placement: its budget times the overcommit ratio."""
        return int(self.total_mib * self.settings.memory_overcommit)

    def placed_mib(self) -> int:
        placed = sum(entry.record.mem_mib for entry in self._entries.values() if not entry.stopped)
        return placed + sum(mem_mib for mem_mib, _ in self._pending.values())

    def memory_view(self) -> MemoryView:
        """Every memory limit promised on this host (pending creates as wholly unused) with what each
        sandbox used at the last read, and the machine's memory now; ``capacity.py`` decides from it."""
        promises = [
            Promise(entry.record.mem_mib, entry.mem_used_bytes)
            for entry in list(self._entries.values())
            if not entry.stopped
        ]
        promises += [Promise(mem_mib, 0) for mem_mib, _ in self._pending.values()]
        return MemoryView(
            self.total_mib,
            self.settings.reserved_mib,
            available_memory_mib(),
            promises,
            self.settings.memory_overcommit,
        )

    def disk_view(self) -> DiskView | None:
        room = self.diskwatch.measure()
        if room is None:
            return None
        promises = [
            Promise(entry.record.disk_mib, entry.disk_used_bytes) for entry in list(self._entries.values())
        ]
        promises += [Promise(disk_mib, 0) for _, disk_mib in self._pending.values()]
        return DiskView(
            room.free_mib,
            self.settings.disk_reserved_mib,
            promises,
            self.settings.disk_overcommit,
            held=len(self.diskwatch.held),
            release_mib=self.settings.disk_high_watermark_mib,
        )

    def info(self) -> HostInfo:
        return HostInfo(
            id=self.settings.id,
            # The promise accounting, exact and stable for the scheduler; what the machine has right now
            # is checked at admission (a stale placement gets a 507 that says why).
            free_mib=max(self.schedulable_mib - self.placed_mib(), 0),
            total_mib=self.schedulable_mib,
            vm_count=len(self._entries),
            rootfses=self.images.cached(),
            buildable=self.images.offered(),
            labels=self.settings.labels,
            runtime=self.runtime_label,
            warm_slots=self.runtime.warm_slots(),
            parked_slots=self.runtime.parked_slots(),
            disk_held=sorted(self.diskwatch.held),
        )

    def _entry(self, sandbox_id: str) -> _Entry:
        entry = self._entries.get(sandbox_id)
        if entry is None:
            stopped = self._stopped.get(sandbox_id)
            if stopped is not None:
                raise errors.InvalidState(f"sandbox {sandbox_id} cannot run here: {stopped[1]}")
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found on this host")
        return entry

    def _running_entry(self, sandbox_id: str) -> _Entry:
        entry = self._entry(sandbox_id)
        status = self.status(entry)
        if status != RuntimeState.RUNNING.value:
            raise errors.InvalidState(f"sandbox {sandbox_id} is {status}, not running")
        return entry

    # -- create and fork ------------------------------------------------------------------------

    def _reserve(self, sandbox_id: str, mem_mib: int, disk_mib: int) -> None:
        """Admits a new sandbox (``capacity.py``) and holds its memory and disk until it exists or fails;
        no ``await`` between the check and the hold, so parallel creates cannot both pass. An id a
        destroy has already answered for is refused as gone: that destroy overtook this create."""
        if sandbox_id in self._entries or sandbox_id in self._pending:
            raise errors.AlreadyExists(f"sandbox {sandbox_id} already exists on this host")
        self._forget_destroyed_unseen()
        if sandbox_id in self._destroyed_unseen:
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} was destroyed before its create arrived")
        self.memory_view().admit(mem_mib)
        disk = self.disk_view()
        if disk is not None:
            disk.admit(disk_mib)
        self._pending[sandbox_id] = (mem_mib, disk_mib)
        self._born[sandbox_id] = asyncio.Event()

    def _forget_destroyed_unseen(self) -> None:
        expired = time.monotonic() - DESTROYED_UNSEEN_S
        while self._destroyed_unseen:
            oldest, at = next(iter(self._destroyed_unseen.items()))
            if at > expired:
                break
            del self._destroyed_unseen[oldest]

    def _release(self, sandbox_id: str) -> None:
        self._pending.pop(sandbox_id, None)
        born = self._born.pop(sandbox_id, None)
        if born is not None:
            born.set()

    async def _rootfs(self, image: str) -> Path:
        try:
            return await self.images.ensure(image)
        except UnknownImageError as exc:
            raise errors.UnknownImage(str(exc)) from exc
        except ImageError as exc:
            raise errors.SandboxFailed(f"building image {image} failed: {exc}") from exc

    async def create(self, body: CreateSandboxBody) -> CreateSandboxResult:
        _check_rules(body.egress)
        if body.networks:  # refused before anything is made (a VM would boot for nothing)
            with _driver_errors():
                self.runtime.refuse(PRIVATE_NETWORKS)
        bound: list[S3Mount] = []  # disks bound at the start (gVisor), whatever their outcome
        at_start = self._disks_at_start(body, bound)
        self._reserve(body.id, body.mem_mib, body.disk_mib)
        try:
            rootfs = await self._rootfs(body.rootfs)
            shape = Shape(body.vcpu, body.mem_mib, body.disk_mib, body.cpu_quota_pct)
            spec = SandboxSpec(body.id, body.name, body.rootfs, rootfs, shape)
            started = time.monotonic()
            try:
                record = await self._booted(
                    body.id,
                    self.runtime.create(
                        spec,
                        start_paused=body.start_paused,
                        on_network=self._guarding(body.egress, body.bandwidth_quota_bytes),
                        **at_start,
                    ),
                )
            except BaseException:
                if bound and self.disks is not None:
                    await self.disks.release(body.id, bound)
                raise
            record.disks = [mount.to_json() for mount in bound]
            await self._join_at_boot(record, body.networks)
            record.spawn_ms = round((time.monotonic() - started) * 1000, 3)
            self.records.save(record)
            self._entries[record.id] = _Entry(record)
        finally:
            self._release(body.id)
        if body.disks and not at_start:  # tiers that mount into a running sandbox: as attaches do
            for disk in body.disks:
                await self.attach_disk(record.id, disk)
        log.info("sandbox_created", sandbox_id=record.id, spawn_ms=record.spawn_ms, image=record.image)
        return CreateSandboxResult(
            id=record.id, ip=record.ip, spawn_ms=record.spawn_ms, status=record.state.value
        )

    def _disks_at_start(self, body: CreateSandboxBody, bound: list[S3Mount]) -> dict[str, Any]:
        """The runtime's ``before_start`` for a create's S3 disks where the tier binds them only at the
        sandbox's start (gVisor: drivers/runtime/oci.py), filling ``bound``; no arguments elsewhere (they are
        attached once it runs). A tier that mounts none refuses the create before anything is made."""
        if not body.disks:
            return {}
        if len({disk.mount_path for disk in body.disks}) != len(body.disks):
            raise errors.BadRequest("disks: each mount_path may appear once")
        mounter = self._require_disks()
        with _driver_errors():
            self.runtime.refuse(S3_DISKS)  # the VM tier: 409 naming it
        if not (isinstance(self.runtime, OciRuntime) and self.runtime.options.runtime == "runsc"):
            return {}

        async def mount_one(record: SandboxRecord, disk: DiskMountBody) -> tuple[S3Mount, Path | None]:
            mount = S3Mount(
                disk_id=disk.disk_id,
                mount_path=disk.mount_path,
                sub_path=disk.sub_path,
                bucket=disk.bucket,
                endpoint=disk.endpoint,
                region=disk.region,
                use_path_style=disk.use_path_style,
            )
            point = await mounter.mount_at_boot(
                record.id,
                mount,
                access_key=disk.access_key,
                secret_key=disk.secret_key,
                netns=self.runtime.network_namespace(record),
            )
            return mount, point

        async def before_start(record: SandboxRecord) -> list[tuple[Path, str]]:
            outcomes = await asyncio.gather(*(mount_one(record, disk) for disk in body.disks))
            bound.extend(mount for mount, _ in outcomes)
            return [(point, mount.mount_path) for mount, point in outcomes if point is not None]

        return {"before_start": before_start}

    async def fork(self, sandbox_id: str, body: ForkBody) -> CreateSandboxResult:
        _check_rules(body.egress)
        source = self._entry(sandbox_id)
        self._reserve(body.new_id, source.record.mem_mib, source.record.disk_mib)
        try:
            async with source.lock:
                if self.status(source) == RuntimeState.STOPPED.value:
                    raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
                rootfs = await self._rootfs(source.record.image)
                spec = SandboxSpec(body.new_id, body.name, source.record.image, rootfs, source.record.shape)
                started = time.monotonic()
                record = await self._booted(
                    body.new_id,
                    self.runtime.fork(
                        source.record,
                        spec,
                        start_paused=body.start_paused,
                        on_network=self._guarding(body.egress, body.bandwidth_quota_bytes),
                    ),
                )
                await self._join_at_boot(record, body.networks)
                record.spawn_ms = round((time.monotonic() - started) * 1000, 3)
            self.records.save(record)
            self._entries[record.id] = _Entry(record)
        finally:
            self._release(body.new_id)
        log.info("sandbox_forked", sandbox_id=record.id, source_id=sandbox_id, spawn_ms=record.spawn_ms)
        return CreateSandboxResult(
            id=record.id, ip=record.ip, spawn_ms=record.spawn_ms, status=record.state.value
        )

    # -- pause, resume, resize, destroy ---------------------------------------------------------

    async def pause(self, sandbox_id: str) -> str:
        entry = self._entry(sandbox_id)
        async with entry.lock:
            self._running_entry(sandbox_id)
            with _driver_errors():
                await self.runtime.pause(entry.record)
            entry.record.state = RuntimeState.PAUSED
            _pause_satisfies_self_request(entry.record)
            self._save_soon(entry)
        await self._end_exchanges(entry, PAUSED_MESSAGE)
        return RuntimeState.PAUSED.value

    async def resume(self, sandbox_id: str) -> str:
        entry = self._entry(sandbox_id)
        async with entry.lock:
            status = self.status(entry)
            if status != RuntimeState.PAUSED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} is {status}, not paused")
            with _driver_errors():
                await self.runtime.resume(entry.record)
            entry.record.state = RuntimeState.RUNNING
            entry.touch()
            self._save_soon(entry)
        return RuntimeState.RUNNING.value

    def _save_soon(self, entry: _Entry) -> None:
        """Saves the record of a pause or resume shortly after the answer, not before it.

        Writing and renaming the record file was a third of the agent's cost of a pause or a resume.
        Nothing is lost when the agent dies before the save: the state is read back from the runtime
        (the freezer, the VM's marker) at start, and with it whether a self-pause request was met;
        the last activity may be older, which only brings an idle pause closer."""
        self._unsaved.add(entry.record.id)
        if self._save_timer is None:
            self._save_timer = asyncio.get_running_loop().call_later(SAVE_DELAY_S, self._save_unsaved)

    def _save_unsaved(self) -> None:
        # On the event loop, like every other save: a destroy deletes the file and the entry with no
        # await in between, so a record that is gone is never written back.
        self._save_timer = None
        busy: set[str] = set()
        for sandbox_id in self._unsaved:
            entry = self._entries.get(sandbox_id)
            if entry is None:
                continue
            if entry.lock.locked():  # mid-operation: its record is changing; try again later
                busy.add(sandbox_id)
                continue
            try:
                self.records.save(entry.record)
            except OSError as exc:
                log.error("sandbox_record_not_saved", sandbox_id=sandbox_id, error=str(exc))
        self._unsaved = busy
        if busy:
            self._save_timer = asyncio.get_running_loop().call_later(SAVE_DELAY_S, self._save_unsaved)

    async def resize(self, sandbox_id: str, disk_mib: int) -> int:
        entry = self._entry(sandbox_id)
        async with entry.lock:
            if disk_mib <= entry.record.disk_mib:
                raise errors.BadRequest(f"disk_mib must be larger than the current {entry.record.disk_mib}")
            if self.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            with _driver_errors():
                self.runtime.refuse(DISK_RESIZE, entry.record)
            disk = self.disk_view()
            if disk is not None:
                disk.admit(
                    disk_mib - entry.record.disk_mib,
                    disk_mib=disk_mib,
                    holds_mib=min(entry.disk_used_bytes // MIB, entry.record.disk_mib),
                )
            with _driver_errors():
                await self.runtime.resize(entry.record, disk_mib)
            entry.record.disk_mib = disk_mib
            self.records.save(entry.record)
        return disk_mib

    async def destroy(self, sandbox_id: str) -> None:
        """Destroys the sandbox; idempotent. A create of this id in flight is waited for, then undone; one
        that has not arrived yet (a destroy may overtake it: they come on different connections) is
        refused when it does (``_reserve``), so whatever the order, nothing of the id is left."""
        while (born := self._born.get(sandbox_id)) is not None:
            await born.wait()  # a destroy that overtakes its create waits for it, then undoes it
        if sandbox_id in self._stopped:
            await self._destroy_stopped(sandbox_id)
            return
        entry = self._entries.get(sandbox_id)
        if entry is None:  # already gone, or its create has not come (yet): it will be refused
            self._forget_destroyed_unseen()
            self._destroyed_unseen.pop(sandbox_id, None)  # re-inserted last: the dict stays oldest first
            self._destroyed_unseen[sandbox_id] = time.monotonic()
            return
        await self._end_exchanges(entry, DESTROYED_MESSAGE)
        async with entry.lock:
            if self._entries.get(sandbox_id) is not entry:
                return
            await self._leave_all_networks(entry.record)
            with _driver_errors():
                await self.runtime.destroy(entry.record)
            if self.egress is not None:
                with _driver_errors():
                    await self.egress.detach(sandbox_id, self.runtime.host_interface(entry.record))
            if self.disks is not None:  # after the sandbox: nothing in it holds the mounts any more
                await self.disks.release(sandbox_id, [S3Mount.from_json(d) for d in entry.record.disks])
            self._usage.pop(sandbox_id, None)
            self.records.delete(sandbox_id)
            del self._entries[sandbox_id]
        if self.builds is not None:  # a deleted template's image goes with its last sandbox
            await self.builds.collect()
        await self.drop_deleted_images()
        log.info("sandbox_destroyed", sandbox_id=sandbox_id)

    async def _destroy_stopped(self, sandbox_id: str) -> None:
        """Destroys a sandbox of another tier's driver with that driver."""
        entry, _ = self._stopped[sandbox_id]
        record = entry.record
        async with entry.lock:
            if sandbox_id not in self._stopped:
                return
            await self._leave_all_networks(record)
            driver = self.retired.get(record.driver)
            if driver is None:
                raise errors.SandboxFailed(
                    f"this agent has no {record.driver} driver to destroy {sandbox_id}"
                )
            with _driver_errors():
                await driver.destroy(record)
            if self.egress is not None:
                with _driver_errors():
                    await self.egress.detach(sandbox_id, driver.host_interface(record))
            if self.disks is not None:
                await self.disks.release(sandbox_id, [S3Mount.from_json(d) for d in record.disks])
            self.records.delete(sandbox_id)
            del self._stopped[sandbox_id]
        log.info("sandbox_destroyed", sandbox_id=sandbox_id, driver=record.driver)

    # -- private networks (drivers/net/bridges.py) --------------------------------------------------

    def _require_bridges(self) -> BridgeNetworks:
        if self.bridges is None:
            raise errors.BadRequest("private networks are not enabled on this host")
        return self.bridges

    async def attach_network(self, sandbox_id: str, body: NetworkAttachBody) -> NetworkAttachment:
        """Joins (or re-joins, idempotently) a running or paused sandbox to a network's bridge."""
        bridges = self._require_bridges()
        entry = self._entry(sandbox_id)
        async with entry.lock:
            if self.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            record = entry.record
            with _driver_errors():
                self.runtime.refuse(PRIVATE_NETWORKS, record)
            ip = str(body.ip)
            current = [Membership.from_json(m) for m in record.networks]
            existing = next((m for m in current if m.network_id == body.network_id), None)
            if existing is not None and (existing.ip, existing.prefixlen) == (ip, body.prefixlen):
                with _driver_errors():
                    await asyncio.to_thread(bridges.ensure, self.runtime.network_namespace(record), existing)
                return NetworkAttachment(**_public(existing.to_json()))
            if existing is not None:  # re-addressed: rebuild the port
                await asyncio.to_thread(bridges.detach, existing)
                current.remove(existing)
            with _driver_errors():
                member = await asyncio.to_thread(
                    bridges.attach,
                    self.runtime.network_namespace(record),
                    record.id,
                    body.network_id,
                    ip,
                    body.prefixlen,
                    {m.ifname for m in current},
                )
            record.networks = [m.to_json() for m in current] + [member.to_json()]
            self.records.save(record)
        log.info("network_attached", sandbox_id=sandbox_id, network_id=body.network_id, ifname=member.ifname)
        return NetworkAttachment(**_public(member.to_json()))

    async def _join_at_boot(self, record: SandboxRecord, memberships: list[NetworkAttachBody]) -> None:
        """Joins a new sandbox to the networks its create or fork named (one host call per boot); a
        sandbox that cannot join them all is undone, like one that cannot be guarded."""
        if not memberships:
            return
        joined: list[Membership] = []
        try:
            bridges = self._require_bridges()
            with _driver_errors():
                self.runtime.refuse(PRIVATE_NETWORKS, record)
                netns = self.runtime.network_namespace(record)
            for body in memberships:
                with _driver_errors():
                    member = await asyncio.to_thread(
                        bridges.attach,
                        netns,
                        record.id,
                        body.network_id,
                        str(body.ip),
                        body.prefixlen,
                        {m.ifname for m in joined},
                    )
                joined.append(member)
        except BaseException:
            for member in joined:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(bridges.detach, member)
            attachment = self._attachment(record)
            if self.egress is not None and attachment is not None:
                with contextlib.suppress(Exception):
                    await self.egress.detach(record.id, attachment.veth)
            with contextlib.suppress(Exception):
                await self.runtime.destroy(record)
            raise
        record.networks = [m.to_json() for m in joined]
        log.info("networks_joined", sandbox_id=record.id, networks=[m.network_id for m in joined])

    async def detach_network(self, sandbox_id: str, network_id: str) -> None:
        """Removes the sandbox's interface on the network; not a member is a no-op."""
        entry = self._entry(sandbox_id)
        async with entry.lock:
            record = entry.record
            members = [Membership.from_json(m) for m in record.networks]
            leaving = [m for m in members if m.network_id == network_id]
            if not leaving:
                return
            bridges = self._require_bridges()
            for member in leaving:
                await asyncio.to_thread(bridges.detach, member)
            record.networks = [m.to_json() for m in members if m.network_id != network_id]
            self.records.save(record)
        log.info("network_detached", sandbox_id=sandbox_id, network_id=network_id)

    async def _leave_all_networks(self, record: SandboxRecord) -> None:
        if self.bridges is None or not record.networks:
            return
        for data in record.networks:
            with contextlib.suppress(Exception):  # destroy must go on; prune() catches the rest
                await asyncio.to_thread(self.bridges.detach, Membership.from_json(data))

    async def _restore_networks(self, record: SandboxRecord) -> None:
        """After an agent restart: every recorded membership has its port on its bridge again."""
        if self.bridges is None or not record.networks:
            return
        netns = self.runtime.network_namespace(record)
        for data in record.networks:
            member = Membership.from_json(data)
            try:
                if await asyncio.to_thread(self.bridges.ensure, netns, member):
                    log.info("network_restored", sandbox_id=record.id, network_id=member.network_id)
            except DriverError as exc:
                log.warning("network_restore_failed", sandbox_id=record.id, error=str(exc))

    # -- S3 disks (drivers/storage/s3mounts.py) ---------------------------------------------------------

    def _require_disks(self) -> S3Mounter:
        if self.disks is None:
            raise errors.BadRequest("disks are not enabled on this host (s3fs or /dev/fuse missing)")
        return self.disks

    async def attach_disk(self, sandbox_id: str, body: DiskMountBody) -> DiskMountView:
        """Mounts an S3 disk into a running or paused sandbox and answers once it is ``mounted`` or
        ``error`` (bounded by the mounter's timeout). The same disk and path again is a no-op."""
        mounter = self._require_disks()
        entry = self._entry(sandbox_id)
        async with entry.lock:
            if self.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            record = entry.record
            current = [S3Mount.from_json(d) for d in record.disks]
            existing = next((m for m in current if m.mount_path == body.mount_path), None)
            if existing is not None:
                # A disk bound at the start (gVisor) answers with its outcome there, mounted or not.
                if existing.disk_id == body.disk_id and (existing.status == "mounted" or existing.at_boot):
                    return _disk_view(existing)
                raise errors.AlreadyExists(f"{body.mount_path} already holds disk {existing.disk_id}")
            with _driver_errors():
                self.runtime.refuse(S3_DISKS, record)
            mount = S3Mount(
                disk_id=body.disk_id,
                mount_path=body.mount_path,
                sub_path=body.sub_path,
                bucket=body.bucket,
                endpoint=body.endpoint,
                region=body.region,
                use_path_style=body.use_path_style,
            )
            with _driver_errors():
                pid = self.runtime.mount_namespace_pid(record)
                netns = self.runtime.network_namespace(record)  # where s3fs's connections leave from
            await mounter.mount(
                sandbox_id,
                mount,
                access_key=body.access_key,
                secret_key=body.secret_key,
                ns_pid=pid,
                netns=netns,
            )
            if mount.status == "mounted":  # a failed mount leaves nothing behind to record
                record.disks = [m.to_json() for m in current] + [mount.to_json()]
                self.records.save(record)
        return _disk_view(mount)

    async def detach_disk(self, sandbox_id: str, mount_path: str) -> None:
        """Unmounts the disk at ``mount_path``; nothing mounted there is a no-op."""
        entry = self._entry(sandbox_id)
        async with entry.lock:
            record = entry.record
            current = [S3Mount.from_json(d) for d in record.disks]
            leaving = [m for m in current if m.mount_path == mount_path]
            if not leaving:
                return
            mounter = self._require_disks()
            pid: int | None = None
            with contextlib.suppress(DriverError):
                pid = self.runtime.mount_namespace_pid(record)
            for mount in leaving:
                await mounter.unmount(sandbox_id, mount, ns_pid=pid)
            record.disks = [m.to_json() for m in current if m.mount_path != mount_path]
            self.records.save(record)
        log.info("disk_detached", sandbox_id=sandbox_id, mount_path=mount_path)

    async def _restore_disks(self, record: SandboxRecord) -> None:
        """After an agent restart: every recorded mount is live in its sandbox again."""
        if self.disks is None or not record.disks:
            return
        if any(S3Mount.from_json(data).at_boot for data in record.disks):  # gVisor: bound at its start
            checked = []
            for data in record.disks:
                mount = S3Mount.from_json(data)
                await self.disks.check_bound(record.id, mount)
                checked.append(mount.to_json())
            if checked != record.disks:
                record.disks = checked
                self.records.save(record)
            return
        try:
            pid = self.runtime.mount_namespace_pid(record)
            netns = self.runtime.network_namespace(record)
        except DriverError:
            return
        restored = []
        for data in record.disks:
            mount = S3Mount.from_json(data)
            await self.disks.restore(record.id, mount, ns_pid=pid, netns=netns)
            restored.append(mount.to_json())
        if restored != record.disks:
            record.disks = restored
            self.records.save(record)

    async def _end_exchanges(self, entry: _Entry, reason: str) -> None:
        for stream in list(entry.streams):
            await stream.abort(reason)

    # -- commands and files ---------------------------------------------------------------------

    async def open_exec(self, sandbox_id: str, body: ExecBody) -> ExecStream:
        """Starts a command; raises (404/409) before anything runs if the sandbox cannot take it."""
        entry = self._entry(sandbox_id)
        # The recorded state, not the runtime's probe (a /proc and a cgroup read per command): a
        # sandbox whose init has died refuses the guest's connection, and is probed then (below).
        if entry.record.state != RuntimeState.RUNNING:
            self._running_entry(sandbox_id)  # the 409, with the state the probe finds
        env = {"PATH": DEFAULT_PATH, "HOME": "/root", "HOSTNAME": entry.record.name, "LANG": "C.UTF-8"}
        # A template's ENV and WORKDIR apply to every command, under what the caller sets; its USER
        # runs the command through setpriv (util-linux, in every Debian image), as docker exec would.
        image = self.images.config(entry.record.image)
        env.update(image.env)
        env.update(body.env)
        cmd, args = body.cmd, body.args
        # An explicit user is the guest's to become (EXEC_AS); the template's USER only by default.
        if body.user is None and image.user and image.user not in ("root", "0", "0:0"):
            user, _, group = image.user.partition(":")
            cmd, args = (
                "setpriv",
                [f"--reuid={user}", f"--regid={group or user}", "--init-groups", cmd, *args],
            )
        request = ExecRequest(
            cmd=cmd,
            args=args,
            env=env,
            # As a user, without a directory: the template's WORKDIR, else the user's home (the guest's).
            cwd=body.cwd or image.workdir or ("" if body.user else self.settings.default_cwd),
            stdin=body.stdin.encode() if body.stdin is not None else None,
            user=body.user,
        )
        _check_no_nul([cmd, *args, *env, *env.values(), request.cwd, body.user or ""])
        session = self.runtime.guest(entry.record).exec(request)
        try:
            await session.__aenter__()
        except GuestBusyError as exc:
            raise errors.Busy(f"sandbox {sandbox_id} is busy: {exc}; retry") from exc
        except GuestUserError as exc:
            raise errors.UnknownUser(f"user: {exc}") from exc
        except GuestTooOldError as exc:
            raise errors.UnsupportedOnTier(f"user: {exc}") from exc
        except GuestError as exc:
            self._running_entry(sandbox_id)  # one that stopped is a 409, as above
            raise errors.SandboxFailed(f"guest agent of {sandbox_id} unreachable: {exc}") from exc
        entry.active += 1
        entry.touch()

        def finished(stream: ExecStream) -> None:
            entry.streams.discard(stream)
            entry.active -= 1
            entry.touch()

        stream = ExecStream(session, finished)
        entry.streams.add(stream)
        return stream

    async def write_file(self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes]) -> int:
        entry = self._running_entry(sandbox_id)
        _check_path(path)
        async with self._activity(entry), _guest_file_errors(sandbox_id):
            return await self.runtime.guest(entry.record).write_file(path, chunks)

    @contextlib.asynccontextmanager
    async def read_file(
        self, sandbox_id: str, path: str
    ) -> AsyncIterator[tuple[int | None, AsyncIterator[bytes]]]:
        """Yields (size or None, chunk iterator); errors are raised on entering."""
        entry = self._running_entry(sandbox_id)
        _check_path(path)
        async with self._activity(entry):
            download = self.runtime.guest(entry.record).read_file(path)
            async with _guest_file_errors(sandbox_id):
                await download.__aenter__()
            try:
                yield download.size, aiter(download)
            finally:
                await download.__aexit__(None, None, None)

    @contextlib.asynccontextmanager
    async def _activity(self, entry: _Entry) -> AsyncIterator[None]:
        entry.active += 1
        entry.touch()
        try:
            yield
        finally:
            entry.active -= 1
            entry.touch()

    def heartbeat_sandboxes(self) -> list[dict[str, Any]]:
        reports = []
        for view in self.views():
            report = {
                "id": view.id,
                "status": view.status,
                "oom_kills": view.oom_kills,
                "last_activity_at": view.last_activity_at,
            }
            if view.status_reason is not None:
                report["status_reason"] = view.status_reason
            if view.self_request is not None:
                report["self_request"] = view.self_request
            failed = {d.mount_path: d.error for d in view.disks if d.status == "error"}
            if failed:  # a mount this host could not restore: the control plane shows it as it is
                report["disk_errors"] = failed
            usage = self._usage.get(view.id)
            if usage is not None and view.id in self._entries:
                report["egress_bytes"] = usage.egress_bytes
                report["ingress_bytes"] = usage.ingress_bytes
                report["capped"] = usage.capped
                report["quota_bytes"] = self._entries[view.id].record.bandwidth_quota_bytes
                report["egress"] = list(self._entries[view.id].record.egress)
            reports.append(report)
        return reports

    # -- egress and bandwidth -------------------------------------------------------------------

    def _attachment(self, record: SandboxRecord) -> Attachment | None:
        veth = self.runtime.host_interface(record)
        if veth is None:
            return None
        return Attachment(record.id, veth, record.ip, list(record.egress), record.bandwidth_quota_bytes)

    def _guarding(self, rules: list[str], quota_bytes: int) -> NetworkHook:
        """The hook that installs a new sandbox's allowlist and budget, which the driver runs beside
        the boot (a sandbox that cannot be guarded is undone: the driver fails its boot); one that
        fails half-way removes what it installed."""

        async def guard(record: SandboxRecord) -> None:
            record.egress, record.bandwidth_quota_bytes = list(rules), quota_bytes
            attachment = self._attachment(record)
            if self.egress is None or attachment is None:
                return
            try:
                await self.egress.attach(attachment)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.egress.detach(record.id, attachment.veth)
                raise

        return guard

    async def _booted(self, sandbox_id: str, boot: Awaitable[SandboxRecord]) -> SandboxRecord:
        """The record of a create's or fork's boot; when the boot fails, the egress rules its hook
        installed go (the driver has removed the sandbox and let the hook end)."""
        try:
            with _driver_errors():
                return await boot
        except BaseException:
            if self.egress is not None:
                with contextlib.suppress(Exception):
                    await self.egress.detach(sandbox_id)
            raise

    async def _egress_entry(self, sandbox_id: str) -> tuple[_Entry, EgressService]:
        entry = self._entry(sandbox_id)
        attachment = self._attachment(entry.record)
        if self.egress is None or attachment is None:
            raise errors.BadRequest("this host does not manage egress")
        if self.status(entry) == RuntimeState.STOPPED.value:
            raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
        if not self.egress.guards(sandbox_id):  # never installed (an earlier attempt failed): do it now
            with _driver_errors():
                await self.egress.attach(attachment)
        return entry, self.egress

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> list[str]:
        """Replaces the allowlist of a running or paused sandbox at once (new connections follow it)."""
        _check_rules(rules)
        entry, egress = await self._egress_entry(sandbox_id)
        async with entry.lock:
            with _driver_errors():
                await egress.set_rules(sandbox_id, rules)
            entry.record.egress = list(rules)
            self.records.save(entry.record)
        return list(rules)

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> BandwidthResult:
        entry, egress = await self._egress_entry(sandbox_id)
        async with entry.lock:
            with _driver_errors():
                usage = await egress.set_quota(sandbox_id, quota_bytes)
            entry.record.bandwidth_quota_bytes = quota_bytes
            self.records.save(entry.record)
        return _bandwidth(sandbox_id, quota_bytes, usage)

    async def bandwidth(self, sandbox_id: str) -> BandwidthResult:
        entry, egress = await self._egress_entry(sandbox_id)
        with _driver_errors():
            usage = await egress.usage(sandbox_id)
        return _bandwidth(sandbox_id, entry.record.bandwidth_quota_bytes, usage)

    async def refresh_usage(self) -> None:
        """Reads every sandbox's counters (two nft calls) for the next heartbeat, and what each uses of
        its memory and disk for admission (off the loop: a file read or two per sandbox)."""
        if self.egress is not None:
            self._usage = await self.egress.snapshot()
        await asyncio.to_thread(self._read_resource_use)

    def _read_resource_use(self) -> None:
        for entry in list(self._entries.values()):
            entry.mem_used_bytes = self.runtime.memory_usage_bytes(entry.record)
            entry.disk_used_bytes = self.runtime.disk_usage_bytes(entry.record)

    # -- self-signals ---------------------------------------------------------------------------

    async def poll_self_signals(self) -> None:
        """Asks every running sandbox's guest agent for a new self-signal (spec 12.4) and keeps it as
        the sandbox's pending ``self_request`` until a pause or destroy satisfies it."""
        for entry in list(self._entries.values()):
            if entry.record.state != RuntimeState.RUNNING or entry.lock.locked():
                continue
            if entry.record.id in self.diskwatch.held:  # frozen: it would only time out
                continue
            try:
                async with asyncio.timeout(0.5):
                    info = await self.runtime.guest(entry.record).info()
            except (GuestError, TimeoutError):
                continue
            record = entry.record
            if info.self_seq > record.self_seq_seen and info.self_action is not None:
                record.self_seq_seen = info.self_seq
                record.self_request = {
                    "action": info.self_action,
                    "reason": info.self_reason,
                    "seq": info.self_seq,
                }
                self.records.save(record)
                log.info("sandbox_self_signal", sandbox_id=record.id, action=info.self_action)

    async def _watch_guests(self) -> None:
        """Polls the guests for self-signals every ``guest_poll_interval_s``, or, when a pass over every
        sandbox takes longer than that (hundreds of sandboxes on a busy host), after a pause as long as
        the pass: the watcher then takes at most half of the agent's event loop, and heartbeats, execs
        and lifecycle calls keep the other half (at 639 idle sandboxes on the loaded 2-core dev box a
        back-to-back watcher delayed heartbeats until the control plane declared the host dead)."""
        disks_checked = time.monotonic()
        pass_s = 0.0
        while True:
            await asyncio.sleep(max(self.settings.guest_poll_interval_s, pass_s))
            started = time.monotonic()
            try:
                await self.poll_self_signals()
            except Exception as exc:  # the watcher must outlive any one bad sandbox
                log.warning("self_signal_poll_failed", error=repr(exc))
            pass_s = time.monotonic() - started
            if time.monotonic() - disks_checked >= DISK_CHECK_INTERVAL_S:
                disks_checked = time.monotonic()
                try:
                    await self.check_disks()
                except Exception as exc:  # likewise for any one bad mount
                    log.warning("disk_check_failed", error=repr(exc))

    async def check_disks(self) -> None:
        """A mount whose s3fs died (crashed, killed, out of memory) is mounted again, as after an agent
        restart; sandboxes busy with a lifecycle operation are checked next time."""
        for entry in list(self._entries.values()):
            if not entry.record.disks or entry.lock.locked():
                continue
            async with entry.lock:
                if self._entries.get(entry.record.id) is entry and self.status(entry) != "stopped":
                    await self._restore_disks(entry.record)


def _view_of(
    record: SandboxRecord,
    *,
    status: str,
    last_activity_at: float,
    oom_kills: int,
    status_reason: str | None = None,
    self_request: dict[str, Any] | None = None,
) -> SandboxView:
    """The view of ``record``: what it holds, with what its state now says (``view``, ``_stopped_view``)."""
    return SandboxView(
        id=record.id,
        name=record.name,
        rootfs=record.image,
        status=status,  # type: ignore[arg-type]
        status_reason=status_reason,
        ip=record.ip,
        vcpu=record.vcpu,
        mem_mib=record.mem_mib,
        cpu_quota_pct=record.cpu_quota_pct,
        disk_mib=record.disk_mib,
        created_at=record.created_at,
        last_activity_at=last_activity_at,
        oom_kills=oom_kills,
        forked_from=record.forked_from,
        self_request=self_request,
        networks=[NetworkAttachment(**_public(m)) for m in record.networks],
        disks=[_disk_view(S3Mount.from_json(d)) for d in record.disks],
    )


def _disk_view(mount: S3Mount) -> DiskMountView:
    return DiskMountView(
        disk_id=mount.disk_id,
        mount_path=mount.mount_path,
        sub_path=mount.sub_path,
        status=mount.status,  # type: ignore[arg-type]
        error=mount.error,
    )


def _public(member: dict[str, Any]) -> dict[str, Any]:
    return {key: member[key] for key in ("network_id", "ip", "prefixlen", "ifname")}


def _check_rules(rules: list[str]) -> None:
    try:
        EgressPolicy.parse(rules)
    except EgressRuleError as exc:
        raise errors.BadRequest(str(exc)) from exc


def _bandwidth(sandbox_id: str, quota_bytes: int, usage: Usage) -> BandwidthResult:
    return BandwidthResult(
        id=sandbox_id,
        quota_bytes=quota_bytes,
        egress_bytes=usage.egress_bytes,
        ingress_bytes=usage.ingress_bytes,
        capped=usage.capped and quota_bytes >= 0,
    )


def _check_path(path: str) -> None:
    if not path or not path.startswith("/") or "\0" in path or len(path) >= os.pathconf("/", "PC_PATH_MAX"):
        raise errors.BadPath(f"path must be absolute and without NUL: {path!r}")


def _check_no_nul(values: list[str]) -> None:
    if any("\0" in value for value in values):
        raise errors.BadRequest("cmd, args, env and cwd may not contain NUL characters")


@contextlib.contextmanager
def _driver_errors() -> Any:
    try:
        yield
    except CapacityError as exc:
        raise errors.InsufficientCapacity(str(exc)) from exc
    except NotRunningError as exc:
        raise errors.InvalidState(str(exc)) from exc
    except TierUnsupportedError as exc:
        raise errors.UnsupportedOnTier(str(exc)) from exc
    except UnsupportedError as exc:
        raise errors.BadRequest(str(exc)) from exc
    except DriverError as exc:
        raise errors.SandboxFailed(str(exc)) from exc


@contextlib.asynccontextmanager
async def _guest_file_errors(sandbox_id: str) -> AsyncIterator[None]:
    try:
        yield
    except GuestFileNotFoundError as exc:
        raise errors.FileNotFound(str(exc)) from exc
    except GuestParentNotFoundError as exc:
        raise errors.ParentNotFound(str(exc)) from exc
    except GuestIsDirectoryError as exc:
        raise errors.IsDirectory(str(exc)) from exc
    except GuestBadPathError as exc:
        raise errors.BadPath(str(exc)) from exc
    except GuestNoSpaceError as exc:
        raise errors.SandboxDiskFull(
            f"the disk of sandbox {sandbox_id} is full; nothing was written ({exc})"
        ) from exc
    except GuestBusyError as exc:
        raise errors.Busy(f"sandbox {sandbox_id} is busy: {exc}; retry") from exc
    except GuestError as exc:
        raise errors.SandboxFailed(f"file transfer with {sandbox_id} failed: {exc}") from exc
