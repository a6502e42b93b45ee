"""Loop devices through the kernel's ioctls, in process.

``losetup --find --show`` costs ~36 ms here (it scans every loop device in sysfs); the same work as
ioctls costs ~0.2 ms: ``LOOP_CTL_GET_FREE`` on ``/dev/loop-control`` names a free device and
``LOOP_CONFIGURE`` binds the file to it in one call. A device another process grabbed between the two
answers ``EBUSY``, and we ask for another. Where the kernel lacks ``LOOP_CONFIGURE`` (before 5.8) the
``losetup`` command does the work.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
from pathlib import Path

from paddock_hostagent.drivers.base import CommandFailedError
from paddock_hostagent.drivers.system.commands import run

LOOP_CLR_FD = 0x4C01
LOOP_SET_CAPACITY = 0x4C07
LOOP_CONFIGURE = 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
BLKFLSBUF = 0x1261
_INFO64_BYTES = 232  # struct loop_info64
_FLAGS_OFFSET = 52  # lo_flags inside it
_FILE_NAME_OFFSET = 56  # lo_file_name[64] inside it
LO_FLAGS_DIRECT_IO = 16
_ATTEMPTS = 16


async def attach(image_path: Path, *, direct_io: bool = False) -> str:
    """Binds ``image_path`` to a free loop device; returns the device's path.

    ``direct_io`` reads and writes the file with O_DIRECT, bypassing the page cache of the filesystem
    that holds it (for a file whose filesystem above keeps its own cache, such as the disk store)."""
    try:
        return _attach_ioctl(image_path, LO_FLAGS_DIRECT_IO if direct_io else 0)
    except _NoConfigureError:
        argv = ["losetup", "--find", "--show", *(["--direct-io=on"] if direct_io else []), str(image_path)]
        out = await run(argv)
        return out.strip()


async def detach(device: str) -> None:
    """Unbinds ``device``; a device already free is fine."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: nothing bound
            raise CommandFailedError(["ioctl", device, "LOOP_CLR_FD"], exc.errno or 1, str(exc)) from exc
    finally:
        os.close(fd)


def write_through(device: str) -> None:
    """Declares ``device`` a write-through cache, so the block layer drops the flushes sent to it
    instead of turning each into an fsync of the backing file (and of every filesystem below it).

    For sandbox disks: a sandbox does not outlive its host (after a host crash its processes are gone
    and it is destroyed, never booted again), so its ``fsync`` needs the data in the host's page cache,
    not on the host's disk. It makes a sandbox's fsync cheap, and a fork's FIFREEZE cost what the
    source wrote and not a chain of syncs down to the host's disk."""
    name = os.path.basename(device)
    try:
        Path(f"/sys/block/{name}/queue/write_cache").write_text("write through")
    except OSError as exc:
        raise CommandFailedError(["write_cache", device], exc.errno or 1, str(exc)) from exc


def bound_dirty(device: str, limit_bytes: int, *, strict: bool = True) -> bool:
    """Holds what the page cache keeps dirty for files on ``device``'s filesystem to ``limit_bytes``
    (the device's writeback domain in ``/sys/class/bdi``: ``strict_limit`` and ``max_bytes``). Past
    about three quarters of it the kernel writes back in the background and slows the writers down to
    the device's pace, whatever the rest of the host holds dirty. False where the kernel has no such
    knobs (before 6.2) or refuses them: the host's global thresholds alone apply then. ``strict=False``
    sets the limit but leaves it lifted (``strict_dirty``)."""
    bdi = bdi_dir(device)
    try:
        (bdi / "max_bytes").write_text(str(limit_bytes))
        (bdi / "strict_limit").write_text("1" if strict else "0")
    except OSError:
        return False
    return True


def strict_dirty(device: str, strict: bool) -> None:
    """Holds ``device``'s writeback domain to its ``max_bytes`` again, or lets it go for a while:
    without ``strict_limit`` the kernel paces its writers only when the whole host is past its dirty
    threshold. Best effort, as ``bound_dirty``: a device gone meanwhile is left alone."""
    with contextlib.suppress(OSError):
        (bdi_dir(device) / "strict_limit").write_text("1" if strict else "0")


def unbound_dirty(device: str) -> None:
    """Gives ``device``'s writeback domain the kernel's defaults back (no strict limit, a share of up
    to all of the host's dirty threshold): a loop device's number, and these settings with it, serve
    whatever file is attached to it next."""
    bdi = bdi_dir(device)
    with contextlib.suppress(OSError):
        (bdi / "strict_limit").write_text("0")
        (bdi / "max_ratio").write_text("100")


def bdi_dir(device: str) -> Path:
    """The block device's writeback domain in sysfs (``/sys/class/bdi/<major>:<minor>``)."""
    rdev = os.stat(device).st_rdev
    return Path(f"/sys/class/bdi/{os.major(rdev)}:{os.minor(rdev)}")


def size_bytes(device: str) -> int:
    """The device's size as the kernel sees it now."""
    name = os.path.basename(device)
    return int(Path(f"/sys/block/{name}/size").read_text()) * 512


def drop_cache(device: str) -> None:
    """Forgets whatever the device's own page cache holds (``BLKFLSBUF``): after its file was replaced
    underneath it, nothing read before may be served again."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, BLKFLSBUF, 0)
    except OSError as exc:
        raise CommandFailedError(["ioctl", device, "BLKFLSBUF"], exc.errno or 1, str(exc)) from exc
    finally:
        os.close(fd)


def refresh_capacity(device: str) -> None:
    """Tells ``device`` that its file has grown (``losetup -c``)."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, LOOP_SET_CAPACITY)
    except OSError as exc:
        raise CommandFailedError(["ioctl", device, "LOOP_SET_CAPACITY"], exc.errno or 1, str(exc)) from exc
    finally:
        os.close(fd)


class _NoConfigureError(Exception):
    """The kernel has no LOOP_CONFIGURE."""


def _attach_ioctl(image_path: Path, flags: int = 0) -> str:
    backing = os.open(image_path, os.O_RDWR | os.O_CLOEXEC)
    try:
        info = bytearray(_INFO64_BYTES)
        struct.pack_into("I", info, _FLAGS_OFFSET, flags)
        name = os.fsencode(image_path)[:63]
        info[_FILE_NAME_OFFSET : _FILE_NAME_OFFSET + len(name)] = name
        config = struct.pack("II", backing, 0) + bytes(info) + bytes(64)
        for _ in range(_ATTEMPTS):
            device = f"/dev/loop{_free_index()}"
            fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, LOOP_CONFIGURE, config)
                return device
            except OSError as exc:
                if exc.errno == errno.EBUSY:  # taken by someone else since GET_FREE: ask again
                    continue
                if exc.errno in (errno.ENOTTY, errno.EINVAL):
                    raise _NoConfigureError from exc
                raise CommandFailedError(
                    ["ioctl", device, "LOOP_CONFIGURE"], exc.errno or 1, str(exc)
                ) from exc
            finally:
                os.close(fd)
        raise CommandFailedError(["ioctl", "LOOP_CONFIGURE"], errno.EBUSY, "no free loop device stayed free")
    finally:
        os.close(backing)


def _free_index() -> int:
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        return int(fcntl.ioctl(control, LOOP_CTL_GET_FREE))
    except OSError as exc:
        raise CommandFailedError(
            ["ioctl", "/dev/loop-control", "GET_FREE"], exc.errno or 1, str(exc)
        ) from exc
    finally:
        os.close(control)
