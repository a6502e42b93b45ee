"""S3 disks of this host's sandboxes: mounted at boot or into a running sandbox, unmounted, and live
again after an agent restart or the death of their s3fs (``drivers/storage/s3mounts.py`` runs s3fs,
``drivers/storage/nsmount.py`` moves its mount into the sandbox)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import S3_DISKS, DriverError, RuntimeState, SandboxRecord
from paddock_hostagent.drivers.runtime.oci import OciRuntime
from paddock_hostagent.drivers.storage.s3mounts import S3Mount, S3Mounter
from paddock_hostagent.sandboxes.checks import driver_errors
from paddock_hostagent.sandboxes.registry import Registry
from paddock_hostagent.sandboxes.views import disk_view
from paddock_hostagent.schemas import CreateSandboxBody, DiskMountBody, DiskMountView

log = get_logger(__name__)


@dataclass
class BootDisks:
    """A create's S3 disks where the tier binds them only at the sandbox's start (gVisor): the
    runtime's ``before_start`` in ``runtime_args``, and the mounts it made, whatever their outcome,
    in ``bound``. Empty ``runtime_args``: nothing is bound at the start (no disks, or a tier that
    mounts them once the sandbox runs)."""

    runtime_args: dict[str, Any] = field(default_factory=dict)
    bound: list[S3Mount] = field(default_factory=list)


class Disks:
    def __init__(self, registry: Registry, mounter: S3Mounter | None) -> None:
        self.registry = registry
        self.mounter = mounter

    def _require_mounter(self) -> S3Mounter:
        if self.mounter is None:
            raise errors.BadRequest("disks are not enabled on this host (s3fs or /dev/fuse missing)")
        return self.mounter

    def at_boot(self, body: CreateSandboxBody) -> BootDisks:
        """The runtime's ``before_start`` for a create's S3 disks where the tier binds them only at the
        sandbox's start (gVisor: drivers/runtime/oci.py); no arguments elsewhere (they are attached once
        it runs). A tier that mounts none refuses the create before anything is made."""
        boot = BootDisks()
        if not body.disks:
            return boot
        if len({disk.mount_path for disk in body.disks}) != len(body.disks):
            raise errors.BadRequest("disks: each mount_path may appear once")
        mounter = self._require_mounter()
        runtime = self.registry.runtime
        with driver_errors():
            runtime.refuse(S3_DISKS)  # the VM tier: 409 naming it
        if not (isinstance(runtime, OciRuntime) and runtime.options.runtime == "runsc"):
            return boot

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
                netns=runtime.network_namespace(record),
            )
            return mount, point

        async def before_start(record: SandboxRecord) -> list[tuple[Path, str]]:
            outcomes = await asyncio.gather(*(mount_one(record, disk) for disk in body.disks))
            boot.bound.extend(mount for mount, _ in outcomes)
            return [(point, mount.mount_path) for mount, point in outcomes if point is not None]

        boot.runtime_args["before_start"] = before_start
        return boot

    async def release_boot(self, sandbox_id: str, boot: BootDisks) -> None:
        """A boot that failed: the disks it bound at the start go."""
        if boot.bound and self.mounter is not None:
            await self.mounter.release(sandbox_id, boot.bound)

    async def release(self, sandbox_id: str, record: SandboxRecord) -> None:
        """A destroyed sandbox's disks go (after the sandbox: nothing in it holds the mounts any more)."""
        if self.mounter is not None:
            await self.mounter.release(sandbox_id, [S3Mount.from_json(d) for d in record.disks])

    async def prune(self, held: set[str]) -> None:
        """At start: the mounts of sandboxes not in ``held`` go."""
        if self.mounter is not None:
            await self.mounter.prune(held)

    async def attach(self, sandbox_id: str, body: DiskMountBody) -> DiskMountView:
        """Mounts an S3 disk into a running or paused sandbox and answers once it is ``mounted`` or
        ``error`` (bounded by the mounter's timeout). The same disk and path again is a no-op."""
        mounter = self._require_mounter()
        runtime = self.registry.runtime
        entry = self.registry.entry(sandbox_id)
        async with entry.lock:
            if self.registry.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            record = entry.record
            current = [S3Mount.from_json(d) for d in record.disks]
            existing = next((m for m in current if m.mount_path == body.mount_path), None)
            if existing is not None:
                # A disk bound at the start (gVisor) answers with its outcome there, mounted or not.
                if existing.disk_id == body.disk_id and (existing.status == "mounted" or existing.at_boot):
                    return disk_view(existing)
                raise errors.AlreadyExists(f"{body.mount_path} already holds disk {existing.disk_id}")
            with driver_errors():
                runtime.refuse(S3_DISKS, record)
            mount = S3Mount(
                disk_id=body.disk_id,
                mount_path=body.mount_path,
                sub_path=body.sub_path,
                bucket=body.bucket,
                endpoint=body.endpoint,
                region=body.region,
                use_path_style=body.use_path_style,
            )
            with driver_errors():
                pid = runtime.mount_namespace_pid(record)
                netns = runtime.network_namespace(record)  # where s3fs's connections leave from
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
                self.registry.records.save(record)
        return disk_view(mount)

    async def detach(self, sandbox_id: str, mount_path: str) -> None:
        """Unmounts the disk at ``mount_path``; nothing mounted there is a no-op."""
        entry = self.registry.entry(sandbox_id)
        async with entry.lock:
            record = entry.record
            current = [S3Mount.from_json(d) for d in record.disks]
            leaving = [m for m in current if m.mount_path == mount_path]
            if not leaving:
                return
            mounter = self._require_mounter()
            pid: int | None = None
            with contextlib.suppress(DriverError):
                pid = self.registry.runtime.mount_namespace_pid(record)
            for mount in leaving:
                await mounter.unmount(sandbox_id, mount, ns_pid=pid)
            record.disks = [m.to_json() for m in current if m.mount_path != mount_path]
            self.registry.records.save(record)
        log.info("disk_detached", sandbox_id=sandbox_id, mount_path=mount_path)

    async def restore(self, record: SandboxRecord) -> None:
        """After an agent restart: every recorded mount is live in its sandbox again."""
        if self.mounter is None or not record.disks:
            return
        if any(S3Mount.from_json(data).at_boot for data in record.disks):  # gVisor: bound at its start
            checked = []
            for data in record.disks:
                mount = S3Mount.from_json(data)
                await self.mounter.check_bound(record.id, mount)
                checked.append(mount.to_json())
            if checked != record.disks:
                record.disks = checked
                self.registry.records.save(record)
            return
        try:
            pid = self.registry.runtime.mount_namespace_pid(record)
            netns = self.registry.runtime.network_namespace(record)
        except DriverError:
            return
        restored = []
        for data in record.disks:
            mount = S3Mount.from_json(data)
            await self.mounter.restore(record.id, mount, ns_pid=pid, netns=netns)
            restored.append(mount.to_json())
        if restored != record.disks:
            record.disks = restored
            self.registry.records.save(record)

    async def check(self) -> None:
        """A mount whose s3fs died (crashed, killed, out of memory) is mounted again, as after an agent
        restart; sandboxes busy with a lifecycle operation are checked next time."""
        for entry in list(self.registry.entries.values()):
            if not entry.record.disks or entry.lock.locked():
                continue
            async with entry.lock:
                if (
                    self.registry.entries.get(entry.record.id) is entry
                    and self.registry.status(entry) != "stopped"
                ):
                    await self.restore(entry.record)
