"""Local persistent volumes of this host (issue #34, docs/volumes.md): made, grown and removed here, and
mounted into sandboxes (``drivers/storage/volumes.py`` keeps them). How a sandbox gets one depends on
its tier:

- container (crun, runc): the host mounts the volume and ``drivers/storage/volmount.py`` places a clone
  of that mount in the sandbox's namespace, at create or live;
- gVisor (runsc): its sentry keeps its own mount table and binds host directories only when it starts,
  so a volume is attached *before* the sandbox is made (an attach naming a sandbox id this host does
  not hold yet is kept for that id's create, ``RESERVATION_S`` at most) and its host mount is bound into
  the container at its start (a read-only one through a read-only bind of it, ``<store>/.read-only/``);
  a live attach into a running gVisor sandbox is a 409 naming the tier;
- VM (qemu): the volume's image file is given to the VM at its boot as an extra virtio-blk drive
  (read-only on QEMU's side for a read-only mount; ``drivers/vm/qemu.py``) and the guest's init mounts
  it at its path inside the VM; the host never mounts it meanwhile (two kernels on one XFS would break
  it), and does not grow it while a VM holds it. It is attached before the create as on gVisor; a live
  attach is a 409 naming the tier.

Which sandboxes hold a volume is kept in the volume's own record, so a restarted agent knows what to
keep mounted: holders whose sandbox did not survive (an agent restart that found it stopped, a reboot)
are dropped when the agent starts, and a volume nobody holds is unmounted from the host. The control
plane decides who may attach (one writer, or any number of readers); the host checks the same rule
again before it mounts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import DriverError, RuntimeState, SandboxRecord, TierUnsupportedError
from paddock_hostagent.drivers.storage import mounts
from paddock_hostagent.drivers.storage.volumes import (
    Holder,
    VolumeBusyError,
    VolumeMeta,
    VolumeMissingError,
    VolumeStore,
    place_in,
    remove_from,
)
from paddock_hostagent.drivers.vm.qemu import VolumeDrive
from paddock_hostagent.sandboxes.checks import driver_errors
from paddock_hostagent.sandboxes.registry import Registry
from paddock_hostagent.schemas import (
    VolumeCloneBody,
    VolumeCreateBody,
    VolumeDeleted,
    VolumeHolder,
    VolumeMountBody,
    VolumeMountView,
    VolumeView,
)

log = get_logger(__name__)

VOLUMES = "mounting a local volume"
#: Runtimes whose running sandboxes take no volume (one named at create is given at the start), and why.
_LIVE_REFUSED = {
    "runsc": (
        "gvisor",
        "gVisor binds host directories only when the sandbox starts; name the volume in the create",
    ),
    "qemu": ("vm", "a volume is given to a VM as a drive when it boots; name the volume in the create"),
}
#: The VM runtime: its volumes are drives of its machine, never mounted on the host.
VM_RUNTIME = "qemu"
LIVE = "mounting a local volume into a running sandbox"
#: How long a volume attached to a sandbox this host has not made yet (gVisor) waits for its create.
RESERVATION_S = 300.0
#: Where read-only binds of volumes' host mounts live (gVisor's readers), beside the volumes.
READ_ONLY_VIEWS = ".read-only"
_MS_RDONLY = 0x1
_MS_REMOUNT = 0x20


@dataclass
class _Reservation:
    """Volumes attached to a sandbox before its create (gVisor), as (host directory, mount path)."""

    at: float
    binds: list[tuple[Path, str]] = field(default_factory=list)
    #: The same for a VM: the volumes' image files, given as drives.
    drives: list[VolumeDrive] = field(default_factory=list)
    bound: bool = False


def _bind_read_only(source: Path, view: Path) -> None:
    mounts.mount(str(source), view, "", "", mounts.MS_BIND)
    try:
        flags = mounts.MS_BIND | _MS_REMOUNT | _MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV
        mounts.mount("", view, "", "", flags)
    except DriverError:
        mounts.unmount(view)
        raise


@dataclass
class _Linger:
    """A volume a file call left mounted on the host, and the timer that unmounts it."""

    timer: asyncio.TimerHandle
    token: object = field(default_factory=object)


class Volumes:
    def __init__(self, registry: Registry, store: VolumeStore, *, linger_s: float = 0.0) -> None:
        self.registry = registry
        self.store = store
        #: How long a volume ``on_host`` mounted stays mounted after the call (``volume_linger_s``).
        self.linger_s = linger_s
        self._lingering: dict[str, _Linger] = {}
        self._expiring: set[asyncio.Task[None]] = set()
        #: Sandbox id -> the volumes it holds (from the records at start, kept with each change), so a
        #: destroy reads no volume's record unless the sandbox held it.
        self.held: dict[str, set[str]] = {}
        #: Sandbox id -> the volumes attached before its create, bound at its start (gVisor).
        self.reserved: dict[str, _Reservation] = {}

    def _note(self, meta: VolumeMeta) -> None:
        for volumes in self.held.values():
            volumes.discard(meta.id)
        for holder in meta.holders:
            self.held.setdefault(holder.sandbox_id, set()).add(meta.id)
        for sandbox_id in [s for s, volumes in self.held.items() if not volumes]:
            del self.held[sandbox_id]

    def _refuse_live(self) -> None:
        refused = _LIVE_REFUSED.get(self.registry.runtime_label)
        if refused is not None:
            tier, why = refused
            with driver_errors():
                raise TierUnsupportedError(tier, LIVE, why)

    def _read_only_view_dir(self, volume_id: str) -> Path:
        self.store.mount_dir(volume_id)  # checks the id's form
        return self.store.directory / READ_ONLY_VIEWS / volume_id

    async def _read_only_view(self, volume_id: str) -> Path:
        """A read-only bind of the volume's host mount (made once), for a tier that binds it as is."""
        view = self._read_only_view_dir(volume_id)
        view.mkdir(parents=True, exist_ok=True, mode=0o755)
        if not mounts.is_mountpoint(view):
            with driver_errors():
                await asyncio.to_thread(_bind_read_only, self.store.mount_dir(volume_id), view)
        return view

    async def _unmount_on_host(self, volume_id: str) -> None:
        view = self._read_only_view_dir(volume_id)
        if view.is_dir():
            await asyncio.to_thread(mounts.unmount, view)
            with contextlib.suppress(OSError):
                view.rmdir()
        await self.store.unmount_on_host(volume_id)

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

    def _linger(self, volume_id: str) -> None:
        """Keeps the volume ``on_host`` mounted on the host for ``linger_s`` more (a call in that time
        finds it mounted and takes it over), then unmounts it."""
        loop = asyncio.get_running_loop()
        token = object()

        def expire() -> None:
            task = loop.create_task(self._expire(volume_id, token), name=f"volume-linger-{volume_id}")
            self._expiring.add(task)
            task.add_done_callback(self._expiring.discard)

        self._lingering[volume_id] = _Linger(loop.call_later(self.linger_s, expire), token)

    async def _expire(self, volume_id: str, token: object) -> None:
        async with self.store.lock(volume_id):
            linger = self._lingering.get(volume_id)
            if linger is None or linger.token is not token:
                return  # a call since took the mount over
            try:
                await self._end_linger(volume_id)
            except errors.HostAgentServerError as exc:
                log.warning("volume_linger_unmount_failed", volume_id=volume_id, error=str(exc))

    async def _end_linger(self, volume_id: str) -> None:
        """Under the volume's lock: unmounts what file calls left mounted, unless a sandbox holds the
        volume by now. Whatever took it since (a container's attach, a gVisor sandbox's reservation)
        found the mount there and uses it; a VM's drive took it off the host at its reservation."""
        linger = self._lingering.pop(volume_id, None)
        if linger is None:
            return
        linger.timer.cancel()
        try:
            held = bool(self.store.load(volume_id).holders)
        except VolumeMissingError:
            return  # deleted since: its delete unmounted it
        if not held:
            with driver_errors():
                await self._unmount_on_host(volume_id)

    async def close(self) -> None:
        """At the agent's stop: what file calls left mounted is unmounted (a killed agent's next start
        unmounts every volume nobody holds)."""
        for volume_id in list(self._lingering):
            async with self.store.lock(volume_id):
                with contextlib.suppress(errors.HostAgentServerError):
                    await self._end_linger(volume_id)
        for task in list(self._expiring):
            task.cancel()
        await asyncio.gather(*self._expiring, return_exceptions=True)

    def _load(self, volume_id: str) -> VolumeMeta:
        try:
            return self.store.load(volume_id)
        except VolumeMissingError as exc:
            raise errors.BadRequest(str(exc)) from None

    # -- the volumes ----------------------------------------------------------------------------

    async def create(self, body: VolumeCreateBody) -> VolumeView:
        async with self.store.lock(body.volume_id):
            with driver_errors():
                meta = await self.store.create(body.volume_id, body.size_mib)
        log.info("volume_created", volume_id=meta.id, size_mib=meta.size_mib)
        return self.view(meta)

    async def clone(self, source_id: str, body: VolumeCloneBody) -> VolumeView:
        """A new volume ``body.volume_id``, a copy of ``source_id`` as it is now (a fork's or a
        snapshot's ``include_volumes``, or a boot's from such a snapshot; ``VolumeStore.clone`` freezes a
        held source's host mount for it). The container tier only: a gVisor or VM sandbox could not be
        given it live (409 naming the tier)."""
        refused = _LIVE_REFUSED.get(self.registry.runtime_label)
        if refused is not None:
            tier, _why = refused
            with driver_errors():
                raise TierUnsupportedError(
                    tier, "copying a volume into a fork", "its sandboxes take volumes only when they start"
                )
        async with self.store.lock(source_id), self.store.lock(body.volume_id):
            self._load(source_id)
            started = time.perf_counter()
            with driver_errors():
                meta, shared = await self.store.clone(source_id, body.volume_id, snapshot_id=body.snapshot_id)
        log.info(
            "volume_cloned",
            volume_id=meta.id,
            source_id=source_id,
            shared_blocks=shared,
            ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return self.view(meta)

    def get(self, volume_id: str) -> VolumeView:
        return self.view(self._load(volume_id))

    async def resize(self, volume_id: str, size_mib: int) -> VolumeView:
        async with self.store.lock(volume_id):
            meta = self._load(volume_id)
            if size_mib < meta.size_mib:
                raise errors.BadRequest(f"size_mib: a volume only grows (it has {meta.size_mib} MiB)")
            if self.registry.runtime_label == VM_RUNTIME and meta.holders:
                # Growing mounts it on the host, and a VM has it mounted: two kernels on one XFS.
                with driver_errors():
                    raise TierUnsupportedError(
                        "vm",
                        "growing a volume a VM holds",
                        f"it is a drive of {meta.holders[0].sandbox_id}; it grows only while no VM holds it",
                    )
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

    @contextlib.asynccontextmanager
    async def on_host(self, volume_id: str) -> AsyncIterator[Path]:
        """The volume's filesystem mounted on the host for the block, under the volume's lock (its
        content read or written without a sandbox: ``volume_content.py``). Mounted there already while
        a container or gVisor sandbox holds it (asleep too: a hibernated holder keeps its host mount);
        otherwise mounted for the block and unmounted ``linger_s`` after it (``_linger``), so that the
        calls of a burst pay one mount. A sandbox that takes the volume meanwhile uses that mount, and
        keeps it. A volume a VM holds is refused: that VM's kernel has it mounted."""
        async with self.store.lock(volume_id):
            meta = self._load(volume_id)
            if self.registry.runtime_label == VM_RUNTIME and meta.holders:
                with driver_errors():
                    raise TierUnsupportedError(
                        "vm",
                        "reading or writing a volume a VM holds",
                        f"it is a drive of {meta.holders[0].sandbox_id}, mounted by that VM's own kernel;"
                        " use that sandbox's files, or kill it first",
                    )
            linger = self._lingering.pop(volume_id, None)
            if linger is not None:
                linger.timer.cancel()  # this call takes the mount over
            root = self.store.mount_dir(volume_id)
            mounted = mounts.is_mountpoint(root)
            mounted_for_this = not mounted or (linger is not None and not meta.holders)
            if not mounted:
                with driver_errors():
                    await self.store.mount_on_host(volume_id)
            try:
                yield root
            finally:
                # Mounted for file calls: no holder needed it mounted (a holder's mount was there).
                if mounted_for_this and self.linger_s > 0:
                    self._linger(volume_id)
                elif mounted_for_this:
                    with driver_errors():
                        await self._unmount_on_host(volume_id)

    # -- attachments ----------------------------------------------------------------------------

    @staticmethod
    def _check_free(meta: VolumeMeta, body: VolumeMountBody) -> None:
        """One writer, or any number of readers (the control plane checked it too)."""
        writer = next((h for h in meta.holders if not h.read_only), None)
        if writer is not None or (meta.holders and not body.read_only):
            holder = writer or meta.holders[0]
            raise errors.InvalidState(
                f"volume {meta.id} is mounted read-write in {holder.sandbox_id}"
                if writer
                else f"volume {meta.id} is mounted read-only in {holder.sandbox_id}"
            )

    def _held_as_asked(self, meta: VolumeMeta, sandbox_id: str, body: VolumeMountBody) -> bool:
        """True when the sandbox holds the volume as asked (an attach again is a no-op); a 409 when it
        holds it otherwise."""
        mine = [h for h in meta.holders if h.sandbox_id == sandbox_id]
        if not mine:
            return False
        if mine[0].mount_path == body.mount_path and mine[0].read_only == body.read_only:
            return True
        raise errors.AlreadyExists(f"volume {meta.id} is already mounted at {mine[0].mount_path}")

    def _not_made_yet(self, sandbox_id: str) -> bool:
        registry = self.registry
        return (
            sandbox_id not in registry.entries
            and sandbox_id not in registry.stopped
            and sandbox_id not in registry.hibernated
        )

    async def attach(self, sandbox_id: str, body: VolumeMountBody) -> VolumeMountView:
        """Mounts the volume at ``mount_path`` in a running or paused sandbox; the same volume at the
        same path again is a no-op. On gVisor, a sandbox this host has not made yet gets the volume
        bound at its start (``reserve``); a running one is refused."""
        await self._expire_reservations()
        if _LIVE_REFUSED.get(self.registry.runtime_label) and self._not_made_yet(sandbox_id):
            return await self.reserve(sandbox_id, body)
        entry = self.registry.entry(sandbox_id)
        async with entry.lock, self.store.lock(body.volume_id):
            if self.registry.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            meta = self._load(body.volume_id)
            answer = VolumeMountView(volume_id=meta.id, mount_path=body.mount_path, read_only=body.read_only)
            if self._held_as_asked(meta, sandbox_id, body):
                return answer  # (on gVisor: bound at its start)
            self._refuse_live()
            self._check_free(meta, body)
            with driver_errors():
                pid = self.registry.runtime.mount_namespace_pid(entry.record)
                await self.store.mount_on_host(meta.id)
            reason = await place_in(
                pid, self.store.mount_dir(meta.id), body.mount_path, read_only=body.read_only
            )
            if reason is not None:
                if not meta.holders:
                    with contextlib.suppress(DriverError):
                        await self._unmount_on_host(meta.id)
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

    async def reserve(self, sandbox_id: str, body: VolumeMountBody) -> VolumeMountView:
        """A volume for a sandbox about to be made on a tier that binds host directories only at the
        start (gVisor): mounted on the host now, held by the sandbox's id, and bound into its container
        by ``at_start``. Not claimed by a create within ``RESERVATION_S``, it is let go."""
        async with self.store.lock(body.volume_id):
            meta = self._load(body.volume_id)
            answer = VolumeMountView(volume_id=meta.id, mount_path=body.mount_path, read_only=body.read_only)
            if self._held_as_asked(meta, sandbox_id, body):
                return answer
            self._check_free(meta, body)
            reservation = self.reserved.setdefault(sandbox_id, _Reservation(time.monotonic()))
            if self.registry.runtime_label == VM_RUNTIME:
                if not meta.holders:
                    # A VM destroyed with the volume mounted left its log to replay, which a reader's
                    # read-only drive cannot: replayed here (a mount and an unmount) while no VM holds it.
                    with driver_errors():
                        await self.store.mount_on_host(meta.id)
                        await self.store.unmount_on_host(meta.id)
                drive = VolumeDrive(self.store.image(meta.id), body.mount_path, body.read_only)
                reservation.drives.append(drive)
            else:
                with driver_errors():
                    await self.store.mount_on_host(meta.id)
                try:
                    source = (
                        await self._read_only_view(meta.id)
                        if body.read_only
                        else self.store.mount_dir(meta.id)
                    )
                except BaseException:
                    if not meta.holders:
                        with contextlib.suppress(DriverError):
                            await self._unmount_on_host(meta.id)
                    raise
                reservation.binds.append((source, body.mount_path))
            meta.holders.append(Holder(sandbox_id, body.mount_path, body.read_only))
            self.store.save(meta)
            self._note(meta)
        log.info(
            "volume_reserved",
            volume_id=meta.id,
            sandbox_id=sandbox_id,
            mount_path=body.mount_path,
            read_only=body.read_only,
        )
        return answer

    def at_start(self, sandbox_id: str, runtime_args: dict[str, Any]) -> None:
        """A create's ``runtime_args``: the volumes reserved for ``sandbox_id`` join the host
        directories its runtime binds at the start (``before_start``, after the S3 disks')."""
        reservation = self.reserved.get(sandbox_id)
        if reservation is None:
            return
        if reservation.drives:

            def volume_drives() -> list[VolumeDrive]:
                reservation.bound = True
                return list(reservation.drives)

            runtime_args["volume_drives"] = volume_drives
        if not reservation.binds:
            return
        inner = runtime_args.get("before_start")

        async def before_start(record: SandboxRecord) -> list[tuple[Path, str]]:
            binds = list(await inner(record)) if inner is not None else []
            reservation.bound = True
            return binds + list(reservation.binds)

        runtime_args["before_start"] = before_start

    async def started(self, sandbox_id: str) -> None:
        """After a create: its reservation is spent. A create whose boot bound no host directories (a
        boot from a snapshot) lets its reserved volumes go, so an attach after it is refused."""
        reservation = self.reserved.pop(sandbox_id, None)
        if reservation is not None and not reservation.bound:
            await self.release(sandbox_id)

    async def abandon(self, sandbox_id: str) -> None:
        """A create that failed: the volumes reserved for it go (none of another sandbox's)."""
        if sandbox_id in self.reserved and self._not_made_yet(sandbox_id):
            await self.release(sandbox_id)

    async def _expire_reservations(self) -> None:
        now = time.monotonic()
        for sandbox_id, reservation in list(self.reserved.items()):
            if now - reservation.at > RESERVATION_S and self._not_made_yet(sandbox_id):
                log.warning("volume_reservation_expired", sandbox_id=sandbox_id)
                await self.release(sandbox_id)

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
            self._refuse_live()  # bound at its start, it stays until the sandbox goes
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
                await self._unmount_on_host(meta.id)

    async def release(self, sandbox_id: str) -> None:
        """A destroyed sandbox's volumes (after the sandbox: its copies went with its namespace), or
        those reserved for a create that failed or never came."""
        self.reserved.pop(sandbox_id, None)
        for volume_id in sorted(self.held.get(sandbox_id, ())):
            async with self.store.lock(volume_id):
                try:
                    await self._drop_holder(self.store.load(volume_id), sandbox_id)
                except (errors.HostAgentServerError, VolumeMissingError) as exc:
                    log.warning("volume_release_failed", volume_id=volume_id, error=str(exc))
        self.held.pop(sandbox_id, None)

    def _stray_snapshot_copy(self, meta: VolumeMeta) -> bool:
        """A snapshot's copy of a volume whose snapshot is not whole on this host: an agent killed
        between the copy and the snapshot's disk (or a snapshot removed while the copy's delete did not
        reach it). Judged only while the disk store's snapshot directory is there to read."""
        if meta.snapshot_id is None or meta.holders:
            return False
        runtime = self.registry.runtime
        directory = getattr(runtime, "snapshots_dir", None)
        if not isinstance(directory, Path) or not directory.is_dir():
            return False
        return runtime.snapshot_info(meta.snapshot_id) is None

    async def start(self, live: set[str]) -> None:
        """At the agent's start: half-made volumes go; holders whose sandbox is not ``live`` any more
        are dropped; a volume still held stays mounted on the host, one held by nobody is unmounted
        (after a reboot there was nothing mounted; after a crash its loop may have stayed)."""
        self.store.remove_partial()
        for meta in self.store.all():
            if self._stray_snapshot_copy(meta):
                with contextlib.suppress(DriverError, OSError, VolumeBusyError):
                    await self.store.delete(meta.id)
                    log.info("snapshot_volume_copy_removed", volume_id=meta.id, snapshot_id=meta.snapshot_id)
                continue
            kept = [h for h in meta.holders if h.sandbox_id in live]
            if kept != meta.holders:
                meta.holders = kept
                self.store.save(meta)
            self._note(meta)
            try:
                if kept and self.registry.runtime_label == VM_RUNTIME:
                    pass  # a VM's drive: never mounted on the host
                elif kept:
                    await self.store.mount_on_host(meta.id)
                    # An agent killed in a snapshot's copy of the volume left it frozen (``_copy_image``).
                    await asyncio.to_thread(mounts.thaw_if_frozen, self.store.mount_dir(meta.id))
                else:
                    await self._unmount_on_host(meta.id)
            except DriverError as exc:
                log.warning("volume_start_failed", volume_id=meta.id, error=str(exc))
