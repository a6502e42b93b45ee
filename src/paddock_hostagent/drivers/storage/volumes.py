"""Local persistent volumes (issue #34, docs/volumes.md): an XFS filesystem in a sparse file, kept on
this host beside its disk store, that outlives every sandbox it is mounted into.

``<state>/volumes/<vol id>/`` holds ``volume.img`` (the filesystem), ``mnt/`` (where the host mounts
it while a sandbox uses it) and ``volume.json`` (its size and which sandboxes hold it, at which path,
read-only or not). A volume is made whole under ``.partial-<id>`` and renamed into place, so a half-made
one is never used and is removed when the store opens.

The loop device is an ordinary one (not write-through like a sandbox's root disk: a volume must outlive
a host crash, so its flushes reach the backing file), with direct I/O so the host's page cache does not
hold its blocks twice. The host mount exists while at least one sandbox holds the volume; the mount in
each sandbox is a clone of it (``volmount.py``), so a destroyed sandbox drops only its own copy, and the
filesystem is unmounted, its loop freed, when the last holder goes.

The host never resolves a path inside a sandbox here: its paths are all under the agent's state
directory, built from ids the internal API's schema holds to ``VOLUME_ID_PATTERN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paddock_hostagent.drivers.base import CapacityError, CommandFailedError, DriverError
from paddock_hostagent.drivers.storage import loops, mounts, rootdisks
from paddock_hostagent.drivers.system.commands import run

MIB = 1 << 20
PARTIAL_PREFIX = ".partial-"
VOLUME_ID = re.compile(r"^vol_[A-Za-z0-9]{1,36}$")
#: A fork's copy of a volume (``clone``) has its source's XFS UUID, which XFS refuses to mount twice.
MOUNT_OPTIONS = "nouuid"


class VolumeMissingError(DriverError):
    """No volume of that id on this host."""


class VolumeBusyError(DriverError):
    """The volume is mounted in a sandbox (a delete), or its mount path is taken (an attach)."""


@dataclass
class Holder:
    """A sandbox holding the volume: where it is mounted there, and how."""

    sandbox_id: str
    mount_path: str
    read_only: bool


@dataclass
class VolumeMeta:
    id: str
    size_mib: int
    holders: list[Holder] = field(default_factory=list)
    #: A snapshot's copy (``include_volumes``): the snapshot it belongs to; nothing mounts it.
    snapshot_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VolumeMeta:
        return cls(
            id=str(data["id"]),
            size_mib=int(data["size_mib"]),
            holders=[Holder(**holder) for holder in data.get("holders", [])],
            snapshot_id=str(data["snapshot_id"]) if data.get("snapshot_id") else None,
        )


class VolumeStore:
    """The volumes on this host: made, grown, mounted on the host for their holders, and removed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, volume_id: str) -> asyncio.Lock:
        return self._locks.setdefault(volume_id, asyncio.Lock())

    # -- paths --------------------------------------------------------------------------------

    def _dir(self, volume_id: str) -> Path:
        if not VOLUME_ID.match(volume_id):
            raise VolumeMissingError(f"no volume {volume_id!r}")
        return self.directory / volume_id

    def image(self, volume_id: str) -> Path:
        return self._dir(volume_id) / "volume.img"

    def mount_dir(self, volume_id: str) -> Path:
        return self._dir(volume_id) / "mnt"

    def _meta_path(self, volume_id: str) -> Path:
        return self._dir(volume_id) / "volume.json"

    # -- records ------------------------------------------------------------------------------

    def exists(self, volume_id: str) -> bool:
        return self._meta_path(volume_id).is_file()

    def load(self, volume_id: str) -> VolumeMeta:
        try:
            data = json.loads(self._meta_path(volume_id).read_text())
        except FileNotFoundError:
            raise VolumeMissingError(f"no volume {volume_id} on this host") from None
        return VolumeMeta.from_json(data)

    def save(self, meta: VolumeMeta) -> None:
        """Temp file + rename + fsync of the directory: what a crash leaves is the old or the new."""
        path = self._meta_path(meta.id)
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "w") as out:
            json.dump(meta.to_json(), out)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
        _fsync_dir(path.parent)

    def all(self) -> list[VolumeMeta]:
        if not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.glob("vol_*/volume.json")):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found.append(VolumeMeta.from_json(json.loads(path.read_text())))
        return found

    def remove_partial(self) -> None:
        """Volumes an agent died making: never whole, never mounted; removed at start."""
        if self.directory.is_dir():
            for partial in self.directory.glob(f"{PARTIAL_PREFIX}*"):
                shutil.rmtree(partial, ignore_errors=True)

    # -- make, grow, remove -------------------------------------------------------------------

    async def create(self, volume_id: str, size_mib: int) -> VolumeMeta:
        """A sparse file of ``size_mib`` with a fresh XFS on it (its own UUID). The same id again answers
        the volume that is there (a retried call)."""
        final = self._dir(volume_id)
        if self.exists(volume_id):
            return self.load(volume_id)
        if shutil.which("mkfs.xfs") is None:
            raise DriverError("volumes need mkfs.xfs on the host")
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        stats = os.statvfs(self.directory)
        free_mib = stats.f_bavail * stats.f_frsize // MIB
        if size_mib > free_mib:  # sparse, but a volume that can never be filled whole is refused
            raise CapacityError(f"a volume of {size_mib} MiB does not fit: this host has {free_mib} MiB free")
        partial = self.directory / f"{PARTIAL_PREFIX}{volume_id}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        try:
            image = partial / "volume.img"
            with open(image, "wb") as out:
                out.truncate(size_mib * MIB)
            # 4 KiB sectors: the loop device has direct I/O, so it takes the logical sector size of
            # what holds the file (4 KiB on a 4Kn disk, or in an XFS on a direct-I/O loop such as the
            # disk store), and an XFS made with 512-byte sectors does not mount on that; 4 KiB mounts
            # on either.
            await run(["mkfs.xfs", "-q", "-f", "-s", "size=4096", "-L", "pdk-volume", str(image)])
            (partial / "mnt").mkdir(mode=0o755)
            meta = VolumeMeta(id=volume_id, size_mib=size_mib)
            (partial / "volume.json").write_text(json.dumps(meta.to_json()))
            await asyncio.to_thread(_fsync_file, image)
            partial.replace(final)
            _fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return meta

    async def clone(
        self, source_id: str, target_id: str, *, snapshot_id: str | None = None
    ) -> tuple[VolumeMeta, bool]:
        """A new volume ``target_id`` holding ``source_id``'s filesystem as it is at this instant (a
        fork's or a snapshot's ``include_volumes``, a boot from such a snapshot; ``snapshot_id`` marks
        a snapshot's own copy), and whether its file shares the source's blocks (``FICLONE``,
        constant time) rather than being a copy of its data (a state filesystem without reflink).

        While a sandbox holds the source, its host mount is frozen (``FIFREEZE``: writers wait, and
        the log is written home, so the copy mounts clean) for the copy only. Made under
        ``.partial-`` and renamed into place, as a new volume is; the same id again answers the one
        that is there (a retried call). Mounted later, the copy carries the source's XFS UUID: the
        host mounts volumes ``nouuid``."""
        if self.exists(target_id):
            return self.load(target_id), True
        source = self.load(source_id)
        image = self.image(source_id)
        partial = self.directory / f"{PARTIAL_PREFIX}{target_id}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        try:
            point = self.mount_dir(source_id)
            frozen = point if mounts.is_mountpoint(point) else None
            shared = await asyncio.to_thread(
                _copy_image, image, partial / "volume.img", frozen, self.directory
            )
            (partial / "mnt").mkdir(mode=0o755)
            meta = VolumeMeta(id=target_id, size_mib=source.size_mib, snapshot_id=snapshot_id)
            (partial / "volume.json").write_text(json.dumps(meta.to_json()))
            await asyncio.to_thread(_fsync_file, partial / "volume.img")
            partial.replace(self._dir(target_id))
            _fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return meta, shared

    async def grow(self, meta: VolumeMeta, size_mib: int) -> None:
        """Grows the file and the filesystem (mounted on the host for it, if no sandbox holds it)."""
        if size_mib <= meta.size_mib:
            return
        stats = os.statvfs(self.directory)
        free_mib = stats.f_bavail * stats.f_frsize // MIB
        if size_mib - meta.size_mib > free_mib:
            raise CapacityError(
                f"growing by {size_mib - meta.size_mib} MiB does not fit: {free_mib} MiB free"
            )
        was_mounted = mounts.is_mountpoint(self.mount_dir(meta.id))
        device = await self.mount_on_host(meta.id)
        try:
            with open(self.image(meta.id), "r+b") as image:
                image.truncate(size_mib * MIB)
            loops.refresh_capacity(device)
            await run(["xfs_growfs", str(self.mount_dir(meta.id))])
            # As a root disk's growth: the new superblock written home, not left to the log (rootdisks.grow).
            await asyncio.to_thread(_write_superblock_home, self.mount_dir(meta.id))
        finally:
            if not was_mounted:
                await self.unmount_on_host(meta.id)
        meta.size_mib = size_mib
        self.save(meta)

    async def delete(self, volume_id: str) -> bool:
        """Removes the volume; one held by a sandbox is refused (``VolumeBusyError``). False: none."""
        try:
            meta = self.load(volume_id)
        except VolumeMissingError:
            shutil.rmtree(self._dir(volume_id), ignore_errors=True)
            return False
        if meta.holders:
            held = ", ".join(sorted({holder.sandbox_id for holder in meta.holders}))
            raise VolumeBusyError(f"volume {volume_id} is mounted in {held}")
        await self.unmount_on_host(volume_id)
        shutil.rmtree(self._dir(volume_id))
        _fsync_dir(self.directory)
        return True

    def used_bytes(self, volume_id: str) -> int:
        """Host disk the sparse image occupies now."""
        try:
            return os.stat(self.image(volume_id)).st_blocks * 512
        except OSError:
            return 0

    # -- the host mount -----------------------------------------------------------------------

    def device_of(self, volume_id: str) -> str | None:
        """The loop device the image is on, if any (an agent before this one may have attached it)."""
        image = str(self.image(volume_id))
        for device, backing in _attached_loops().items():
            if backing == image:
                return device
        return None

    async def mount_on_host(self, volume_id: str) -> str:
        """Mounts the volume at its ``mnt`` (unless it is mounted there); returns its loop device."""
        point = self.mount_dir(volume_id)
        point.mkdir(exist_ok=True, mode=0o755)
        device = self.device_of(volume_id)
        if device is not None and mounts.is_mountpoint(point):
            return device
        if device is None:
            device = await loops.attach(self.image(volume_id), direct_io=True)
        try:
            await asyncio.to_thread(
                mounts.mount, device, point, "xfs", MOUNT_OPTIONS, mounts.MS_NOSUID | mounts.MS_NODEV
            )
        except CommandFailedError:
            if self.device_of(volume_id) is None:  # a loop freed itself meanwhile (autoclear): once more
                device = await loops.attach(self.image(volume_id), direct_io=True)
                await asyncio.to_thread(
                    mounts.mount, device, point, "xfs", MOUNT_OPTIONS, mounts.MS_NOSUID | mounts.MS_NODEV
                )
            else:
                raise
        return device

    async def unmount_on_host(self, volume_id: str) -> None:
        """Unmounts the host's mount and frees the loop device. A sandbox that still holds a copy keeps
        the filesystem alive; the kernel frees the loop once that copy goes too (autoclear)."""
        point = self.mount_dir(volume_id)
        await asyncio.to_thread(mounts.thaw_if_frozen, point)
        await asyncio.to_thread(mounts.unmount, point)
        device = self.device_of(volume_id)
        if device is not None:
            with contextlib.suppress(DriverError):
                await loops.detach(device)


def device_number(device: str) -> str:
    """``MAJOR:MINOR`` of a block device, as ``/proc/<pid>/mountinfo`` writes it."""
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


async def place_in(ns_pid: int, source: Path, mount_path: str, *, read_only: bool) -> str | None:
    """Clones the host mount ``source`` into the sandbox's mount namespace at ``mount_path``
    (``volmount.py``, a process of its own: setns needs one thread); the reason when it fails."""
    code, output = await _helper("move", str(ns_pid), str(source), mount_path, "ro" if read_only else "rw")
    return None if code == 0 else output.strip().removeprefix("volmount: ") or f"exit {code}"


async def remove_from(ns_pid: int, device: str) -> str | None:
    """Removes every mount of the volume on ``device`` from the sandbox's namespace (wherever the
    sandbox moved it); the reason when it fails."""
    code, output = await _helper("umount", str(ns_pid), device_number(device))
    return None if code == 0 else output.strip().removeprefix("volmount: ") or f"exit {code}"


async def _helper(*argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "paddock_hostagent.drivers.storage.volmount",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(20):
            out, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        return 1, "the mount helper did not finish within 20 s"
    return int(process.returncode or 0), out.decode(errors="replace")[-2000:]


def _attached_loops() -> dict[str, str]:
    found = {}
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            found[f"/dev/{backing.parent.parent.name}"] = (
                backing.read_text().strip().removesuffix(" (deleted)")
            )
    return found


def _copy_image(source: Path, target: Path, frozen: Path | None, directory: Path) -> bool:
    """``target`` becomes a copy of the image ``source``, the filesystem mounted at ``frozen`` (if any)
    frozen meanwhile; True when the copy shares its blocks (``FICLONE``), False when the state
    filesystem cannot clone and the data was copied (holes kept), which must then fit."""
    if frozen is not None:
        mounts.freeze_filesystem(frozen)
    try:
        try:
            rootdisks.clone_file(source, target)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                raise
        stats = os.statvfs(directory)
        free = stats.f_bavail * stats.f_frsize
        needed = os.stat(source).st_blocks * 512
        if needed > free:
            raise CapacityError(f"copying the volume needs {needed // MIB} MiB; {free // MIB} MiB free")
        rootdisks.copy_sparse(source, target)
        return False
    finally:
        if frozen is not None:
            mounts.thaw_filesystem(frozen)


def _write_superblock_home(mount_dir: Path) -> None:
    mounts.freeze_filesystem(mount_dir)
    mounts.thaw_filesystem(mount_dir)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
