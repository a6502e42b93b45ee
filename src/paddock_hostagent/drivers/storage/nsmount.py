"""Moving a host mount into a sandbox's mount namespace, and removing it there.

The sandbox's disks are FUSE mounts made on the host (``drivers/storage/s3mounts.py``), where their
credentials stay. To show one at an arbitrary path inside a running sandbox, this clones the host
mount with ``open_tree(OPEN_TREE_CLONE)``, enters the sandbox's mount namespace with ``setns`` and
places the clone there with ``move_mount``. Nothing new is bound into every sandbox at boot, and the
sandbox sees neither the host path nor the credentials.

``setns`` into a mount namespace refuses a multi-threaded caller, and the agent has threads, so this
runs as its own short process: ``python -m paddock_hostagent.drivers.storage.nsmount move|umount …``. Paths
after ``setns`` resolve inside the sandbox (the kernel resets root and cwd to the namespace's root),
and none of them through a symbolic link (``openat2`` with RESOLVE_NO_SYMLINKS): a link the sandbox
made cannot steer the mount onto its own /proc or anywhere else it does not name. The placed copy is
private, so nothing mounted under it in the sandbox propagates back to the host's mount; a removal
takes only FUSE mounts off the path, never what the sandbox had there before (its procfs, say).

``nsmount s3fs NETNS RESOLV HOSTS POINT -- s3fs …`` starts s3fs itself: in the sandbox's network namespace
(its connections leave through the sandbox's veth, under its egress rules, like the sandbox's own), in
a mount namespace of its own where ``/etc/resolv.conf`` and ``/etc/hosts`` differ from the host's
(they name the sandbox's resolver, which applies the sandbox's name rules), and otherwise as on the
host: the FUSE mount point is a shared mount, so s3fs's mount lands there in the host's namespace. Its
copies of other sandboxes' disks are detached first, so s3fs does not keep them mounted after the host
unmounts them (``_release_copies``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import sys
from typing import NamedTuple

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)

# Same numbers on every architecture (the unified syscall table, Linux >= 5.2).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_OPENAT2 = 437
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MNT_DETACH = 0x2
_UMOUNT_NOFOLLOW = 0x8
_MS_BIND = 0x1000
_MS_PRIVATE = 1 << 18
_MS_SLAVE = 1 << 19


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class NsMountError(Exception):
    pass


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise NsMountError(f"{what}: {os.strerror(err)}")
    return result


def _open_no_links(path: str, flags: int, dir_fd: int = _AT_FDCWD) -> int:
    """``openat2(dir_fd, path, O_PATH | flags)`` that follows no symbolic or magic link on the way (some
    of these paths are in sandboxes' trees): a descriptor, or ``-errno``."""
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC | flags, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        _SYS_OPENAT2, ctypes.c_int(dir_fd), path.encode(), ctypes.byref(how), ctypes.c_size_t(24)
    )
    return int(fd) if fd >= 0 else -ctypes.get_errno()


def _set_mount_attr(fd: int, attr: _MountAttr, *, recursive: bool = False) -> int:
    """``mount_setattr`` on the mount (or detached tree) at descriptor ``fd``: 0, or -1 with errno set."""
    flags = _AT_EMPTY_PATH | (_AT_RECURSIVE if recursive else 0)
    return int(
        _libc.syscall(
            _SYS_MOUNT_SETATTR,
            ctypes.c_int(fd),
            b"",
            ctypes.c_uint(flags),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
    )


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
    # The copy joins no peer group (the host's mount is shared with s3fs's own namespace).
    attr = _MountAttr(_MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, _MS_PRIVATE, 0)
    _check(_set_mount_attr(tree, attr), "mount_setattr")
    _enter(pid)
    try:
        os.makedirs(target, exist_ok=True)
    except FileExistsError:
        pass  # a dead FUSE mount (ENOTCONN on stat) is there: the new mount goes on top of it
    except OSError as exc:
        raise NsMountError(f"cannot create {target} in the sandbox: {exc.strerror}") from None
    result = _open_no_links(target, os.O_DIRECTORY)
    if result < 0:
        err = -result
        if err == errno.ELOOP:
            raise NsMountError(f"{target} passes through a symbolic link in the sandbox")
        if err != errno.ENOTCONN:
            raise NsMountError(f"open {target}: {os.strerror(err)}")
        placed = _libc.syscall(  # a dead FUSE mount cannot be opened: place the new one over its path
            _SYS_MOVE_MOUNT,
            ctypes.c_int(tree),
            b"",
            ctypes.c_int(_AT_FDCWD),
            target.encode(),
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH),
        )
    else:
        try:
            placed = _libc.syscall(
                _SYS_MOVE_MOUNT,
                ctypes.c_int(tree),
                b"",
                ctypes.c_int(result),
                b"",
                ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH),
            )
        finally:
            os.close(result)
    _check(placed, f"move_mount to {target}")


def unmount_in(pid: int, target: str) -> None:
    """Detach the FUSE mounts at ``target`` in ``pid``'s namespace (lazily: a shell may sit in one),
    and nothing else: what the sandbox had at that path before stays (a path mounted twice, an
    earlier, stale copy below, is emptied of both)."""
    # Opened before entering: the sandbox's /proc has no entry for this process.
    fd = os.open(f"/proc/{pid}/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _enter(pid)
        while _top_fstype(fd, target).startswith("fuse"):
            if _libc.umount2(target.encode(), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
                err = ctypes.get_errno()
                if err in (errno.EINVAL, errno.ENOENT):
                    return
                raise NsMountError(f"umount {target}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _top_fstype(fd: int, target: str) -> str:
    """The type of the topmost mount at ``target`` in the mountinfo open at ``fd`` ("" for none)."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    found = ""
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == target:
            found = fields[fields.index("-") + 1]
    return found


def start_s3fs(netns: str, resolv_conf: str, hosts: str, point: str, argv: list[str]) -> None:
    """Becomes s3fs (``argv``, mounting at ``point``) in the network namespace at ``netns``, resolving
    through the files ``resolv_conf`` and ``hosts`` (the sandbox's resolver), in a copy of the host's
    mount namespace that keeps only what s3fs needs of the host's mounts (:func:`_release_copies`)."""
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, _CLONE_NEWNET), "setns net")
    finally:
        os.close(fd)
    # A copy of the host's mount namespace: the FUSE mount point, shared, stays a peer of the host's.
    _check(_libc.unshare(_CLONE_NEWNS), "unshare")
    _release_copies(os.path.realpath(point))
    for source, target in ((resolv_conf, "/etc/resolv.conf"), (hosts, "/etc/hosts")):
        real = os.path.realpath(target)
        if not os.path.isfile(real):
            continue  # the host has none: nothing of the host's to hide
        # The mount that holds the file stops sending to the host's copy, so the bind stays here.
        _check(_libc.mount(None, _mount_root(real).encode(), None, _MS_SLAVE, None), f"slave {target}")
        _check(_libc.mount(source.encode(), real.encode(), None, _MS_BIND, None), f"bind {target}")
    os.execv(argv[0], argv)


def _release_copies(keep: str) -> None:
    """Detaches this namespace's copies of the host's mounts that others unmount, except those holding
    ``keep`` (the FUSE mount point) and those whose unmount would reach the host.

    The host's mounts do not propagate into a copy when they are private, as ``/`` is on some hosts:
    the host's later unmount then leaves this copy mounted. s3fs lives as long as its disk, so it held
    every sandbox disk mounted when it started: a destroyed neighbour's filesystem stayed live and its
    loop device bound for as long as this s3fs ran.

    An unmount propagates to the peers of the mount's *parent*: a mount whose parent is shared (another
    S3 disk's FUSE mount on its shared mount point) is left, as detaching it here would take the host's
    copy too. Each detached mount and those under it are made private first, so nothing below it
    propagates either. Where the host's mounts are shared, its unmounts reach this copy by themselves."""
    entries = _mountinfo()
    shared = {entry.mount_id for entry in entries if entry.shared}
    # Newest first: a mount under another, or on top of another, goes before the one it is on.
    for entry in reversed(entries):
        if entry.parent_id in shared or _holds(entry.point, keep):
            continue
        if (
            entry.source.startswith("/dev/loop")
            or entry.fstype == "overlay"
            or entry.fstype.startswith("fuse")
        ):
            _detach_private(entry.mount_id, entry.point)


def _detach_private(mount_id: int, point: str) -> None:
    """Makes mount ``mount_id``, at ``point``, and those under it private, then detaches it; nothing if
    another mount is on top of it at that path. The path is opened without following a symbolic link:
    some of these mounts are in sandboxes' trees."""
    fd = _open_no_links(point, 0)
    if fd < 0:
        return  # gone meanwhile, or reached through a link
    try:
        if _mount_id_of(fd) != mount_id:
            return
        if _set_mount_attr(fd, _MountAttr(0, 0, _MS_PRIVATE, 0), recursive=True):
            return
        # The descriptor's own path, not ``point`` again: the mount it opened, whatever the path is now.
        _libc.umount2(f"/proc/self/fd/{fd}".encode(), _MNT_DETACH)
    finally:
        os.close(fd)


def _mount_id_of(fd: int) -> int | None:
    """The id of the mount the descriptor ``fd`` is on (as mountinfo numbers mounts)."""
    with open(f"/proc/self/fdinfo/{fd}") as info:
        for line in info:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    return None


def _holds(point: str, path: str) -> bool:
    """Whether a mount at ``point`` is on the way to ``path``."""
    return path == point or path.startswith(point.rstrip("/") + "/")


class _Mount(NamedTuple):
    mount_id: int
    parent_id: int
    point: str
    fstype: str
    source: str
    shared: bool  # a member of a peer group: mounts and unmounts on it reach its peers


def _mountinfo() -> list[_Mount]:
    """The mounts of this namespace, oldest first."""
    found: list[_Mount] = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            head, _, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if len(fields) >= 6 and len(rest) >= 2:
                shared = any(tag.startswith("shared:") for tag in fields[6:])
                point, source = unescape(fields[4]), unescape(rest[1])
                found.append(_Mount(int(fields[0]), int(fields[1]), point, rest[0], source, shared))
    return found


def unescape(field: str) -> str:
    """A path as ``/proc/*/mountinfo`` and ``/proc/*/mounts`` write it, with space, tab, newline and
    backslash as octal escapes (``\\040``), decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_root(path: str) -> str:
    """Where the mount that holds ``path`` is mounted (this namespace's longest mount point above)."""
    best = "/"
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4]
            if _holds(point, path) and len(point) >= len(best):
                best = point
    return best


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 4 and argv[0] == "move":
            move_into(int(argv[1]), argv[2], argv[3])
        elif len(argv) == 3 and argv[0] == "umount":
            unmount_in(int(argv[1]), argv[2])
        elif len(argv) > 6 and argv[0] == "s3fs" and argv[5] == "--":
            start_s3fs(argv[1], argv[2], argv[3], argv[4], argv[6:])
        else:
            print(
                "usage: nsmount move PID SOURCE TARGET | umount PID TARGET"
                " | s3fs NETNS RESOLV HOSTS POINT -- S3FS ARGS…",
                file=sys.stderr,
            )
            return 2
    except (NsMountError, OSError) as exc:
        print(f"nsmount: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
