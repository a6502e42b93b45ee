"""Local persistent volumes of this host (issue #34, docs/volumes.md): made, grown and removed here, and
mounted into running sandboxes of the container tier (``drivers/storage/volumes.py`` keeps them,
``drivers/storage/volmount.py`` places the mounts in a sandbox's namespace).

Which sandboxes hold a volume is kept in the volume's own record, so a restarted agent knows what to
keep mounted: holders whose sandbox did not survive (an agent restart that found it stopped, a reboot)
are dropped when the agent starts, and a volume nobody holds is unmounted from the host. The control
plane decides who may attach (one writer, or any number of readers); the host checks the same rule
again before it mounts.
"""

from __future__ import annotations

import contextlib

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import DriverError, RuntimeState, TierUnsupportedError
from paddock_hostagent.drivers.storage.volumes import (
    Holder,
    VolumeBusyError,
    VolumeMeta,
    VolumeMissingError,
    VolumeStore,
    place_in,
    remove_from,
)
from paddock_hostagent.sandboxes.checks import driver_errors
from paddock_hostagent.sandboxes.registry import Registry
from paddock_hostagent.schemas import (
    VolumeCreateBody,
    VolumeDeleted,
    VolumeHolder,
    VolumeMountBody,
    VolumeMountView,
    VolumeView,
)

log = get_logger(__name__)

VOLUMES = "mounting a local volume"
#: Runtimes whose sandboxes take volumes, and why the others do not.
_REFUSED = {
    "runsc": ("gvisor", "gVisor's sentry keeps its own mount table; the host cannot mount into it"),
    "qemu": ("vm", "the VM has its own kernel, and the host cannot mount into it"),
}


class Volumes:
    def __init__(self, registry: Registry, store: VolumeStore) -> None:
        self.registry = registry
        self.store = store
        #: Sandbox id -> the volumes it holds (from the records at start, kept with each change), so a
        #: destroy reads no volume's record unless the sandbox held it.
        self.held: dict[str, set[str]] = {}

    def _note(self, meta: VolumeMeta) -> None:
        for volumes in self.held.values():
            volumes.discard(meta.id)
        for holder in meta.holders:
            self.held.setdefault(holder.sandbox_id, set()).add(meta.id)
        for sandbox_id in [s for s, volumes in self.held.items() if not volumes]:
            del self.held[sandbox_id]

    def _refuse_tier(self) -> None:
        refused = _REFUSED.get(self.registry.runtime_label)
        if refused is not None:
            tier, why = refused
            with driver_errors():
                raise TierUnsupportedError(tier, VOLUMES, why)

    def view(self, meta: VolumeMeta) -> VolumeView:
        return VolumeView(
            id=meta.id,
            size_mib=meta.size_mib,
            used_bytes=self.store.used_bytes(meta.id),
            holders=[
                VolumeHolder(sandbox_id=h.sandbox_id, mount_path=h.mount_path, read_only=h.read_only)
                for h in meta.holders
            ],
        )

    def _load(self, volume_id: str) -> VolumeMeta:
        try:
            return self.store.load(volume_id)
        except VolumeMissingError as exc:
            raise errors.BadRequest(str(exc)) from None

    # -- the volumes ----------------------------------------------------------------------------

    async def create(self, body: VolumeCreateBody) -> VolumeView:
        self._refuse_tier()
        async with self.store.lock(body.volume_id):
            with driver_errors():
                meta = await self.store.create(body.volume_id, body.size_mib)
        log.info("volume_created", volume_id=meta.id, size_mib=meta.size_mib)
        return self.view(meta)

    def get(self, volume_id: str) -> VolumeView:
        return self.view(self._load(volume_id))

    async def resize(self, volume_id: str, size_mib: int) -> VolumeView:
        async with self.store.lock(volume_id):
            meta = self._load(volume_id)
            if size_mib < meta.size_mib:
                raise errors.BadRequest(f"size_mib: a volume only grows (it has {meta.size_mib} MiB)")
            with driver_errors():
                await self.store.grow(meta, size_mib)
        log.info("volume_resized", volume_id=volume_id, size_mib=size_mib)
        return self.view(meta)

    async def delete(self, volume_id: str) -> VolumeDeleted:
        async with self.store.lock(volume_id):
            try:
                with driver_errors():
                    deleted = await self.store.delete(volume_id)
            except VolumeBusyError as exc:
                raise errors.InvalidState(str(exc)) from None
        log.info("volume_deleted", volume_id=volume_id, deleted=deleted)
        return VolumeDeleted(id=volume_id, deleted=deleted)

    # -- attachments ----------------------------------------------------------------------------

    async def attach(self, sandbox_id: str, body: VolumeMountBody) -> VolumeMountView:
        """Mounts the volume at ``mount_path`` in a running or paused sandbox; the same volume at the
        same path again is a no-op."""
        entry = self.registry.entry(sandbox_id)
        async with entry.lock, self.store.lock(body.volume_id):
            if self.registry.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            self._refuse_tier()
            meta = self._load(body.volume_id)
            answer = VolumeMountView(volume_id=meta.id, mount_path=body.mount_path, read_only=body.read_only)
            mine = [h for h in meta.holders if h.sandbox_id == sandbox_id]
            if mine:
                if mine[0].mount_path == body.mount_path and mine[0].read_only == body.read_only:
                    return answer
                raise errors.AlreadyExists(f"volume {meta.id} is already mounted at {mine[0].mount_path}")
            writer = next((h for h in meta.holders if not h.read_only), None)
            if writer is not None or (meta.holders and not body.read_only):
                holder = writer or meta.holders[0]
                raise errors.InvalidState(
                    f"volume {meta.id} is mounted read-write in {holder.sandbox_id}"
                    if writer
                    else f"volume {meta.id} is mounted read-only in {holder.sandbox_id}"
                )
            with driver_errors():
                pid = self.registry.runtime.mount_namespace_pid(entry.record)
                await self.store.mount_on_host(meta.id)
            reason = await place_in(
                pid, self.store.mount_dir(meta.id), body.mount_path, read_only=body.read_only
            )
            if reason is not None:
                if not meta.holders:
                    with contextlib.suppress(DriverError):
                        await self.store.unmount_on_host(meta.id)
                raise errors.BadPath(f"cannot mount at {body.mount_path} in the sandbox: {reason}")
            meta.holders.append(Holder(sandbox_id, body.mount_path, body.read_only))
            self.store.save(meta)
            self._note(meta)
        log.info(
            "volume_attached",
            volume_id=meta.id,
            sandbox_id=sandbox_id,
            mount_path=body.mount_path,
            read_only=body.read_only,
        )
        return answer

    async def detach(self, sandbox_id: str, volume_id: str) -> None:
        """Takes the volume out of the sandbox (every mount of it there); not held is a no-op."""
        entry = self.registry.entry(sandbox_id)
        async with entry.lock, self.store.lock(volume_id):
            try:
                meta = self.store.load(volume_id)
            except VolumeMissingError:
                return
            if not any(h.sandbox_id == sandbox_id for h in meta.holders):
                return
            device = self.store.device_of(volume_id)
            pid: int | None = None
            with contextlib.suppress(DriverError):
                pid = self.registry.runtime.mount_namespace_pid(entry.record)
            if pid is not None and device is not None:
                reason = await remove_from(pid, device)
                if reason is not None:
                    raise errors.SandboxFailed(f"cannot unmount volume {volume_id}: {reason}")
            await self._drop_holder(meta, sandbox_id)
        log.info("volume_detached", volume_id=volume_id, sandbox_id=sandbox_id)

    async def _drop_holder(self, meta: VolumeMeta, sandbox_id: str) -> None:
        meta.holders = [h for h in meta.holders if h.sandbox_id != sandbox_id]
        self.store.save(meta)
        self._note(meta)
        if not meta.holders:
            with driver_errors():
                await self.store.unmount_on_host(meta.id)

    async def release(self, sandbox_id: str) -> None:
        """A destroyed sandbox's volumes (after the sandbox: its copies went with its namespace)."""
        for volume_id in sorted(self.held.get(sandbox_id, ())):
            async with self.store.lock(volume_id):
                try:
                    await self._drop_holder(self.store.load(volume_id), sandbox_id)
                except (errors.HostAgentServerError, VolumeMissingError) as exc:
                    log.warning("volume_release_failed", volume_id=volume_id, error=str(exc))
        self.held.pop(sandbox_id, None)

    async def start(self, live: set[str]) -> None:
        """At the agent's start: half-made volumes go; holders whose sandbox is not ``live`` any more
        are dropped; a volume still held stays mounted on the host, one held by nobody is unmounted
        (after a reboot there was nothing mounted; after a crash its loop may have stayed)."""
        self.store.remove_partial()
        for meta in self.store.all():
            kept = [h for h in meta.holders if h.sandbox_id in live]
            if kept != meta.holders:
                meta.holders = kept
                self.store.save(meta)
            self._note(meta)
            try:
                if kept:
                    await self.store.mount_on_host(meta.id)
                else:
                    await self.store.unmount_on_host(meta.id)
            except DriverError as exc:
                log.warning("volume_start_failed", volume_id=meta.id, error=str(exc))
