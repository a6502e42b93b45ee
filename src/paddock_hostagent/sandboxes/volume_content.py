"""The files of a local volume, read and written on the host without a sandbox: E2B's volume content API
(``Volume.list``, ``read_file``, ``write_file``, ``make_dir``, ``remove``, ``get_info``,
``update_metadata``; docs/e2b.md), served by the control plane through these calls.

A volume's filesystem is mounted on the host while a container or gVisor sandbox holds it
(``sandboxes/volumes.py``); otherwise it is mounted for the call and unmounted after it, under the
volume's lock, so a create that mounts it waits for the call and the call for the create. A volume a VM
holds is refused: the VM's kernel has it mounted, and a second kernel on one XFS would break it.

The agent is root and the tree is the tenant's (isolation rule 3): every path resolves beneath the
volume's root with no symlink followed anywhere on it (``safepaths``, ``follow_symlinks=False``: a
symlink on the way is a 400 naming the path), and the last component is never followed (``lstat``,
``unlinkat``, ``mkdirat``, a new file made ``O_EXCL|O_NOFOLLOW`` and renamed into place, ``lchown``). A
listing, a file read and a file written are bounded (isolation rule 5): :data:`MAX_FILE_BYTES`,
:data:`MAX_ENTRIES`, :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import os
import stat
from collections.abc import Callable, Iterator
from typing import TypeVar

from paddock_hostagent import errors
from paddock_hostagent.drivers.storage import safepaths
from paddock_hostagent.drivers.storage.safepaths import TenantPathError, Tree
from paddock_hostagent.sandboxes.volumes import Volumes
from paddock_hostagent.schemas import VOLUME_FILE_BYTES, EntryKind, VolumeEntry

#: The largest file a read returns or a write takes in one call (isolation rule 5: bounded).
MAX_FILE_BYTES = VOLUME_FILE_BYTES
#: Entries one listing returns at most, and how deep it goes.
MAX_ENTRIES = 10_000
MAX_DEPTH = 32

Result = TypeVar("Result")


def _parts(path: str) -> list[str]:
    """The path's names below the volume's root; ``..`` is refused (it could only climb out)."""
    parts = [part for part in path.split("/") if part and part != "."]
    if ".." in parts:
        raise errors.BadPath(f"{path!r} has a '..' in it; name the entry from the volume's root")
    return parts


def _display(parts: list[str]) -> str:
    return "/" + "/".join(parts)


def _time(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _kind(mode: int) -> EntryKind:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "unknown"


def _entry(parts: list[str], info: os.stat_result, target: str | None = None) -> VolumeEntry:
    return VolumeEntry(
        name=parts[-1] if parts else "/",
        type=_kind(info.st_mode),
        path=_display(parts),
        size=info.st_size,
        mode=stat.S_IMODE(info.st_mode),
        uid=info.st_uid,
        gid=info.st_gid,
        atime=_time(info.st_atime),
        mtime=_time(info.st_mtime),
        ctime=_time(info.st_ctime),
        target=target,
    )


def _missing(parts: list[str]) -> errors.FileNotFound:
    return errors.FileNotFound(f"{_display(parts)} is not in the volume")


@contextlib.contextmanager
def _refused(parts: list[str]) -> Iterator[None]:
    """OS errors on the tenant's tree as answers naming the path as the volume shows it."""
    try:
        yield
    except FileNotFoundError:
        raise _missing(parts) from None
    except TenantPathError as exc:
        cause = exc.__cause__
        if isinstance(cause, FileNotFoundError):
            raise _missing(parts) from None
        raise errors.BadPath(f"{_display(parts)}: {_reason(cause)}") from None
    except OSError as exc:
        raise errors.BadPath(f"{_display(parts)}: {_reason(exc)}") from None


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, OSError):
        if exc.errno == errno.ELOOP:
            return "a symlink is on the way (the volume's paths are not followed through symlinks)"
        if exc.errno == errno.ENOTDIR:
            return "a file is where a directory must be"
        return exc.strerror or str(exc)
    return str(exc)


def _lstat(tree: Tree, parts: list[str]) -> VolumeEntry:
    if not parts:
        return _entry(parts, os.fstat(tree.fd))
    with _refused(parts), tree.parent("/".join(parts)) as (fd, name):
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
    return _entry(parts, info, target)


def stat_path(tree: Tree, path: str) -> VolumeEntry:
    return _lstat(tree, _parts(path))


def list_dir(tree: Tree, path: str, depth: int) -> list[VolumeEntry]:
    """The entries of the directory ``path``, and of its subdirectories down to ``depth`` levels (1: its
    own entries), each directory's in name order; a symlink is listed, never entered."""
    if not 1 <= depth <= MAX_DEPTH:
        raise errors.BadRequest(f"depth: must be between 1 and {MAX_DEPTH}")
    parts = _parts(path)
    found: list[VolumeEntry] = []

    def walk(fd: int, at: list[str], left: int) -> None:
        with os.scandir(fd) as listing:
            names = sorted(entry.name for entry in listing)
        for name in names:
            if len(found) >= MAX_ENTRIES:
                raise errors.PayloadTooLarge(
                    f"depth: {_display(parts)} holds more than {MAX_ENTRIES} entries at this depth;"
                    " list a deeper directory or fewer levels"
                )
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
            found.append(_entry([*at, name], info, target))
            if left > 1 and stat.S_ISDIR(info.st_mode):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    child = os.open(name, flags, dir_fd=fd)
                    try:
                        walk(child, [*at, name], left - 1)
                    finally:
                        os.close(child)

    with _refused(parts), tree.directory("/".join(parts)) as fd:
        walk(fd, parts, depth)
    return found


def read_file(tree: Tree, path: str) -> bytes:
    parts = _parts(path)
    with _refused(parts):
        fd = safepaths.open_in_root(tree.fd, "/".join(parts), os.O_RDONLY | os.O_NOFOLLOW, follow=False)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise errors.BadPath(f"{_display(parts)} is a {_kind(info.st_mode)}, not a file")
        if info.st_size > MAX_FILE_BYTES:
            raise errors.PayloadTooLarge(
                f"{_display(parts)} holds {info.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit"
                " of one read; read it from a sandbox that mounts the volume"
            )
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_FILE_BYTES:  # it grew while read
                raise errors.PayloadTooLarge(f"{_display(parts)} grew past {MAX_FILE_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _own(tree: Tree, parts: list[str], uid: int | None, gid: int | None, mode: int | None) -> None:
    """Sets what was asked of the entry itself (a symlink's own owner, never its target's)."""
    with _refused(parts), tree.parent("/".join(parts)) as (fd, name):
        if uid is not None or gid is not None:
            os.chown(
                name, -1 if uid is None else uid, -1 if gid is None else gid, dir_fd=fd, follow_symlinks=False
            )
        if mode is not None:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise errors.BadPath(f"{_display(parts)} is a symlink, whose mode cannot be set")
            os.chmod(name, mode, dir_fd=fd)  # not a symlink: checked above, and the name is not followed


def write_file(
    tree: Tree, path: str, data: bytes, uid: int | None, gid: int | None, mode: int | None
) -> VolumeEntry:
    """Replaces ``path`` with a file of ``data`` (its missing parent directories made), whole or not at
    all: written beside it and renamed over it, so a reader never sees half of it."""
    parts = _parts(path)
    if not parts:
        raise errors.BadPath("/ is the volume's root, a directory, not a file")
    with _refused(parts):
        if len(parts) > 1:
            tree.makedirs("/".join(parts[:-1]))
        tree.write_file("/".join(parts), data, 0o644 if mode is None else mode)
    _own(tree, parts, uid, gid, None)
    return _lstat(tree, parts)


def make_dir(
    tree: Tree, path: str, uid: int | None, gid: int | None, mode: int | None, parents: bool
) -> VolumeEntry:
    """Makes the directory ``path``; its missing parents too with ``parents`` (E2B's ``force``), else a
    missing parent is a 404. A directory already there is kept as it is (its metadata set as asked)."""
    parts = _parts(path)
    if not parts:
        raise errors.BadPath("/ is the volume's root, there already")
    with _refused(parts):
        if parents and len(parts) > 1:
            tree.makedirs("/".join(parts[:-1]))
        with tree.parent("/".join(parts)) as (fd, name):
            try:
                os.mkdir(name, 0o755 if mode is None else mode, dir_fd=fd)
            except FileExistsError:
                if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise errors.BadPath(f"{_display(parts)} is there and is not a directory") from None
    _own(tree, parts, uid, gid, mode)
    return _lstat(tree, parts)


def update(tree: Tree, path: str, uid: int | None, gid: int | None, mode: int | None) -> VolumeEntry:
    parts = _parts(path)
    _lstat(tree, parts)  # a 404 for a missing entry before anything else
    if parts:
        _own(tree, parts, uid, gid, mode)
    elif uid is not None or gid is not None or mode is not None:
        raise errors.BadPath("/ is the volume's root, which keeps its owner and mode")
    return _lstat(tree, parts)


def _remove_tree(fd: int, name: str, budget: list[int]) -> None:
    """Removes ``name`` in the directory ``fd``, a directory with all it holds: each directory opened
    ``O_NOFOLLOW`` by its descriptor, so nothing outside the volume is reached through a symlink."""
    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=fd)
        return
    budget[0] -= 1
    if budget[0] < 0:
        raise errors.PayloadTooLarge(f"more than {MAX_ENTRIES * 10} directories to remove in one call")
    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    try:
        with os.scandir(child) as listing:
            names = [entry.name for entry in listing]
        for inner in names:
            _remove_tree(child, inner, budget)
    finally:
        os.close(child)
    os.rmdir(name, dir_fd=fd)


def remove(tree: Tree, path: str) -> None:
    """Removes the entry ``path``: a file, a symlink (never what it points to), or a directory with
    everything in it."""
    parts = _parts(path)
    if not parts:
        raise errors.BadPath("/ is the volume's root, which cannot be removed; remove what it holds")
    with _refused(parts), tree.parent("/".join(parts)) as (fd, name):
        _remove_tree(fd, name, [MAX_ENTRIES * 10])


async def run(volumes: Volumes, volume_id: str, work: Callable[[Tree], Result]) -> Result:
    """One of the calls above on a volume of this host, with its filesystem mounted on the host
    (``Volumes.on_host``), in a thread."""
    async with volumes.on_host(volume_id) as root:

        def opened() -> Result:
            with Tree.open(root, follow_symlinks=False) as tree:
                return work(tree)

        return await asyncio.to_thread(opened)
