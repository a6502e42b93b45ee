"""``SandboxManager``: the one object the internal API's routes, the kept channel, the managed-process
routes and the heartbeat call, composing the nouns of ``sandboxes/``.

It holds no rule of its own: each method is one noun's (``lifecycle``, ``networks``, ``disks``,
``commands``, ``traffic``, ``heartbeat``, and the ``registry`` of what this host holds); only the
agent's start and stop, which touch them all, are written here. It stays one object so that the
routes (``routes.py``, ``channelserver.py``, ``processes.py``, ``registrar.py``) and the tests' fakes of
it keep one surface to call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager

from paddock_core.logging import get_logger
from paddock_hostagent.builds import BuildManager
from paddock_hostagent.capacity import DiskView, MemoryView
from paddock_hostagent.drivers.base import RuntimeState, SandboxRuntime, SnapshotInfo
from paddock_hostagent.drivers.net.bridges import BridgeNetworks
from paddock_hostagent.drivers.storage.s3mounts import S3Mounter
from paddock_hostagent.drivers.storage.volumes import VolumeStore
from paddock_hostagent.egress import EgressService
from paddock_hostagent.execution import ExecStream
from paddock_hostagent.guest import GuestError
from paddock_hostagent.images import ImageStore
from paddock_hostagent.records import RecordStore
from paddock_hostagent.sandboxes.commands import Commands
from paddock_hostagent.sandboxes.disks import Disks
from paddock_hostagent.sandboxes.heartbeat import Heartbeat
from paddock_hostagent.sandboxes.lifecycle import Lifecycle
from paddock_hostagent.sandboxes.networks import Networks
from paddock_hostagent.sandboxes.registry import Entry, Registry, pause_satisfies_self_request
from paddock_hostagent.sandboxes.traffic import Traffic
from paddock_hostagent.sandboxes.volumes import Volumes
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
    SnapshotBody,
    SnapshotDeleted,
    SnapshotView,
)
from paddock_hostagent.settings import HostAgentSettings

log = get_logger(__name__)


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
        self.runtime = runtime
        self.images = images
        self.records = records
        self.bridges = bridges
        self.egress = egress
        self.registry = Registry(settings, runtime, images, records)
        self.traffic = Traffic(self.registry, egress)
        self.networks = Networks(self.registry, bridges, self.traffic)
        self.disks = Disks(self.registry, disks)
        self.commands = Commands(self.registry)
        #: Local persistent volumes (issue #34), beside the disk store: ``<state>/volumes``.
        self.volumes = Volumes(
            self.registry, VolumeStore(settings.state_dir / "volumes"), linger_s=settings.volume_linger_s
        )
        self.lifecycle = Lifecycle(
            self.registry, self.traffic, self.networks, self.disks, retired, volumes=self.volumes
        )
        self.heartbeat = Heartbeat(self.registry, self.traffic, self.disks)
        self._watcher: asyncio.Task[None] | None = None

    @property
    def runtime_label(self) -> str:
        """The runtime this host reports (crun, runc, runsc, qemu); the app sets the one it resolved."""
        return self.registry.runtime_label

    @runtime_label.setter
    def runtime_label(self, label: str) -> None:
        self.registry.runtime_label = label

    @property
    def builds(self) -> BuildManager | None:
        """Template builds; set by the app when buildah is there."""
        return self.registry.builds

    @builds.setter
    def builds(self, builds: BuildManager | None) -> None:
        self.registry.builds = builds

    @property
    def _entries(self) -> dict[str, Entry]:
        """The registry's entries, under the pre-split manager's name (``stats.py`` reads it)."""
        return self.registry.entries

    # -- start-up and shutdown ------------------------------------------------------------------

    async def start(self) -> None:
        registry = self.registry
        records = self.records.load_all()
        # All sandboxes together stay within the budget whatever the overcommit (capacity.py).
        self.runtime.cap_memory(registry.total_mib)
        records = await self.lifecycle.hibernation.adopt(records)  # hibernated ones are held apart
        hibernated = [entry.record for entry in registry.hibernated.values()]
        await self.lifecycle.stop_other_tiers(records)
        states = await self.runtime.start(records)  # all: a driver keeps the others' addresses
        records = [record for record in records if record.id not in registry.stopped]
        for record in records:
            entry = Entry(record)
            registry.entries[record.id] = entry
            state = states.get(record.id, RuntimeState.STOPPED)
            entry.stopped = state == RuntimeState.STOPPED
            on_hold = record.state == RuntimeState.RUNNING and record.id in registry.diskwatch.held
            if state == RuntimeState.PAUSED and on_hold:  # frozen by the disk's watermark, not its user
                state = RuntimeState.RUNNING
            if state != RuntimeState.STOPPED:
                # The runtime's probe is the truth (the freezer, the VM's marker): a pause or resume
                # answered just before a crash may not have reached the record (``save_soon``).
                record.state = state
            if state == RuntimeState.PAUSED:
                pause_satisfies_self_request(record)
            if state == RuntimeState.RUNNING and not on_hold:  # a held sandbox's guest is frozen
                with contextlib.suppress(GuestError, TimeoutError):
                    guest_info = await asyncio.wait_for(self.runtime.guest(record).info(), 1.0)
                    record.last_activity_at = max(record.last_activity_at, guest_info.last_activity_at)
            log.info("sandbox_adopted", sandbox_id=record.id, state=state.value)
            if state != RuntimeState.STOPPED:
                await self.networks.restore(record)
                await self.disks.restore(record)
        await self.networks.prune(
            records + hibernated + [entry.record for entry, _ in registry.stopped.values()]
        )
        await self.traffic.start(records)
        held = {record.id for record in records} | set(registry.stopped) | set(registry.hibernated)
        await self.disks.prune(held)
        # Volumes held by sandboxes that did not survive (stopped, or gone with a reboot) are released;
        # a hibernated sandbox keeps its holds for its wake.
        await self.volumes.start(
            {record.id for record in records if not registry.entries[record.id].stopped}
            | set(registry.hibernated)
        )
        await registry.drop_deleted_images()  # those whose last sandbox went while the agent was down
        self._watcher = asyncio.create_task(self.heartbeat.watch_guests(), name="guest-watcher")
        registry.diskwatch.start()

    async def close(self) -> None:
        self.registry.cancel_saves()  # every record is saved just below
        await self.registry.diskwatch.close()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self.registry.save_all()
        if self.builds is not None:  # before the network and egress they borrow go
            await self.builds.close()
        await self.volumes.close()
        await self.runtime.close()
        await self.lifecycle.close()
        await self.traffic.close()

    # -- what this host holds (registry) --------------------------------------------------------

    def entry(self, sandbox_id: str) -> Entry:
        """The sandbox (404 unknown, 409 of another tier)."""
        return self.registry.entry(sandbox_id)

    def running_entry(self, sandbox_id: str) -> Entry:
        """The sandbox, running (404 unknown, 409 not running)."""
        return self.registry.running_entry(sandbox_id)

    def get(self, sandbox_id: str) -> SandboxView:
        return self.registry.get(sandbox_id)

    def views(self) -> list[SandboxView]:
        return self.registry.views()

    def info(self) -> HostInfo:
        return self.registry.info()

    def memory_view(self) -> MemoryView:
        return self.registry.memory_view()

    def disk_view(self) -> DiskView | None:
        return self.registry.disk_view()

    def uses_image(self, image: str) -> bool:
        return self.registry.uses_image(image)

    async def drop_deleted_images(self) -> None:
        await self.registry.drop_deleted_images()

    # -- lifecycle ------------------------------------------------------------------------------

    async def create(self, body: CreateSandboxBody) -> CreateSandboxResult:
        return await self.lifecycle.create(body)

    async def fork(self, sandbox_id: str, body: ForkBody) -> CreateSandboxResult:
        return await self.lifecycle.fork(sandbox_id, body)

    async def snapshot(self, sandbox_id: str, body: SnapshotBody) -> SnapshotView:
        started = time.monotonic()
        info = await self.lifecycle.snapshot(sandbox_id, body.snapshot_id)
        return snapshot_view(info, snapshot_ms=round((time.monotonic() - started) * 1000, 3))

    def get_snapshot(self, snapshot_id: str) -> SnapshotView:
        return snapshot_view(self.lifecycle.snapshot_info(snapshot_id))

    async def delete_snapshot(self, snapshot_id: str) -> SnapshotDeleted:
        return SnapshotDeleted(id=snapshot_id, deleted=await self.lifecycle.delete_snapshot(snapshot_id))

    async def pause(self, sandbox_id: str) -> str:
        return await self.lifecycle.pause(sandbox_id)

    async def resume(self, sandbox_id: str) -> str:
        return await self.lifecycle.resume(sandbox_id)

    async def resize(self, sandbox_id: str, disk_mib: int) -> int:
        return await self.lifecycle.resize(sandbox_id, disk_mib)

    async def hibernate(self, sandbox_id: str) -> str:
        return await self.lifecycle.hibernation.hibernate(sandbox_id)

    async def wake(self, sandbox_id: str) -> CreateSandboxResult:
        return await self.lifecycle.hibernation.wake(sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        await self.lifecycle.destroy(sandbox_id)

    # -- private networks, S3 disks -------------------------------------------------------------

    async def attach_network(self, sandbox_id: str, body: NetworkAttachBody) -> NetworkAttachment:
        return await self.networks.attach(sandbox_id, body)

    async def detach_network(self, sandbox_id: str, network_id: str) -> None:
        await self.networks.detach(sandbox_id, network_id)

    async def attach_disk(self, sandbox_id: str, body: DiskMountBody) -> DiskMountView:
        return await self.disks.attach(sandbox_id, body)

    async def detach_disk(self, sandbox_id: str, mount_path: str) -> None:
        await self.disks.detach(sandbox_id, mount_path)

    # -- commands and files ---------------------------------------------------------------------

    async def open_exec(self, sandbox_id: str, body: ExecBody) -> ExecStream:
        return await self.commands.open_exec(sandbox_id, body)

    async def write_file(self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes]) -> int:
        return await self.commands.write_file(sandbox_id, path, chunks)

    def read_file(
        self, sandbox_id: str, path: str
    ) -> AbstractAsyncContextManager[tuple[int | None, AsyncIterator[bytes]]]:
        """Yields (size or None, chunk iterator); errors are raised on entering."""
        return self.commands.read_file(sandbox_id, path)

    # -- egress and bandwidth -------------------------------------------------------------------

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> list[str]:
        return await self.traffic.set_egress(sandbox_id, rules)

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> BandwidthResult:
        return await self.traffic.set_bandwidth(sandbox_id, quota_bytes)

    async def bandwidth(self, sandbox_id: str) -> BandwidthResult:
        return await self.traffic.bandwidth(sandbox_id)

    # -- heartbeat ------------------------------------------------------------------------------

    async def refresh_usage(self) -> None:
        await self.heartbeat.refresh_usage()


def snapshot_view(info: SnapshotInfo, *, snapshot_ms: float | None = None) -> SnapshotView:
    return SnapshotView(
        id=info.id,
        image=info.image,
        fs=info.fs,
        disk_mib=info.disk_mib,
        source_id=info.source_id,
        created_at=info.created_at,
        size_bytes=info.size_bytes,
        snapshot_ms=snapshot_ms,
    )
