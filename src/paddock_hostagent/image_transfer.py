"""Template images between hosts: a host that lacks a template's image fetches it from the host that
built it (docs/templates.md, "More than one host").

- ``GET /internal/v1/images/{id}`` on the holding host streams the template's image directory as an
  uncompressed tar (``image.json`` and ``rootfs``, numeric owners), straight from ``tar``;
- ``POST /internal/v1/images/{id}/fetch`` (``{"source_url": …}``) on the host that lacks it pulls that
  stream from the source host with the caller's own bearer token (every host agent accepts the one
  host token the control plane holds), unpacks it next to where the image will live (same filesystem),
  checks that its ``image.json`` names this template, and installs it with ``ImageStore.install_template``
  — ``image.json`` written last, so a fetch that stops half-way leaves nothing bootable. Fetches of one
  image are serialized; one already here answers at once.

The tree is a tenant's (a template it built), and the receiving agent is root: ``unpack`` writes each
member through ``drivers/storage/safepaths.py`` rather than with ``tar -x``. A member's name must lie under
``rootfs/`` (no absolute name, no ``..``) and no member is written beneath a symlink; a hard link must
name a member inside the image; symlinks are created as they are (they are followed only inside a
sandbox, or inside the tree by root); device nodes are dropped (a sandbox's /dev is a tmpfs of the
runtime's, and a node for a host disk in an image directory would be a way in for any local user).

A fetch is bounded (``limit_bytes``): by the template's recorded ext4 size with a margin
(``fetch_limit``) when the control plane sends it, and never past the host's
``PADDOCK_HOST_IMAGE_FETCH_MAX_MIB``. The stream and the members' declared sizes (a sparse member's
too) are counted as they arrive; past the bound the fetch is refused with 413 naming it, and what was
unpacked is removed. Before, a fetch took whatever the source sent, up to the host's disk.

Only templates travel: catalog images are built by each host from the Debian archive.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import httpx

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.storage.safepaths import TenantPathError, Tree
from paddock_hostagent.images import TEMPLATE_DIR_MODE, TEMPLATE_PREFIX, ImageStore, slug

log = get_logger(__name__)

CHUNK_BYTES = 1 << 20
MAX_META_BYTES = 1 << 20  # image.json: a name, a config, sizes
FETCH_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)


def _check(images: ImageStore, name: str) -> None:
    if not name.startswith(TEMPLATE_PREFIX):
        raise errors.BadRequest(f"only templates ({TEMPLATE_PREFIX}…) move between hosts, not {name!r}")


async def stream(images: ImageStore, name: str) -> AsyncIterator[bytes]:
    """The image as a tar stream; 404 (``SandboxNotFound``) before the first byte when it is not here."""
    _check(images, name)
    if not images.is_cached(name):
        raise errors.SandboxNotFound(f"image {name} is not on this host")
    root = images.image_dir / slug(name)
    process = await asyncio.create_subprocess_exec(
        "tar", "-C", str(root), "--numeric-owner", "-cf", "-", "image.json", "rootfs",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip

    async def chunks() -> AsyncIterator[bytes]:
        assert process.stdout is not None
        try:
            while chunk := await process.stdout.read(CHUNK_BYTES):
                yield chunk
            if await process.wait() != 0:  # the receiver sees a short tar and refuses it
                raise OSError(f"tar of {name} exited with {process.returncode}")
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    return chunks()


def recorded_size(images: ImageStore, name: str) -> int:
    """The ext4 size the image's ``image.json`` records (0 if unknown)."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        return int(
            json.loads((images.image_dir / slug(name) / "image.json").read_text()).get("ext4_size_bytes") or 0
        )
    return 0


class ImageFetcher:
    def __init__(self, images: ImageStore, max_bytes: int) -> None:
        self.images = images
        #: The host's own bound on any fetch (``image_fetch_max_mib``).
        self.max_bytes = max_bytes
        self._locks: dict[str, asyncio.Lock] = {}

    async def fetch(
        self, name: str, source_url: str, authorization: str, limit_bytes: int | None = None
    ) -> None:
        """``limit_bytes``: the caller's bound (``fetch_limit`` of the template's recorded size); the
        host's ``max_bytes`` bounds it."""
        _check(self.images, name)
        limit = min(self.max_bytes, limit_bytes or self.max_bytes)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if self.images.is_cached(name):
                return
            image_root = self.images.image_dir / slug(name)
            incoming = image_root / f"fetch-{secrets.token_hex(4)}.incoming"
            image_root.mkdir(mode=TEMPLATE_DIR_MODE, parents=True, exist_ok=True)
            image_root.chmod(TEMPLATE_DIR_MODE)  # a tenant's tree: root's alone from the first byte
            incoming.mkdir()
            try:
                url = f"{source_url.rstrip('/')}/internal/v1/images/{name}"
                await asyncio.to_thread(_receive, name, url, authorization, incoming, limit)
                meta = _read_meta(incoming, source_url)
                if not isinstance(meta, dict) or meta.get("name") != name:
                    raise errors.BadRequest(f"{source_url} sent an image that is not {name}")
                await asyncio.to_thread(self.images.install_template, name, incoming / "rootfs", meta)
            finally:
                await asyncio.to_thread(shutil.rmtree, incoming, True)
                with contextlib.suppress(OSError):
                    image_root.rmdir()  # a failed fetch leaves no empty image directory behind
        log.info("template_image_fetched", template_id=name, source=source_url)


def _read_meta(incoming: Path, source_url: str) -> Any:
    """The unpacked ``image.json`` (a regular file: ``unpack`` makes nothing else of that name)."""
    try:
        rootfs = os.lstat(incoming / "rootfs")
        with open(incoming / "image.json", "rb", opener=_no_follow) as meta:
            raw = meta.read(MAX_META_BYTES + 1)
        if len(raw) > MAX_META_BYTES or not stat.S_ISDIR(rootfs.st_mode):
            raise ValueError("not an image directory")
        return json.loads(raw)
    except (OSError, ValueError) as exc:
        raise errors.BadRequest(f"the image from {source_url} has no readable image.json and rootfs") from exc


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def _receive(name: str, url: str, authorization: str, dest: Path, limit_bytes: int) -> None:
    """Streams the source's tar of the image into ``unpack`` (in a thread: the unpacking blocks), at
    most ``limit_bytes`` of it."""
    try:
        with (
            httpx.Client(timeout=FETCH_TIMEOUT) as http,
            http.stream("GET", url, headers={"Authorization": authorization}) as response,
        ):
            if response.status_code != 200:
                body = response.read().decode(errors="replace")[:300]
                raise errors.BadRequest(f"{url} answered {response.status_code}: {body}")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit_bytes:
                raise ImageTooLargeError(limit_bytes)
            chunks = _ChunkReader(response.iter_bytes(CHUNK_BYTES), limit_bytes)
            unpack(io.BufferedReader(chunks, CHUNK_BYTES), dest, limit_bytes)
    except ImageTooLargeError as exc:
        raise errors.PayloadTooLarge(f"fetching {name} from {url}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise errors.BadRequest(f"fetching {name} from {url}: {exc}") from exc
    except (tarfile.TarError, TenantPathError, UnpackError, OSError) as exc:
        raise errors.BadRequest(f"unpacking {name} from {url}: {exc}") from exc


class _ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (an HTTP body), for ``tarfile``."""

    def __init__(self, chunks: Iterator[bytes], limit_bytes: int) -> None:
        self._chunks = chunks
        self._chunk = memoryview(b"")
        self._left = limit_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._chunk = memoryview(chunk)
            self._left -= len(chunk)
            if self._left < 0:
                raise ImageTooLargeError(None)
        size = min(len(buffer), len(self._chunk))
        buffer[:size] = self._chunk[:size]
        self._chunk = self._chunk[size:]
        return size


class UnpackError(ValueError):
    """A member the image's tar may not hold; the fetch is refused with its name."""


class ImageTooLargeError(UnpackError):
    """The image passed the fetch's bound (413)."""

    def __init__(self, limit_bytes: int | None) -> None:
        super().__init__(
            "the image is over the fetch's limit" + (f" of {limit_bytes} bytes" if limit_bytes else "")
        )


def _member_path(name: str) -> str:
    """The member's path inside the image directory: ``image.json`` or under ``rootfs``."""
    parts = [part for part in name.split("/") if part and part != "."]
    if name.startswith("/") or ".." in parts or not parts:
        raise UnpackError(f"member {name!r} lies outside the image")
    if parts[0] != "rootfs" and parts != ["image.json"]:
        raise UnpackError(f"member {name!r} is neither image.json nor under rootfs/")
    return "/".join(parts)


def unpack(stream: IO[bytes], dest: Path, limit_bytes: int | None = None) -> int:
    """Unpacks an image's tar into the empty directory ``dest`` as ``tar -xp --numeric-owner`` would
    (owners, modes with their set-id bits, times), writing every member through ``drivers/storage/safepaths``
    (module docstring); directories get their owner, mode and times last. Returns how many device
    nodes were dropped. Past ``limit_bytes`` of members (their declared sizes, and a block for each
    one's header) it stops with ``ImageTooLargeError``."""
    directories: list[tuple[str, tarfile.TarInfo]] = []
    dropped = 0
    left = limit_bytes
    with Tree.open(dest, follow_symlinks=False) as tree, tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            if left is not None:
                left -= tarfile.BLOCKSIZE + (member.size if member.isreg() else 0)
                if left < 0:
                    raise ImageTooLargeError(limit_bytes)
            path = _member_path(member.name)
            if path == "image.json" and not member.isreg():
                raise UnpackError("image.json is not a regular file")
            if path == "rootfs" and not member.isdir():
                raise UnpackError("rootfs is not a directory")
            if member.isdir():
                with tree.parent(path) as (fd, leaf), contextlib.suppress(FileExistsError):
                    os.mkdir(leaf, 0o700, dir_fd=fd)
                directories.append((path, member))
            elif member.isreg():
                data = archive.extractfile(member)
                assert data is not None
                with tree.parent(path) as (fd, leaf):
                    _clear(fd, leaf)
                    out = os.open(
                        leaf,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o600,
                        dir_fd=fd,
                    )
                    try:
                        while chunk := data.read(CHUNK_BYTES):
                            os.write(out, chunk)
                        _own(out, member)
                    finally:
                        os.close(out)
            elif member.issym():
                with tree.parent(path) as (fd, leaf):
                    _clear(fd, leaf)
                    os.symlink(member.linkname, leaf, dir_fd=fd)
                    os.chown(leaf, member.uid, member.gid, dir_fd=fd, follow_symlinks=False)
                    os.utime(leaf, ns=_times(member), dir_fd=fd, follow_symlinks=False)
            elif member.islnk():
                target = _member_path(member.linkname)
                with tree.parent(target) as (source_fd, source_leaf), tree.parent(path) as (fd, leaf):
                    _clear(fd, leaf)
                    os.link(source_leaf, leaf, src_dir_fd=source_fd, dst_dir_fd=fd, follow_symlinks=False)
            elif member.isfifo():
                with tree.parent(path) as (fd, leaf):
                    _clear(fd, leaf)
                    os.mkfifo(leaf, 0o600, dir_fd=fd)
                    os.chown(leaf, member.uid, member.gid, dir_fd=fd, follow_symlinks=False)
                    os.chmod(leaf, member.mode & 0o777, dir_fd=fd)  # a FIFO is not a symlink
            else:  # character and block devices
                dropped += 1
        for path, member in reversed(directories):  # children before parents: their times stay
            with tree.directory(path) as fd:
                _own(fd, member)
    return dropped


def _clear(dir_fd: int, leaf: str) -> None:
    """Makes room for a member given again (a later one replaces it, as with ``tar -x``)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(leaf, dir_fd=dir_fd)


def _own(fd: int, member: tarfile.TarInfo) -> None:
    os.fchown(fd, member.uid, member.gid)
    os.fchmod(fd, member.mode & 0o7777)  # after the chown, which clears set-id bits
    os.utime(fd, ns=_times(member))


def _times(member: tarfile.TarInfo) -> tuple[int, int]:
    mtime_ns = int(member.mtime * 1_000_000_000)
    return mtime_ns, mtime_ns
