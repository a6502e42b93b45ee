"""A sandbox's writable disk: a sparse image file on a loop device, mounted on the host, holding the
overlay's upper and work directories.

The filesystem is ext4 where the agent may grow it online (``resize2fs`` needs CAP_SYS_RESOURCE for a
mounted filesystem) and XFS otherwise (``xfs_growfs`` needs only CAP_SYS_ADMIN). ``choose_filesystem``
decides once at start-up; each disk records its own type, so a later change of choice leaves existing
sandboxes working.

**The disk store.** Disk images live where a fork can *clone* them (``FICLONE``: the copy shares every
block with its source, and a block is copied only when one side later writes it), so a fork's cost does
not depend on how much its source holds. Where the state directory's own filesystem clones (XFS with
reflink, btrfs) the images sit in ``<state>/disks`` on it; otherwise (ext4, as on the dev box) the
agent makes a sparse XFS filesystem with reflink in ``<state>/disks.xfs``, the size of the host
filesystem, on a loop device with direct I/O (so the host's page cache does not hold the same data a
second time) and mounts it at ``<state>/disks`` (``open_store``). Sharing is the filesystem's own
reference counting: destroying a source leaves its forks' blocks alone. The store's mount and loop
outlive an agent restart, and each image's path is in its slot's record; an agent that stops with no
image left takes the store down (``close_store``). Without ``mkfs.xfs`` images stay in their slot's
directory and a fork copies (sparse-aware), as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import CommandFailedError, DriverError, UnsupportedError
from paddock_hostagent.drivers.storage import loops, mounts, writeback, xfsreadahead
from paddock_hostagent.drivers.system.commands import run

log = get_logger(__name__)
Filesystem = Literal["ext4", "xfs"]
_CAP_SYS_RESOURCE = 24
MIB = 1 << 20
FICLONE = 0x40049409
# Errors meaning "these two files cannot share blocks": fall back to copying.
_NO_CLONE = {errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EPERM}
#: A source whose XFS log holds more than this to replay (basic blocks: 4 MiB) is frozen (``FIFREEZE``)
#: for its clone. XFS moves a log's tail when its log worker runs (each second on an agent's host,
#: ``host.hurry_xfs_log_worker``; the kernel's default is 30 s), so the clone's mount replays all the
#: source logged since: measured on this box, 633 / 3,224 / 12,933 blocks (1,000 / 5,000 / 20,000 new
#: files) made the mount take 24 / 47 / 140 ms, against 8 ms for a clean log. A freeze writes the
#: logged metadata home and covers the log, so the clone mounts clean; it costs 56-68 ms whatever the
#: backlog, so it pays from about 6,000 blocks on. The source's tasks are already frozen (its cgroup)
#: and the freeze lasts only the clone.
QUIESCE_REPLAY_BB = 8192
#: How much more log (basic blocks: 8 KiB) a clone may replay than its source holds unwritten before
#: the source first writes a record with its current tail (``mounts.write_log_tail``): a covered
#: log's last record names the record before it, 2-4 blocks back.
DEVICE_TAIL_SLACK_BB = 16


def has_capability(bit: int) -> bool:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def choose_filesystem(preference: str = "auto") -> Filesystem:
    if preference in ("ext4", "xfs"):
        return preference  # type: ignore[return-value]
    if has_capability(_CAP_SYS_RESOURCE) or shutil.which("mkfs.xfs") is None:
        return "ext4"
    return "xfs"


def can_grow_online(fs: Filesystem) -> bool:
    return fs == "xfs" or has_capability(_CAP_SYS_RESOURCE)


class DiskNotCleanError(DriverError):
    """A fork's copy of its source's disk is not a clean filesystem: its mount failed as a corrupt one
    would, or it mounted with another geometry than its source's. Nothing was booted from it."""


# What a mount answers for a filesystem whose structures are damaged (EFSCORRUPTED, EFSBADCRC).
_NOT_CLEAN = {errno.EUCLEAN, errno.EBADMSG}


@dataclass
class Disk:
    image_path: Path
    mount_dir: Path
    fs: Filesystem
    loop_device: str = ""

    @property
    def upper_dir(self) -> Path:
        return self.mount_dir / "upper"

    @property
    def work_dir(self) -> Path:
        return self.mount_dir / "work"

    @property
    def guest_binary(self) -> Path:
        """The guest agent's copy on this disk, outside the overlay's layers (the sandbox cannot
        reach it except through its read-only bind mount)."""
        return self.mount_dir / "paddock-guest"

    def size_mib(self) -> int:
        return os.stat(self.image_path).st_size // MIB


async def format_image(image_path: Path, size_mib: int, fs: Filesystem) -> None:
    """Creates a sparse image of ``size_mib`` and a filesystem on it (data blocks stay holes)."""
    image_path.parent.mkdir(parents=True, exist_ok=True)
    with open(image_path, "wb") as image:
        image.truncate(size_mib * MIB)
    if fs == "xfs":
        await run(["mkfs.xfs", "-q", "-f", "-L", "paddock", str(image_path)])
    else:
        await run(["mkfs.ext4", "-q", "-F", "-m", "0", "-J", "size=16", "-L", "paddock", str(image_path)])


async def format_from_blank(image_path: Path, size_mib: int, fs: Filesystem, store: Path) -> None:
    """A new empty disk as a clone of a blank image formatted once per size and filesystem in the
    ``store`` (``.blank-<fs>-<size>``): ~1 ms, where ``mkfs`` costs ~30-60 ms of CPU per disk and a
    warm pool refilling during a burst of creates competes with them for it. Clones of the blank share
    its UUID, as forks share their source's (XFS disks mount with ``nouuid``). The blank is made in a
    thread-safe way (a temporary name renamed into place), and a failed clone falls back to ``mkfs``."""
    blank = store / f".blank-{fs}-{size_mib}"
    if not blank.exists():
        partial = store / f".blank-{fs}-{size_mib}.{os.getpid()}.{id(image_path)}.partial"
        try:
            await format_image(partial, size_mib, fs)
            partial.replace(blank)
        finally:
            partial.unlink(missing_ok=True)
    try:
        await asyncio.to_thread(clone_file, blank, image_path)
    except OSError as exc:
        if exc.errno not in _NO_CLONE:
            raise DriverError(f"cloning a blank disk: {exc}") from exc
        image_path.unlink(missing_ok=True)
        await format_image(image_path, size_mib, fs)


async def attach(disk: Disk) -> None:
    """Puts the image on a free loop device (unless it is on one) and mounts it at ``disk.mount_dir``.

    The blocking steps run in a thread: declaring a device write-through waits for its queue to freeze
    (~14 ms, an RCU grace period) and mounting an XFS disk reads its metadata (~10 ms, more with a
    journal to replay), time in which the event loop keeps serving other creates, forks and commands."""
    if not disk.loop_device:
        disk.loop_device = await loops.attach(disk.image_path)
        await asyncio.to_thread(loops.write_through, disk.loop_device)
    await asyncio.to_thread(_mount_disk, disk)


def _mount_disk(disk: Disk) -> None:
    disk.mount_dir.mkdir(parents=True, exist_ok=True)
    if not mounts.is_mountpoint(disk.mount_dir):
        # nouuid: a fork's copy carries its source's filesystem UUID, which XFS would refuse.
        mounts.mount(disk.loop_device, disk.mount_dir, disk.fs, "nouuid" if disk.fs == "xfs" else "")
    disk.upper_dir.mkdir(exist_ok=True)
    disk.work_dir.mkdir(exist_ok=True)


def install_guest(disk: Disk, binary: Path) -> Path:
    """Copies the guest agent onto the sandbox's own disk unless the copy there is already this one.

    A bind mount's source shows in the sandbox's ``/proc/self/mountinfo`` as its path inside the
    source filesystem: bound from the host's filesystem it would show the agent's state directory,
    bound from this disk it shows ``/paddock-guest``. Cost: ~0.8 MB per disk, copied when the warm
    pool builds the slot (a fork's copied disk already holds it)."""
    target = disk.guest_binary
    if not guest_is_current(disk, binary):
        tmp = disk.mount_dir / ".paddock-guest.tmp"
        shutil.copy2(binary, tmp)
        tmp.replace(target)
    return target


def guest_is_current(disk: Disk, binary: Path) -> bool:
    """Whether the disk's copy of the guest agent is ``binary`` (same size and mtime): two ``stat``
    calls, cheap enough for the event loop, where ``install_guest`` may copy and belongs in a thread."""
    source_stat = os.stat(binary)
    try:
        target_stat = os.stat(disk.guest_binary)
    except FileNotFoundError:
        return False
    return target_stat.st_size == source_stat.st_size and target_stat.st_mtime_ns == source_stat.st_mtime_ns


async def detach(disk: Disk) -> None:
    """Unmounts and frees the loop device; each step tolerates having been done already."""
    mounts.thaw_if_frozen(disk.mount_dir)
    mounts.unmount(disk.mount_dir)
    # The recorded device, or (for a slot whose record was never written) whatever backs onto the file.
    devices = [disk.loop_device] if disk.loop_device else loops_backing(disk.image_path)
    for device in devices:
        if _loop_backs(device, disk.image_path):
            with contextlib.suppress(DriverError):
                await loops.detach(device)
    disk.loop_device = ""


async def grow(disk: Disk, size_mib: int) -> None:
    """Grows the file, tells the loop device, then the mounted filesystem. Grow only."""
    if size_mib <= disk.size_mib():
        return
    if not can_grow_online(disk.fs):
        raise UnsupportedError(
            "growing a mounted ext4 disk needs CAP_SYS_RESOURCE, which this host agent lacks"
        )
    with open(disk.image_path, "r+b") as image:
        image.truncate(size_mib * MIB)
    loops.refresh_capacity(disk.loop_device)
    if disk.fs == "xfs":
        await run(["xfs_growfs", str(disk.mount_dir)])
        # The grown superblock is only logged: the image keeps the old size in its primary superblock
        # until the log moves on, and a copy taken meanwhile (a fork's clone) must replay the growth.
        # This kernel cannot: the log's checkpoint holds buffers of the new allocation groups before
        # the superblock that adds them, so recovery reads them against the old size and fails
        # (EFSCORRUPTED, "Structure needs cleaning"). A freeze writes the superblock home and covers
        # the log (~50-70 ms, once per resize).
        await asyncio.to_thread(_write_superblock_home, disk.mount_dir)
    else:
        await run(["resize2fs", disk.loop_device])


def _write_superblock_home(mount_dir: Path) -> None:
    mounts.freeze_filesystem(mount_dir)
    mounts.thaw_filesystem(mount_dir)


async def clone_disk(
    source: Disk,
    disk: Disk,
    *,
    release: Callable[[], None] = lambda: None,
    step: Callable[[str], None] = lambda _name: None,
    meanwhile: Callable[[], None] = lambda: None,
) -> None:
    """Makes ``disk``'s image a copy of ``source``'s, whose filesystem is mounted and whose writers are
    stopped (the sandbox is frozen), and mounts it at ``disk.mount_dir``. ``release`` is called as soon
    as the copy is made (the fork lets its source run again there), also when this fails; ``step`` with
    the name of each step as it ends (``sync``, ``clone``, ``loop``, ``mount``), for the fork's phases;
    ``meanwhile`` once, on the event loop, while the first of that work runs in its thread (before it
    where there is no disk to reuse).

    Where the store clones: ``syncfs`` of the source's filesystem, then ``FICLONE``. The sync writes
    back what the filesystem holds dirty, data and journal; the clone writes back what of that the
    image file holds dirty and shares the file's blocks. The copy is the image a crash at that instant
    would leave, holding every write made before; the fork's mount replays its journal. No
    ``FIFREEZE``: freezing a filesystem waits for RCU grace periods (25-45 ms on the dev box, whatever
    the filesystem holds), and nothing writes to the source while it is frozen in its cgroup.
    Elsewhere a sparse-aware copy, under ``FIFREEZE``, since a copy takes long enough for the
    filesystem's own background writes to tear it. Right after the clone, the blocks an XFS mount of
    it will read are read ahead (``xfsreadahead``).

    ``disk`` may still be mounted and on its loop device (a warm slot's empty disk): it is unmounted
    in a thread while the source syncs (~2-10 ms: its log is written), the two filesystems being
    unrelated. A slot the pool readied for a fork (``WarmPool``) is not mounted, and then the whole
    of it, sync to mount, runs in one thread: each hand-over between the event loop and a thread cost
    ~1-3 ms on a loaded host."""
    disk.image_path.parent.mkdir(parents=True, exist_ok=True)
    released = False

    def release_once() -> None:
        nonlocal released
        if not released:
            released = True
            release()

    loop = asyncio.get_running_loop()
    mounted = mounts.is_mountpoint(disk.mount_dir)
    try:
        if not mounted and disk.loop_device:
            # run_in_executor submits at once (the thread starts), then ``meanwhile`` runs here.
            work = loop.run_in_executor(None, _clone_and_mount, source, disk, release_once, step)
            await _while_running(meanwhile, work)
            if await work:
                return
        elif mounted:
            unmounting = loop.run_in_executor(None, mounts.unmount, disk.mount_dir)
            syncing = loop.run_in_executor(None, writeback.sync_copied, source.mount_dir, source.image_path)
            await _while_running(meanwhile, unmounting, syncing)
            await asyncio.gather(unmounting, syncing)
            step("sync")
        else:  # a slot built without a disk
            meanwhile()
            await asyncio.to_thread(writeback.sync_copied, source.mount_dir, source.image_path)
            step("sync")
        shape = await _replace_image(source, disk, step)
        step("clone")
    finally:
        release_once()
    forget_old_image(disk)
    step("loop")
    if not disk.loop_device:
        disk.loop_device = await loops.attach(disk.image_path)
        await asyncio.to_thread(loops.write_through, disk.loop_device)
    await asyncio.to_thread(_mount_copy, source, disk, shape)
    step("mount")


async def _while_running(work: Callable[[], None], *running: asyncio.Future[Any]) -> None:
    """Runs ``work`` while ``running`` go on in threads; if it fails, lets them end before raising
    (the caller then undoes what they made)."""
    try:
        work()
    except BaseException:
        await asyncio.wait(running)
        raise


def _clone_and_mount(
    source: Disk, disk: Disk, release: Callable[[], None], step: Callable[[str], None]
) -> bool:
    """``clone_disk`` in one thread, for a disk whose loop device is free: sync, clone, release, mount.
    False (nothing done but the sync) when something still holds the device or the store cannot clone:
    ``clone_disk`` then takes the long way."""
    writeback.sync_copied(source.mount_dir, source.image_path)
    step("sync")
    if not _device_free(disk.loop_device):
        return False
    try:
        shape = _clone_for_mount(source, disk.image_path, step)
    except OSError:
        return False
    step("clone")
    release()
    forget_old_image(disk)
    step("loop")
    _mount_copy(source, disk, shape)
    step("mount")
    return True


async def _replace_image(
    source: Disk, disk: Disk, step: Callable[[str], None]
) -> xfsreadahead.XfsGeometry | None:
    """The clone (or copy) of ``clone_disk`` where the disk's loop device may be held or there is none;
    the source's XFS geometry, when known."""
    target = disk.image_path
    if disk.loop_device and not await _released(disk.loop_device):
        # Another mount namespace still holds the slot's old filesystem: a container that started
        # while it was mounted copied the host's mounts and has not dropped them yet. Its superblock
        # would be found again by the fork's mount (the fork would see the empty disk), and its last
        # writes would land in the clone. The clone gets a file and a loop device of its own; the old
        # device lets go of the old file when that namespace does.
        await loops.detach(disk.loop_device)
        disk.loop_device = ""
        target.unlink(missing_ok=True)
    try:
        return await asyncio.to_thread(_clone_for_mount, source, target, step)
    except OSError:  # the files cannot share blocks here
        mounts.freeze_filesystem(source.mount_dir)
        try:
            await run(["cp", "--sparse=always", "--reflink=auto", str(source.image_path), str(target)])
        finally:
            mounts.thaw_filesystem(source.mount_dir)
        return xfsreadahead.geometry(source.mount_dir) if source.fs == "xfs" else None


def _clone_for_mount(
    source: Disk, target: Path, step: Callable[[str], None]
) -> xfsreadahead.XfsGeometry | None:
    """Clones ``source``'s image to ``target`` and starts reading what a mount of it will read; returns
    the source's XFS geometry (None for ext4). OSError when the two files cannot share blocks;
    DriverError for any other failure. A source with a long log to replay is frozen for the clone
    (``QUIESCE_REPLAY_BB``), as is one whose grown superblock is not yet written home; the freeze
    covers its log. Any other XFS source whose device names an older tail than the one in memory
    (``_device_tail_lags``) first writes a log record that carries its log's tail as it is now
    (``mounts.write_log_tail``), so that the clone replays only what the source has not yet written
    home, not all it logged since its last record."""
    shape = xfsreadahead.geometry(source.mount_dir) if source.fs == "xfs" else None
    log = xfsreadahead.log_position(source.loop_device) if shape is not None and source.loop_device else None
    quiesce = shape is not None and (
        (log is not None and xfsreadahead.replay_backlog(shape, log) > QUIESCE_REPLAY_BB)
        # Grown, and the grown superblock not yet home (a disk grown by an agent before ``grow``
        # wrote it home): a clone would have to replay the growth, which fails (see ``grow``). Told
        # before any log record of ours, which would write that superblock home but leave the growth
        # in the log.
        or xfsreadahead.superblock_blocks(source.image_path) != shape.data_blocks
    )
    if quiesce:
        with writeback.lifted():  # the freeze's writes are the source's, as its sync's
            mounts.freeze_filesystem(source.mount_dir)
        step("quiesce")
        log = xfsreadahead.log_position(source.loop_device)  # the freeze moved the tail up to the head
    elif (
        shape is not None
        and _device_tail_lags(source.image_path, shape, log)
        and mounts.write_log_tail(source.mount_dir)
        and source.loop_device
    ):
        log = xfsreadahead.log_position(source.loop_device)  # the head, past that record
    try:
        reads = xfsreadahead.mount_reads(shape, log) if shape is not None and log is not None else []
        clone_file(source.image_path, target)
    except OSError as exc:
        if exc.errno not in _NO_CLONE:
            raise DriverError(f"cloning {source.image_path.name}: {exc}") from exc
        raise
    finally:
        if quiesce:
            mounts.thaw_filesystem(source.mount_dir)
    if reads:
        xfsreadahead.read_ahead(target, reads)
    return shape


def _device_tail_lags(
    image: Path, shape: xfsreadahead.XfsGeometry, log: xfsreadahead.LogPosition | None
) -> bool:
    """Whether a copy of ``image`` taken now would replay more than ``DEVICE_TAIL_SLACK_BB`` of log
    beyond what the filesystem still holds unwritten: the last record on the device names an older
    tail than the one in memory (or that cannot be told). A source whose log its worker has covered
    (idle a few seconds) does not lag, and its fork skips the record (~1 ms)."""
    if log is None:
        return True
    device_tail = xfsreadahead.device_log_tail(image, shape, log)
    if device_tail is None:
        return True
    on_device = xfsreadahead.replay_backlog(shape, dataclasses.replace(log, tail=device_tail))
    return on_device > xfsreadahead.replay_backlog(shape, log) + DEVICE_TAIL_SLACK_BB


def _mount_copy(source: Disk, disk: Disk, shape: xfsreadahead.XfsGeometry | None) -> None:
    """Mounts a fork's copy of ``source``'s disk and checks, before anything boots from it, that it is
    a clean filesystem: a mount that fails as a damaged one does (its log cannot be replayed, a
    checksum fails), or a copy whose size or allocation groups differ from its source's, is
    ``DiskNotCleanError``; the copy is left unmounted then (the caller removes it)."""
    try:
        _mount_disk(disk)
    except CommandFailedError as exc:
        if exc.returncode in _NOT_CLEAN:
            raise DiskNotCleanError(
                f"the fork's copy of the disk of its source is not a clean filesystem ({exc}); "
                "nothing was booted from it and the source is unchanged"
            ) from exc
        raise
    if shape is None:
        return
    copy = xfsreadahead.geometry(disk.mount_dir)
    if copy is None or (copy.data_blocks, copy.ag_count) != (shape.data_blocks, shape.ag_count):
        mounts.unmount(disk.mount_dir)
        raise DiskNotCleanError(
            f"the fork's copy of the disk of its source mounted as another filesystem ({copy} where "
            f"its source is {shape}); nothing was booted from it and the source is unchanged"
        )


def _device_free(device: str) -> bool:
    """Whether nothing holds ``device`` (no filesystem on it in any mount namespace: an exclusive open
    succeeds)."""
    try:
        os.close(os.open(device, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC))
        return True
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise DriverError(f"opening {device}: {exc}") from exc
        return False


async def _released(device: str, wait_s: float = 0.05) -> bool:
    """Whether ``device`` is free (``_device_free``), waiting up to ``wait_s`` for it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while not _device_free(device):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def forget_old_image(disk: Disk) -> None:
    """After the clone: a loop device that stayed attached is told the new size and forgets what it
    cached of the old image (a fork reuses its warm slot's device instead of binding a new one:
    declaring a device write-through alone costs ~14 ms, it freezes the device's queue). Not needed
    while the source is frozen, so it is done after letting the source run again."""
    if disk.loop_device:
        if loops.size_bytes(disk.loop_device) != os.stat(disk.image_path).st_size:
            loops.refresh_capacity(disk.loop_device)
        loops.drop_cache(disk.loop_device)


# -- snapshots ------------------------------------------------------------------------------------


def snapshot_image(source: Disk, target: Path) -> None:
    """``target`` becomes a copy of ``source``'s image as it is now (its writers stopped: the sandbox
    is frozen in its cgroup), the way a fork copies it: ``syncfs``, then a clone sharing every block
    (frozen for it only when its log has a long backlog, ``_clone_for_mount``), or where the store
    cannot clone a sparse copy under ``FIFREEZE``; the copy is written to disk (``fsync``) before this
    returns. Blocking: run it in a thread."""
    writeback.sync_copied(source.mount_dir, source.image_path)
    try:
        _clone_for_mount(source, target, lambda _name: None)
    except OSError:
        target.unlink(missing_ok=True)
        mounts.freeze_filesystem(source.mount_dir)
        try:
            copy_sparse(source.image_path, target)
        finally:
            mounts.thaw_filesystem(source.mount_dir)
    fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_sparse(source: Path, target: Path) -> None:
    """A copy of ``source`` that keeps its holes (``SEEK_DATA``/``SEEK_HOLE``): where the store cannot
    clone (a disk's, a snapshot's, a volume's image)."""
    size = os.stat(source).st_size
    with open(source, "rb") as reader, open(target, "wb") as writer:
        writer.truncate(size)
        offset = 0
        while offset < size:
            try:
                start = os.lseek(reader.fileno(), offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            end = os.lseek(reader.fileno(), start, os.SEEK_HOLE)
            reader.seek(start)
            writer.seek(start)
            left = end - start
            while left:
                chunk = reader.read(min(left, 8 * MIB))
                if not chunk:
                    break
                writer.write(chunk)
                left -= len(chunk)
            offset = end


async def restore_disk(image: Path, disk: Disk) -> None:
    """Makes ``disk``'s image a clone of the snapshot ``image`` (a copy where the store cannot clone) and
    mounts it at ``disk.mount_dir``, as a fork's copy is; ``disk`` is a slot's (its empty disk may
    still be mounted). A copy that does not mount as a clean filesystem is ``DiskNotCleanError``."""
    disk.image_path.parent.mkdir(parents=True, exist_ok=True)
    if mounts.is_mountpoint(disk.mount_dir):
        await asyncio.to_thread(mounts.unmount, disk.mount_dir)
    if disk.loop_device and not await _released(disk.loop_device):
        await loops.detach(disk.loop_device)  # see ``_replace_image``
        disk.loop_device = ""
        disk.image_path.unlink(missing_ok=True)
    try:
        await asyncio.to_thread(clone_file, image, disk.image_path)
    except OSError as exc:
        if exc.errno not in _NO_CLONE:
            raise DriverError(f"cloning snapshot {image.parent.name}: {exc}") from exc
        await asyncio.to_thread(copy_sparse, image, disk.image_path)
    forget_old_image(disk)
    if not disk.loop_device:
        disk.loop_device = await loops.attach(disk.image_path)
        await asyncio.to_thread(loops.write_through, disk.loop_device)
    try:
        await asyncio.to_thread(_mount_disk, disk)
    except CommandFailedError as exc:
        if exc.returncode in _NOT_CLEAN:
            raise DiskNotCleanError(
                f"the copy of snapshot {image.parent.name} is not a clean filesystem ({exc})"
            ) from exc
        raise


#: The disk store's directory of snapshots (and of hibernated sandboxes' disks). The store's root is
#: also where S3 disks keep one directory per sandbox (``s3mounts.py``), whose sweep must pass it by.
SNAPSHOTS_DIRNAME = "snapshots"


def snapshots_dir(slots_dir: Path) -> Path:
    """Where this host's snapshots live: in the disk store, beside the images they clone."""
    return store_dir(slots_dir) / SNAPSHOTS_DIRNAME


#: A snapshot being written: ``<snapshots>/.partial-<id>``, renamed to ``<snapshots>/<id>`` once whole.
PARTIAL_SNAPSHOT_PREFIX = ".partial-"


def _remove_partial_snapshots(directory: Path) -> None:
    """Snapshots an agent died writing: never whole, never booted, removed when the store opens."""
    snapshots = directory / "snapshots"
    if not snapshots.is_dir():
        return
    for partial in snapshots.glob(f"{PARTIAL_SNAPSHOT_PREFIX}*"):
        shutil.rmtree(partial, ignore_errors=True)


def clone_file(source: Path, target: Path) -> None:
    """``target`` becomes a clone of ``source`` sharing all its blocks (``FICLONE``); OSError if the
    filesystem cannot."""
    source_fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        target_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            fcntl.ioctl(target_fd, FICLONE, source_fd)
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)


def clones(directory: Path) -> bool:
    """Whether files in ``directory`` can share blocks (a probe clone of one block)."""
    source, target = directory / ".clone-probe", directory / ".clone-probe.copy"
    try:
        source.write_bytes(b"\0" * 4096)
        clone_file(source, target)
        return True
    except OSError:
        return False
    finally:
        source.unlink(missing_ok=True)
        target.unlink(missing_ok=True)


# -- the disk store -----------------------------------------------------------------------------------


def store_dir(slots_dir: Path) -> Path:
    """Where the disk images of the slots in ``slots_dir`` live when there is a store."""
    return slots_dir.parent / "disks"


def _store_backing(slots_dir: Path) -> Path:
    return slots_dir.parent / "disks.xfs"


async def open_store(slots_dir: Path) -> Path | None:
    """The directory where new disk images go (mounting the store if it is not mounted yet), or None
    when this host has no way to clone (images then stay in their slot's directory)."""
    directory, backing = store_dir(slots_dir), _store_backing(slots_dir)
    directory.mkdir(parents=True, exist_ok=True)
    if mounts.is_mountpoint(directory):
        for device in loops_backing(backing):  # an agent before this one mounted it
            _bound_store_dirty(device)
        _remove_orphan_images(directory, slots_dir)
        _remove_partial_snapshots(directory)
        return directory
    if clones(directory):  # the state directory's own filesystem clones: no store needed
        _remove_partial_snapshots(directory)
        return directory
    if shutil.which("mkfs.xfs") is None:
        _remove_partial_snapshots(directory)
        return None
    if not backing.exists():
        stats = os.statvfs(backing.parent)
        partial = backing.with_suffix(".partial")
        with open(partial, "wb") as image:
            image.truncate(stats.f_blocks * stats.f_frsize // MIB * MIB)
        await run(
            ["mkfs.xfs", "-q", "-f", "-m", "reflink=1", "-l", "size=64m", "-L", "pdk-disks", str(partial)]
        )
        partial.replace(backing)
    device = await loop_of(backing, direct_io=True)
    mounts.mount(device, directory, "xfs")
    _bound_store_dirty(device)
    if not clones(directory):
        await close_store(slots_dir)
        return None
    _remove_orphan_images(directory, slots_dir)
    _remove_partial_snapshots(directory)
    return directory


async def close_store(slots_dir: Path) -> None:
    """Takes the store down when no disk image is left in it (an agent that stops with sandboxes keeps
    it, and the next agent finds it mounted)."""
    directory, backing = store_dir(slots_dir), _store_backing(slots_dir)
    if not directory.is_dir() or any(directory.glob("*.img")) or any(directory.glob("snapshots/snap_*")):
        return  # snapshots outlive every sandbox: the store stays while one is kept
    for device in loops_backing(backing):
        writeback.let_go(device)
    await unmount_image(directory, backing)
    with contextlib.suppress(OSError):
        directory.rmdir()
    if not loops_backing(backing):
        backing.unlink(missing_ok=True)


def _bound_store_dirty(device: str) -> None:
    """Bounds what the store's loop device holds dirty (``writeback.STORE_DIRTY_BYTES``). Only the
    agent's own store: where the state directory's filesystem clones, it is the host's disk, whose
    writeback is the operator's to tune."""
    if not writeback.hold(device):
        log.warning("disk_store_dirty_unbounded", reason="the kernel has no strict_limit or max_bytes for it")


def _remove_orphan_images(directory: Path, slots_dir: Path) -> None:
    """Images whose slot is gone (an agent that died between removing a slot and its image)."""
    attached = set(attached_loops().values())
    for image in directory.glob("*.img"):
        if not (slots_dir / image.stem).is_dir() and str(image) not in attached:
            image.unlink(missing_ok=True)


def _loop_backs(device: str, image_path: Path) -> bool:
    """True when ``device`` is still attached to ``image_path`` (never detach somebody else's loop)."""
    name = os.path.basename(device)
    try:
        backing = Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
    except OSError:
        return False
    return backing.removesuffix(" (deleted)") == str(image_path)


def attached_loops() -> dict[str, str]:
    """Loop device -> the file behind it (as the kernel reports it, without " (deleted)")."""
    found = {}
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            found[f"/dev/{backing.parent.parent.name}"] = (
                backing.read_text().strip().removesuffix(" (deleted)")
            )
        except OSError:
            continue
    return found


def loops_backing(image_path: Path) -> list[str]:
    """Every loop device attached to ``image_path``."""
    return [device for device, path in attached_loops().items() if path == str(image_path)]


async def loop_of(image_path: Path, *, direct_io: bool = False) -> str:
    """The loop device ``image_path`` is attached to (an agent before this one attached it), else a new one."""
    devices = loops_backing(image_path)
    return devices[0] if devices else await loops.attach(image_path, direct_io=direct_io)


async def unmount_image(directory: Path, image_path: Path) -> None:
    """Unmounts the filesystem at ``directory`` and detaches every loop device ``image_path`` is on;
    each step tolerates having been done already."""
    mounts.unmount(directory)
    for device in loops_backing(image_path):
        with contextlib.suppress(DriverError):
            await loops.detach(device)


async def detach_stray_loops(directory: Path, keep: set[str]) -> list[str]:
    """Detaches loop devices backed by files under ``directory`` (slots) or its disk store other than
    ``keep`` (left by an agent that died half-way through building a slot); returns the devices it
    freed."""
    prefixes = tuple(str(path).rstrip("/") + "/" for path in (directory, store_dir(directory)))
    stray = [d for d, path in attached_loops().items() if path.startswith(prefixes) and path not in keep]
    for device in stray:
        with contextlib.suppress(DriverError):
            await loops.detach(device)
    return stray
