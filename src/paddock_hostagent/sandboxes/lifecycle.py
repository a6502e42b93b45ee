"""The lifecycle of this host's sandboxes: create and fork (one path, which differs only in where the
root filesystem comes from), pause, resume, resize, destroy, and the sandboxes of another tier's
driver stopped at start.

Lifecycle operations on one sandbox are serialised by its lock. A create or fork is admitted first
(``Registry.reserve``: memory and disk held until it exists or fails); a destroy that overtakes its
create waits for it, then undoes it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.capacity import MIB
from paddock_hostagent.drivers.base import (
    DISK_RESIZE,
    PRIVATE_NETWORKS,
    DriverError,
    RuntimeState,
    SandboxRecord,
    SandboxRuntime,
    SandboxSpec,
    Shape,
    SnapshotInfo,
)
from paddock_hostagent.execution import DESTROYED_MESSAGE, PAUSED_MESSAGE
from paddock_hostagent.host import ISOLATION
from paddock_hostagent.images import ImageError, UnknownImageError
from paddock_hostagent.sandboxes.checks import check_rules, driver_errors
from paddock_hostagent.sandboxes.disks import BootDisks, Disks
from paddock_hostagent.sandboxes.hibernation import Hibernation
from paddock_hostagent.sandboxes.networks import Networks
from paddock_hostagent.sandboxes.registry import Entry, Registry, pause_satisfies_self_request
from paddock_hostagent.sandboxes.traffic import Traffic
from paddock_hostagent.sandboxes.volumes import Volumes
from paddock_hostagent.schemas import CreateSandboxBody, CreateSandboxResult, ForkBody, NetworkAttachBody

log = get_logger(__name__)

SNAPSHOT_PREFIX = "snap_"


@runtime_checkable
class ExpectsSnapshotBoots(Protocol):
    """A runtime that prepares boots from a snapshot once it is taken (the OCI driver parks a sandbox
    on a clone of it, ``OciRuntime.expect_snapshot_boots``)."""

    def expect_snapshot_boots(self, snapshot: SnapshotInfo, rootfs: Path) -> None: ...


@runtime_checkable
class RecyclesNetworks(Protocol):
    """A runtime whose destroyed sandboxes' networks can serve new ones (the OCI driver's pool): a
    destroy in two halves, the second once the sandbox's egress rules are gone."""

    async def destroy_keeping_network(self, record: SandboxRecord) -> None: ...

    async def recycle(self, sandbox_id: str) -> None: ...


@dataclass
class _NewSandbox:
    """What a create or a fork asks of the one path that brings a sandbox up. They differ only in where
    its root filesystem comes from: an image (``source`` None), or the disk of the running sandbox
    ``source``, which the fork holds locked from its check to its boot. ``shape`` is what is admitted."""

    id: str
    name: str
    image: str
    shape: Shape
    start_paused: bool
    egress: list[str]
    quota_bytes: int
    networks: list[NetworkAttachBody]
    source: Entry | None = None
    disks: BootDisks = field(default_factory=BootDisks)
    #: A create whose ``rootfs`` names a snapshot of this host: its disk is a clone of the snapshot's.
    snapshot: SnapshotInfo | None = None


class Lifecycle:
    def __init__(
        self,
        registry: Registry,
        traffic: Traffic,
        networks: Networks,
        disks: Disks,
        retired: Mapping[str, SandboxRuntime] | None = None,
        *,
        volumes: Volumes | None = None,
    ) -> None:
        self.registry = registry
        self.volumes = volumes
        self.traffic = traffic
        self.networks = networks
        self.disks = disks
        # The other drivers, by name: what a record of one of them (made before the host switched tier)
        # is stopped and destroyed with. Such a sandbox is held apart in ``registry.stopped``.
        self.retired = dict(retired or {})
        #: Pauses that free the host (docs/hibernation.md).
        self.hibernation = Hibernation(registry, traffic, networks, disks, volumes, self._rootfs)

    # -- create and fork ------------------------------------------------------------------------

    async def create(self, body: CreateSandboxBody) -> CreateSandboxResult:
        check_rules(body.egress)
        if body.networks:  # refused before anything is made (a VM would boot for nothing)
            with driver_errors():
                self.registry.runtime.refuse(PRIVATE_NETWORKS)
        snapshot = self._snapshot_of(body.rootfs)
        boot_disks = self.disks.at_boot(body)
        if self.volumes is not None:  # volumes attached before the create (gVisor): bound at its start
            self.volumes.at_start(body.id, boot_disks.runtime_args)
        try:
            record = await self._bring_up(
                _NewSandbox(
                    id=body.id,
                    name=body.name,
                    image=snapshot.image if snapshot is not None else body.rootfs,
                    shape=Shape(body.vcpu, body.mem_mib, body.disk_mib, body.cpu_quota_pct),
                    start_paused=body.start_paused,
                    egress=body.egress,
                    quota_bytes=body.bandwidth_quota_bytes,
                    networks=body.networks,
                    disks=boot_disks,
                    snapshot=snapshot,
                )
            )
        except BaseException:
            if self.volumes is not None:
                await self.volumes.abandon(body.id)
            raise
        if self.volumes is not None:
            await self.volumes.started(body.id)
        if body.disks and not boot_disks.runtime_args:  # tiers that mount into a running sandbox
            for disk in body.disks:
                await self.disks.attach(record.id, disk)
        log.info("sandbox_created", sandbox_id=record.id, spawn_ms=record.spawn_ms, image=record.image)
        return _result(record)

    async def fork(self, sandbox_id: str, body: ForkBody) -> CreateSandboxResult:
        check_rules(body.egress)
        source = self.registry.entry(sandbox_id)
        record = await self._bring_up(
            _NewSandbox(
                id=body.new_id,
                name=body.name,
                image=source.record.image,
                shape=source.record.shape,
                start_paused=body.start_paused,
                egress=body.egress,
                quota_bytes=body.bandwidth_quota_bytes,
                networks=body.networks,
                source=source,
            )
        )
        log.info("sandbox_forked", sandbox_id=record.id, source_id=sandbox_id, spawn_ms=record.spawn_ms)
        return _result(record)

    async def _bring_up(self, new: _NewSandbox) -> SandboxRecord:
        """Admits, boots (from the image, or from the source's disk), guards and joins a new sandbox,
        and records it; whatever fails undoes what was made, and the admission is let go."""
        registry = self.registry
        registry.reserve(new.id, new.shape.mem_mib, new.shape.disk_mib)
        try:
            async with new.source.lock if new.source is not None else contextlib.nullcontext():
                if new.source is not None and registry.status(new.source) == RuntimeState.STOPPED.value:
                    raise errors.InvalidState(f"sandbox {new.source.record.id} has stopped")
                rootfs = await self._rootfs(new.image)
                # A fork boots with its source's shape as it is once locked (a resize may just have ended).
                shape = new.source.record.shape if new.source is not None else new.shape
                spec = SandboxSpec(new.id, new.name, new.image, rootfs, shape)
                started = time.monotonic()
                try:
                    record = await self.traffic.booted(new.id, self._boot(spec, new))
                except BaseException:
                    await self.disks.release_boot(new.id, new.disks)
                    raise
                record.disks = [mount.to_json() for mount in new.disks.bound]
                await self.networks.join_at_boot(record, new.networks)
                record.spawn_ms = round((time.monotonic() - started) * 1000, 3)
            registry.records.save(record)
            registry.entries[record.id] = Entry(record)
        finally:
            registry.release(new.id)
        return record

    def _boot(self, spec: SandboxSpec, new: _NewSandbox) -> Awaitable[SandboxRecord]:
        runtime = self.registry.runtime
        on_network = self.traffic.guarding(new.egress, new.quota_bytes)
        if new.source is not None:
            return runtime.fork(new.source.record, spec, start_paused=new.start_paused, on_network=on_network)
        if new.snapshot is not None:
            return runtime.create_from_snapshot(
                new.snapshot, spec, start_paused=new.start_paused, on_network=on_network
            )
        return runtime.create(
            spec, start_paused=new.start_paused, on_network=on_network, **new.disks.runtime_args
        )

    async def _rootfs(self, image: str) -> Path:
        try:
            return await self.registry.images.ensure(image)
        except UnknownImageError as exc:
            raise errors.UnknownImage(str(exc)) from exc
        except ImageError as exc:
            raise errors.SandboxFailed(f"building image {image} failed: {exc}") from exc

    # -- snapshots ------------------------------------------------------------------------------

    def _snapshot_of(self, rootfs: str) -> SnapshotInfo | None:
        """The snapshot a create's ``rootfs`` names (``snap_…``), or None for an image."""
        if not rootfs.startswith(SNAPSHOT_PREFIX):
            return None
        snapshot = self.registry.runtime.snapshot_info(rootfs)
        if snapshot is None:
            raise errors.UnknownImage(f"no snapshot {rootfs} on this host")
        return snapshot

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotInfo:
        """Copies the sandbox's disk into a snapshot that outlives it; held under the sandbox's lock,
        as a fork holds its source."""
        registry = self.registry
        entry = registry.entry(sandbox_id)
        if self.registry.runtime.snapshot_info(snapshot_id) is not None:
            raise errors.AlreadyExists(f"snapshot {snapshot_id} exists")
        async with entry.lock:
            if registry.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            started = time.monotonic()
            with driver_errors():
                info = await registry.runtime.snapshot(entry.record, snapshot_id)
        log.info(
            "sandbox_snapshotted",
            sandbox_id=sandbox_id,
            snapshot_id=snapshot_id,
            snapshot_ms=round((time.monotonic() - started) * 1000, 3),
        )
        runtime = registry.runtime
        if isinstance(runtime, ExpectsSnapshotBoots):  # a sandbox parked on it before the first boot
            with contextlib.suppress(errors.UnknownImage, errors.SandboxFailed):
                runtime.expect_snapshot_boots(info, await self._rootfs(info.image))
        return info

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        info = self.registry.runtime.snapshot_info(snapshot_id)
        if info is None:
            raise errors.SnapshotNotFound(f"no snapshot {snapshot_id} on this host")
        return info

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        with driver_errors():
            return await self.registry.runtime.delete_snapshot(snapshot_id)

    # -- pause, resume, resize ------------------------------------------------------------------

    async def pause(self, sandbox_id: str) -> str:
        registry = self.registry
        entry = registry.entry(sandbox_id)
        async with entry.lock:
            registry.running_entry(sandbox_id)
            with driver_errors():
                await registry.runtime.pause(entry.record)
            entry.record.state = RuntimeState.PAUSED
            pause_satisfies_self_request(entry.record)
            registry.save_soon(entry)
        await entry.end_exchanges(PAUSED_MESSAGE)
        return RuntimeState.PAUSED.value

    async def resume(self, sandbox_id: str) -> str:
        registry = self.registry
        if sandbox_id in registry.hibernated:  # a resume of a hibernated sandbox wakes it
            return (await self.hibernation.wake(sandbox_id)).status
        entry = registry.entry(sandbox_id)
        async with entry.lock:
            status = registry.status(entry)
            if status != RuntimeState.PAUSED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} is {status}, not paused")
            with driver_errors():
                await registry.runtime.resume(entry.record)
            entry.record.state = RuntimeState.RUNNING
            entry.touch()
            registry.save_soon(entry)
        return RuntimeState.RUNNING.value

    async def resize(self, sandbox_id: str, disk_mib: int) -> int:
        registry = self.registry
        entry = registry.entry(sandbox_id)
        async with entry.lock:
            if disk_mib <= entry.record.disk_mib:
                raise errors.BadRequest(f"disk_mib must be larger than the current {entry.record.disk_mib}")
            if registry.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            with driver_errors():
                registry.runtime.refuse(DISK_RESIZE, entry.record)
            disk = registry.disk_view()
            if disk is not None:
                disk.admit(
                    disk_mib - entry.record.disk_mib,
                    disk_mib=disk_mib,
                    holds_mib=min(entry.disk_used_bytes // MIB, entry.record.disk_mib),
                )
            with driver_errors():
                await registry.runtime.resize(entry.record, disk_mib)
            entry.resized(disk_mib)
            registry.records.save(entry.record)
        return disk_mib

    # -- destroy --------------------------------------------------------------------------------

    async def destroy(self, sandbox_id: str) -> None:
        """Destroys the sandbox; idempotent. A create of this id in flight is waited for, then undone; one
        that has not arrived yet (a destroy may overtake it: they come on different connections) is
        refused when it does (``Registry.reserve``), so whatever the order, nothing of the id is left."""
        registry = self.registry
        while (born := registry.born.get(sandbox_id)) is not None:
            await born.wait()  # a destroy that overtakes its create waits for it, then undoes it
        if sandbox_id in registry.stopped:
            await self._destroy_stopped(sandbox_id)
            return
        if await self.hibernation.destroy(sandbox_id):
            if registry.builds is not None:
                await registry.builds.collect()
            await registry.drop_deleted_images()
            return
        entry = registry.entries.get(sandbox_id)
        if entry is None:  # already gone, or its create has not come (yet): it will be refused
            registry.forget_destroyed_unseen()
            registry.destroyed_unseen.pop(sandbox_id, None)  # re-inserted last: the dict stays oldest first
            registry.destroyed_unseen[sandbox_id] = time.monotonic()
            return
        await entry.end_exchanges(DESTROYED_MESSAGE)
        async with entry.lock:
            moved = registry.entries.get(sandbox_id) is not entry
            if not moved:
                await self.networks.leave_all(entry.record)
                runtime = registry.runtime
                with driver_errors():
                    if isinstance(runtime, RecyclesNetworks):
                        await runtime.destroy_keeping_network(entry.record)
                    else:
                        await runtime.destroy(entry.record)
                await self.traffic.release(sandbox_id, runtime, entry.record)
                await self.disks.release(sandbox_id, entry.record)
                if self.volumes is not None:  # after the sandbox: its copies of the mounts went with it
                    await self.volumes.release(sandbox_id)
                if isinstance(runtime, RecyclesNetworks):  # nothing of it is left: its network, the next's
                    with driver_errors():
                        await runtime.recycle(sandbox_id)
                self.traffic.usage.pop(sandbox_id, None)
                registry.records.delete(sandbox_id)
                del registry.entries[sandbox_id]
                await self.hibernation.forget_leftover(sandbox_id)
        if moved:  # destroyed meanwhile, or hibernated: then destroyed as such (its lock is this one)
            await self.hibernation.destroy(sandbox_id)
            return
        if registry.builds is not None:  # a deleted template's image goes with its last sandbox
            await registry.builds.collect()
        await registry.drop_deleted_images()
        log.info("sandbox_destroyed", sandbox_id=sandbox_id)

    async def _destroy_stopped(self, sandbox_id: str) -> None:
        """Destroys a sandbox of another tier's driver with that driver."""
        registry = self.registry
        entry, _ = registry.stopped[sandbox_id]
        record = entry.record
        async with entry.lock:
            if sandbox_id not in registry.stopped:
                return
            await self.networks.leave_all(record)
            driver = self.retired.get(record.driver)
            if driver is None:
                raise errors.SandboxFailed(
                    f"this agent has no {record.driver} driver to destroy {sandbox_id}"
                )
            with driver_errors():
                await driver.destroy(record)
            await self.traffic.release(sandbox_id, driver, record)
            await self.disks.release(sandbox_id, record)
            if self.volumes is not None:
                await self.volumes.release(sandbox_id)
            registry.records.delete(sandbox_id)
            del registry.stopped[sandbox_id]
        log.info("sandbox_destroyed", sandbox_id=sandbox_id, driver=record.driver)

    # -- sandboxes of another tier --------------------------------------------------------------

    async def stop_other_tiers(self, records: list[SandboxRecord]) -> None:
        """Sandboxes recorded by another driver than this agent's (the host was restarted on another
        tier: a VM among containers, or the reverse) cannot be served: each is stopped by its own
        driver and held, reported ``error`` with the reason, until it is destroyed. Whatever goes
        wrong with one, the agent starts."""
        registry = self.registry
        label = registry.runtime_label
        here = f"the {ISOLATION.get(label, label)} tier ({label})"
        others = [record for record in records if record.driver != registry.runtime.name]
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
                registry.stopped[record.id] = (Entry(record), reason)
                log.warning("sandbox_of_another_tier", sandbox_id=record.id, tier=runtime, outcome=outcome)

    async def close(self) -> None:
        for driver in self.retired.values():  # what they opened to stop or destroy (the disk store)
            await driver.close()


def _result(record: SandboxRecord) -> CreateSandboxResult:
    return CreateSandboxResult(
        id=record.id, ip=record.ip, spawn_ms=record.spawn_ms, status=record.state.value
    )
