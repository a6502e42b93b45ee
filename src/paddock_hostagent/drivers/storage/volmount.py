"""Placing a volume's host mount in a sandbox's mount namespace, read-only or not, and taking every copy
of it out again (``drivers/storage/volumes.py``).

The same machinery as an S3 disk's (``nsmount.py``): the host mount is cloned with
``open_tree(OPEN_TREE_CLONE)``, its copy made private, nosuid, nodev and, for a read-only attachment,
read-only (``mount_setattr``: a per-mount flag the sandbox, without CAP_SYS_ADMIN, cannot lift), and
moved onto the path inside the sandbox after ``setns``, the path opened with ``openat2`` under
RESOLVE_NO_SYMLINKS so no link the sandbox made steers it. Removal does not trust the path at all: it
unmounts every mount in the sandbox's namespace whose device is the volume's loop device (wherever
the sandbox may have renamed its directory to), and nothing else.

``setns`` refuses a multi-threaded caller, so this runs as its own short process:
``python -m paddock_hostagent.drivers.storage.volmount move PID SOURCE TARGET ro|rw`` or
``… umount PID MAJOR:MINOR``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

from paddock_hostagent.drivers.storage import nsmount
from paddock_hostagent.drivers.storage.nsmount import NsMountError

_MOUNT_ATTR_RDONLY = 0x1
_ATTEMPTS = 16


def move_into(pid: int, source: str, target: str, *, read_only: bool) -> None:
    libc = nsmount._libc
    tree = nsmount._check(
        libc.syscall(
            nsmount._SYS_OPEN_TREE,
            nsmount._AT_FDCWD,
            source.encode(),
            ctypes.c_uint(nsmount._OPEN_TREE_CLONE | nsmount._OPEN_TREE_CLOEXEC),
        ),
        f"open_tree {source}",
    )
    flags = nsmount._MOUNT_ATTR_NOSUID | nsmount._MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if read_only else 0)
    attr = nsmount._MountAttr(flags, 0, nsmount._MS_PRIVATE, 0)
    nsmount._check(nsmount._set_mount_attr(tree, attr), "mount_setattr")
    nsmount._enter(pid)
    opened = _open_dirs(target)
    try:
        placed = libc.syscall(
            nsmount._SYS_MOVE_MOUNT,
            ctypes.c_int(tree),
            b"",
            ctypes.c_int(opened),
            b"",
            ctypes.c_uint(nsmount._MOVE_MOUNT_F_EMPTY_PATH | nsmount._MOVE_MOUNT_T_EMPTY_PATH),
        )
    finally:
        os.close(opened)
    nsmount._check(placed, f"move_mount to {target}")


def _open_dirs(target: str) -> int:
    """Opens ``target`` in this (the sandbox's) namespace, making each missing directory on the way with
    ``mkdirat`` under its parent's fd: no component is ever reached through a symbolic link, so a link the
    sandbox made neither steers the mount nor has a directory made where it points."""
    current = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in [part for part in target.split("/") if part]:
            fd = nsmount._open_no_links(name, os.O_DIRECTORY, dir_fd=current)
            if fd == -errno.ENOENT:
                try:
                    os.mkdir(name, 0o755, dir_fd=current)
                except FileExistsError:
                    pass  # made meanwhile, or a dangling link: the open below says which
                except OSError as exc:
                    raise NsMountError(f"cannot create {target} in the sandbox: {exc.strerror}") from None
                fd = nsmount._open_no_links(name, os.O_DIRECTORY, dir_fd=current)
            if fd == -errno.ELOOP:
                raise NsMountError(f"{target} passes through a symbolic link in the sandbox")
            if fd == -errno.ENOTDIR:
                raise NsMountError(f"{target}: {name} is not a directory in the sandbox")
            if fd < 0:
                raise NsMountError(f"open {target}: {os.strerror(-fd)}")
            os.close(current)
            current = fd
    except BaseException:
        os.close(current)
        raise
    return current


def unmount_device(pid: int, device: str) -> int:
    """Detaches every mount of ``device`` (``MAJOR:MINOR``) in ``pid``'s namespace, deepest first;
    returns how many it took off."""
    fd = os.open(f"/proc/{pid}/mountinfo", os.O_RDONLY | os.O_CLOEXEC)  # before: the sandbox's /proc
    removed = 0
    try:
        nsmount._enter(pid)
        for _ in range(_ATTEMPTS):
            points = _points_of(fd, device)
            if not points:
                return removed
            for point in sorted(points, key=len, reverse=True):
                if nsmount._libc.umount2(point.encode(), nsmount._MNT_DETACH | nsmount._UMOUNT_NOFOLLOW) == 0:
                    removed += 1
                else:
                    err = ctypes.get_errno()
                    if err not in (errno.EINVAL, errno.ENOENT):
                        raise NsMountError(f"umount {point}: {os.strerror(err)}")
        if _points_of(fd, device):
            raise NsMountError("the volume is still mounted in the sandbox")
    finally:
        os.close(fd)
    return removed


def _points_of(fd: int, device: str) -> list[str]:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    points = []
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] == device:
            points.append(nsmount.unescape(fields[4]))
    return points


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 5 and argv[0] == "move" and argv[4] in ("ro", "rw"):
            move_into(int(argv[1]), argv[2], argv[3], read_only=argv[4] == "ro")
        elif len(argv) == 3 and argv[0] == "umount":
            unmount_device(int(argv[1]), argv[2])
        else:
            print("usage: volmount move PID SOURCE TARGET ro|rw | umount PID MAJOR:MINOR", file=sys.stderr)
            return 2
    except (NsMountError, OSError) as exc:
        print(f"volmount: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
