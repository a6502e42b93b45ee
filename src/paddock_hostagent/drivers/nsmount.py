"""Moving a host mount into a sandbox's mount namespace, and removing it there.

The sandbox's disks are FUSE mounts made on the host (``drivers/s3mounts.py``), where their
credentials stay. To show one at an arbitrary path inside a running sandbox, this clones the host
mount with ``open_tree(OPEN_TREE_CLONE)``, enters the sandbox's mount namespace with ``setns`` and
places the clone there with ``move_mount``. Nothing new is bound into every sandbox at boot, and the
sandbox sees neither the host path nor the credentials.

``setns`` into a mount namespace refuses a multi-threaded caller, and the agent has threads, so this
runs as its own short process: ``python -m paddock_hostagent.drivers.nsmount move|umount …``. Paths
after ``setns`` resolve inside the sandbox (the kernel resets root and cwd to the namespace's root).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)

# Same numbers on every architecture (the unified syscall table, Linux >= 5.2).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_AT_FDCWD = -100
_CLONE_NEWNS = 0x00020000
_MNT_DETACH = 0x2


class NsMountError(Exception):
    pass


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise NsMountError(f"{what}: {os.strerror(err)}")
    return result


def _enter(pid: int) -> None:
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, _CLONE_NEWNS), "setns")
    finally:
        os.close(fd)


def move_into(pid: int, source: str, target: str) -> None:
    """Clone the mount at host path ``source`` and mount it at ``target`` in ``pid``'s namespace."""
    tree = _check(
        _libc.syscall(
            _SYS_OPEN_TREE, _AT_FDCWD, source.encode(), ctypes.c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
        ),
        f"open_tree {source}",
    )
    _enter(pid)
    try:
        os.makedirs(target, exist_ok=True)
    except FileExistsError:
        pass  # a dead FUSE mount (ENOTCONN on stat) is there: the new mount goes on top of it
    except OSError as exc:
        raise NsMountError(f"cannot create {target} in the sandbox: {exc.strerror}") from None
    _check(
        _libc.syscall(
            _SYS_MOVE_MOUNT,
            ctypes.c_int(tree),
            b"",
            ctypes.c_int(_AT_FDCWD),
            target.encode(),
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
        ),
        f"move_mount to {target}",
    )


def unmount_in(pid: int, target: str) -> None:
    """Detach whatever is mounted at ``target`` in ``pid``'s namespace (lazily: a shell may sit in it)."""
    _enter(pid)
    while _libc.umount2(target.encode(), _MNT_DETACH) == 0:
        pass  # a path mounted twice (an earlier, stale copy below) is emptied entirely
    err = ctypes.get_errno()
    if err not in (errno.EINVAL, errno.ENOENT):
        raise NsMountError(f"umount {target}: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 4 and argv[0] == "move":
            move_into(int(argv[1]), argv[2], argv[3])
        elif len(argv) == 3 and argv[0] == "umount":
            unmount_in(int(argv[1]), argv[2])
        else:
            print("usage: nsmount move PID SOURCE TARGET | umount PID TARGET", file=sys.stderr)
            return 2
    except (NsMountError, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
