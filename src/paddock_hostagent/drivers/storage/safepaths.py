"""Paths inside a tree that a tenant controls — an image it built, a sandbox's disk — walked by root.

The host agent runs as root. ``rootfs / "etc" / "hostname"`` is resolved by the kernel from the host's
own root: in a tree whose ``/etc`` is a symlink to ``/etc`` the agent would write the host's files, and
one whose ``/tmp`` points at a host directory would have it made world-writable. Here every path is
resolved *inside* its tree, as the sandbox itself sees it: ``openat2`` with ``RESOLVE_IN_ROOT``, so an
absolute symlink or a ``..`` stops at the tree's root (and ``RESOLVE_NO_MAGICLINKS``: no ``/proc``
links). The last component of a change is never followed: ``unlinkat``, ``mkdirat``, a temporary file
opened ``O_CREAT|O_EXCL|O_NOFOLLOW`` and renamed over the name, ``fchmod`` of an opened descriptor.
Kernels without openat2 (before 5.6) get the same resolution done one component at a time, each opened
``O_NOFOLLOW`` beside a stack of the directories walked.

    with Tree.open(rootfs) as tree:
        tree.makedirs("etc")
        tree.write_file("etc/hostname", b"box\\n")
        tree.chmod("tmp", 0o1777)
        tree.unlink("etc/resolv.conf")
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from paddock_hostagent.drivers.base import UnsupportedError

SYS_OPENAT2 = 437  # x86_64 and arm64 alike
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
MAX_SYMLINKS = 40  # as the kernel's own walk
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class TenantPathError(UnsupportedError):
    """A path inside a tenant's tree is not what the agent can work on (a directory where a file must
    be, a symlink loop, a name missing inside the tree): the tenant's own doing, refused by name."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_openat2_works: bool | None = None  # None: not tried yet


def openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    """The openat2 system call; raises OSError (ENOSYS where the kernel lacks it)."""
    how = _OpenHow(flags, 0, resolve)
    for _ in range(8):  # EAGAIN: a rename or mount raced the walk (IN_ROOT/BENEATH); walk again
        fd = _libc.syscall(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            raise OSError(code, os.strerror(code), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part and part != "."]


def _walk(root_fd: int, path: str, flags: int, *, follow: bool) -> int:
    """``openat2(root_fd, path, flags, RESOLVE_IN_ROOT)`` one component at a time: each symlink is read
    (``readlinkat``) and spliced into what is left, an absolute one from the root (or, unless
    ``follow``, refused with ELOOP), and every directory is opened ``O_NOFOLLOW`` (a symlink swapped in
    meanwhile fails the open instead of being followed); ``..`` goes back along the directories walked
    and never above the root."""
    stack = [os.dup(root_fd)]
    pending = deque(_parts(path))
    links = 0
    try:
        while pending:
            part = pending.popleft()
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            try:
                target: str | None = os.readlink(part, dir_fd=stack[-1])
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: not a symlink
                    raise
                target = None
            if target is not None:
                links += 1
                if not follow:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                pending.extendleft(reversed(_parts(target)))
                continue
            opened = flags if not pending else _DIR_FLAGS
            stack.append(os.open(part, opened | os.O_NOFOLLOW, dir_fd=stack[-1]))
        if len(stack) == 1:  # the path named the root itself
            return os.open(".", flags, dir_fd=stack[0])
        return stack.pop()
    finally:
        for fd in stack:
            os.close(fd)


def open_in_root(root_fd: int, path: str, flags: int = _DIR_FLAGS, *, follow: bool = True) -> int:
    """Opens ``path`` (relative; a leading ``/`` means the tree's root) resolved inside the tree whose
    root directory ``root_fd`` is, following its symlinks as the sandbox would and never out of it;
    unless ``follow``, a symlink anywhere on the way is refused (ELOOP)."""
    global _openat2_works
    relative = "/".join(_parts(path)) or "."
    resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS if follow else RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
    if _openat2_works is not False:
        try:
            fd = openat2(root_fd, relative, flags | os.O_CLOEXEC, resolve)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            _openat2_works = False
        else:
            _openat2_works = True
            return fd
    return _walk(root_fd, relative, flags | os.O_CLOEXEC, follow=follow)


class Tree:
    """A directory tree someone else controls, held open by its root (itself never a symlink).

    Its paths resolve as the sandbox would resolve them, inside the tree; with ``follow_symlinks``
    False (unpacking an archive, where no member lies beneath a symlink) a symlink on the way to a
    path is refused instead."""

    def __init__(self, root: Path, root_fd: int, *, follow_symlinks: bool = True) -> None:
        self.root = root
        self.fd = root_fd
        self.follow_symlinks = follow_symlinks

    @classmethod
    def open(cls, root: Path, *, follow_symlinks: bool = True) -> Tree:
        try:
            fd = os.open(root, _DIR_FLAGS | os.O_NOFOLLOW)
            return cls(root, fd, follow_symlinks=follow_symlinks)
        except OSError as exc:
            raise TenantPathError(f"the root of the tree is not a directory: {exc.strerror}") from exc

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _refuse(self, path: str, exc: OSError) -> TenantPathError:
        """Names the path as the tenant sees it, not where its tree lies on the host."""
        return TenantPathError(f"/{path.lstrip('/')} in the sandbox's or image's tree: {exc.strerror}")

    @contextlib.contextmanager
    def directory(self, path: str) -> Iterator[int]:
        """A descriptor of the directory ``path`` inside the tree, closed afterwards."""
        try:
            fd = open_in_root(self.fd, path, follow=self.follow_symlinks)
        except OSError as exc:
            raise self._refuse(path, exc) from exc
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def parent(self, path: str) -> Iterator[tuple[int, str]]:
        """The directory holding ``path``'s last component, and that component (never followed)."""
        parts = _parts(path)
        if not parts or parts[-1] == "..":
            raise TenantPathError(f"{path!r} names no entry of a directory")
        with self.directory("/".join(parts[:-1])) as fd:
            yield fd, parts[-1]

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        """``mkdir -p`` inside the tree: each missing directory made with ``mode`` (an existing one, or
        a symlink to one inside the tree, is kept as it is)."""
        parts = _parts(path)
        for depth in range(1, len(parts) + 1):
            with self.parent("/".join(parts[:depth])) as (fd, name), contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=fd)
        with self.directory(path):
            pass  # it resolves to a directory (a dangling symlink or a file in its place is refused)

    def chmod(self, path: str, mode: int) -> None:
        """Sets the mode of the directory ``path`` resolves to inside the tree."""
        with self.directory(path) as fd:
            os.fchmod(fd, mode)

    def unlink(self, path: str) -> bool:
        """Removes the entry (file or symlink, never what it points to); False when there was none."""
        with self.parent(path) as (fd, name):
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                return False
            except OSError as exc:  # a directory in its place
                raise self._refuse(path, exc) from exc
        return True

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Replaces ``path`` with a new regular file of ``data`` (owned by the agent's user): written
        to a temporary name created ``O_EXCL|O_NOFOLLOW`` and renamed over it, so a symlink in its place
        is replaced, not followed, and the sandbox never sees half a file."""
        with self.parent(path) as (fd, name):
            tmp = f".{name}.paddock"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                out = os.open(tmp, flags, mode, dir_fd=fd)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(out, view) :]
                    os.fchmod(out, mode)  # whatever the umask
                finally:
                    os.close(out)
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise self._refuse(path, exc) from exc
