"""Waiting for a loop device to let go of its backing file, for tests that check an image once its
filesystem is unmounted and its loop device detached, and naming what still holds it when it does not.

The host's mounts are private here (no ``shared:`` propagation on ``/``), so a mount namespace made while
a test's filesystem was mounted (another test's container, before its ``pivot_root`` drops the host's
mounts) holds its own copy of it: the host's unmount then succeeds while the filesystem stays live, and
the loop device is only marked to go once that copy does (autoclear). Until then the image may still
have a dirty log, which ``xfs_repair -n`` reports as damage."""

from __future__ import annotations

import array
import contextlib
import fcntl
import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def _bound() -> dict[str, str]:
    """Each bound loop device (``/dev/loopN``) and its backing file as the kernel names it: its path, with
    `` (deleted)`` once the file was removed."""
    found = {}
    for path in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            found[f"/dev/{path.parent.parent.name}"] = path.read_text().strip()
    return found


def backing_files() -> set[str]:
    """Every loop device's backing file."""
    return {name.removesuffix(" (deleted)") for name in _bound().values()}


def _until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``done()`` came true within ``timeout_s``, asked every 0.2 s."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def wait_released(image: Path, timeout_s: float = 60.0) -> bool:
    """Whether no loop device holds ``image`` any more, waiting up to ``timeout_s`` for it."""
    return _until(lambda: str(image) not in backing_files(), timeout_s)


#: ``FS_IOC_GETVERSION``: an inode's generation, which tells a file from a later one given its number.
_FS_IOC_GETVERSION = 0x80087601


@dataclass(frozen=True)
class ImageFile:
    """One image file, not its path: a slot the pool rebuilds on a recycled network keeps its id, so a
    new image can be made at a destroyed sandbox's path, on a loop device of its own, while the test
    still waits for the old one to be let go."""

    path: Path
    inode: int
    generation: int

    @classmethod
    def of(cls, path: Path) -> ImageFile:
        with open(path, "rb") as image:
            generation = array.array("l", [0])
            fcntl.ioctl(image.fileno(), _FS_IOC_GETVERSION, generation)
            return cls(path, os.fstat(image.fileno()).st_ino, generation[0])

    def bound_to(self) -> list[str]:
        """The loop devices still attached to this file: to it once removed (the kernel names it
        ``<path> (deleted)``), or at its path while the path is still this file."""
        try:
            still_here = ImageFile.of(self.path) == self
        except OSError:
            still_here = False
        names = {f"{self.path} (deleted)", *([str(self.path)] if still_here else [])}
        return sorted(device for device, backing in _bound().items() if backing in names)

    def wait_unbound(self, timeout_s: float) -> bool:
        """Whether no loop device holds this file any more, waiting up to ``timeout_s`` for it."""
        return _until(lambda: not self.bound_to(), timeout_s)


def holders(devices: list[str]) -> str:
    """Who keeps each loop device in ``devices`` alive, for a failed assertion's message: the processes
    whose mount namespace still mounts its filesystem, or with a file, directory, root or working
    directory open on it."""
    found: list[str] = []
    own_namespace = os.readlink("/proc/self/ns/mnt")
    for device in devices:
        try:
            rdev = os.stat(device).st_rdev
        except OSError:
            continue
        number = f"{os.major(rdev)}:{os.minor(rdev)}"
        for proc in glob.glob("/proc/[0-9]*"):
            try:
                command = (
                    Path(proc, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
                )
                mounted = []
                if os.readlink(f"{proc}/ns/mnt") != own_namespace:  # the host's own mounts are in `under`
                    with open(f"{proc}/mountinfo") as mountinfo:
                        mounted = [line.split()[4] for line in mountinfo if line.split()[2] == number]
                opened = []
                for link in [f"{proc}/cwd", f"{proc}/root", *glob.glob(f"{proc}/fd/*")]:
                    with contextlib.suppress(OSError):  # closed meanwhile
                        if os.stat(link).st_dev == rdev:
                            opened.append(os.readlink(link))
            except OSError:
                continue  # gone meanwhile
            if mounted or opened:
                found.append(f"{device}: pid {proc[6:]} ({command}) mounts {mounted[:3]} opens {opened[:3]}")
    return "\n".join(found[:20]) or "no process holds them (the kernel has yet to free them)"
