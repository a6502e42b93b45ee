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

Only templates travel: catalog images are built by each host from the Debian archive. Container-tier
snapshots travel too, by the same routes (``/images/snap_…``), as their disk image's data extents
(below): a host asked to boot one it does not keep fetches it from the host that does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import re
import secrets
import shutil
import stat
import struct
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

import httpx

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import SnapshotInfo
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
        "tar", "-C", str(root), "--numeric-owner", "--warning=no-file-changed", "-cf", "-", "image.json", "rootfs",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip

    async def chunks() -> AsyncIterator[bytes]:
        assert process.stdout is not None
        try:
            while chunk := await process.stdout.read(CHUNK_BYTES):
                yield chunk
            # 1 is "a file changed as it was read": its inode's ctime moved. An installed template's
            # files never change, but most are hard links to its base's tree, whose link counts (and
            # so ctimes) move whenever another build on the host links or removes a tree over the
            # same base (``builds.py``'s export): that failed the fetch, and with it a boot on
            # another host, though every byte sent was right. 2 is an error: a file not read whole.
            if await process.wait() not in (0, 1):  # the receiver sees a short tar and refuses it
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


@contextlib.contextmanager
def _fetched(name: str, url: str, authorization: str, limit_bytes: int) -> Iterator[io.BufferedReader]:
    """The body of another agent's answer at ``url``, read as it comes and refused past
    ``limit_bytes`` (an image's tar, a snapshot's extents); its errors are this API's: a refusal or
    a broken transfer is a 400, a body too large a 413."""
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
            yield io.BufferedReader(chunks, CHUNK_BYTES)
    except ImageTooLargeError as exc:
        raise errors.PayloadTooLarge(f"fetching {name} from {url}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise errors.BadRequest(f"fetching {name} from {url}: {exc}") from exc


def _receive(name: str, url: str, authorization: str, dest: Path, limit_bytes: int) -> None:
    """Streams the source's tar of the image into ``unpack`` (in a thread: the unpacking blocks), at
    most ``limit_bytes`` of it."""
    try:
        with _fetched(name, url, authorization, limit_bytes) as reader:
            unpack(reader, dest, limit_bytes)
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


# -- snapshots between hosts -------------------------------------------------------------------------
#
# A container-tier snapshot (``<store>/snapshots/<id>/disk.img`` and ``meta.json``, docs/snapshots.md)
# travels as one stream: a line of JSON describing it (its id, image, filesystem, disk size), then its
# image's data extents, each a header (offset and length, two big-endian 64-bit integers) and that
# many bytes, and last a header at the image's end with no bytes. Holes are not sent: a 10 GiB disk
# that holds 100 MB sends about 100 MB, and the copy is as sparse as the original.

SNAPSHOT_PREFIX = "snap_"
_EXTENT = struct.Struct(">QQ")
MAX_SNAPSHOT_META_BYTES = 4096
_SNAPSHOT_ID = re.compile(r"^snap_[A-Za-z0-9]{1,64}$")
_IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,127}$")
MAX_DISK_MIB = 1 << 24  # 16 TiB: a bound on what a peer may declare, far above any plan's disk


@runtime_checkable
class SnapshotStore(Protocol):
    """A runtime that keeps container-tier snapshots in a directory of its disk store (the OCI driver)."""

    async def snapshot_store(self) -> Path:
        """The store's snapshots directory, the store opened."""
        ...


async def snapshots_dir_of(runtime: object) -> Path:
    """Where a fetched snapshot goes on this host; 409 on a tier that keeps none this way (a VM snapshot
    holds memory too, and is not fetched)."""
    if not isinstance(runtime, SnapshotStore):
        raise errors.UnsupportedOnTier("this host's tier does not fetch snapshots from other hosts")
    return await runtime.snapshot_store()


def is_snapshot(name: str) -> bool:
    """Whether ``GET``/``fetch`` of ``/images/{name}`` names a snapshot rather than a template's image."""
    return name.startswith(SNAPSHOT_PREFIX)


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The (offset, length) of each run of data in the file, holes skipped (``SEEK_DATA``/``SEEK_HOLE``)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                return
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end - start
        offset = end


async def stream_snapshot(info: SnapshotInfo | None, name: str) -> AsyncIterator[bytes]:
    """The snapshot as the stream above; 404 (``SnapshotNotFound``) before the first byte when it is not
    on this host (a VM snapshot, which holds memory too, is not served: ``path`` is no ``disk.img``)."""
    if info is None or not _SNAPSHOT_ID.match(name) or info.path.name != "disk.img":
        raise errors.SnapshotNotFound(f"snapshot {name} is not on this host")
    try:
        fd = os.open(info.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise errors.SnapshotNotFound(f"snapshot {name} is not on this host") from None
    size = os.fstat(fd).st_size
    meta = {"id": name, "image": info.image, "fs": info.fs, "disk_mib": info.disk_mib, "size": size}

    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield json.dumps(meta).encode() + b"\n"
            extents = await asyncio.to_thread(lambda: list(_data_extents(fd, size)))
            for start, length in extents:
                yield _EXTENT.pack(start, length)
                done = 0
                while done < length:
                    chunk = await asyncio.to_thread(
                        os.pread, fd, min(CHUNK_BYTES, length - done), start + done
                    )
                    if not chunk:
                        raise OSError(f"snapshot {name} ended at {start + done} while it is sent")
                    yield chunk
                    done += len(chunk)
            yield _EXTENT.pack(size, 0)
        finally:
            os.close(fd)

    return chunks()


class SnapshotFetcher:
    """Copies a snapshot from the host that keeps it into this host's store (``snapshots_dir``), under
    ``.partial-<id>`` first (removed at the agent's next start if it dies half-way) and renamed into place
    once the image and ``meta.json`` are on disk, as a snapshot taken here is. Fetches of one snapshot
    are serialized; one already here answers at once."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._locks: dict[str, asyncio.Lock] = {}

    async def fetch(
        self,
        name: str,
        source_url: str,
        authorization: str,
        snapshots_dir: Path,
        limit_bytes: int | None = None,
    ) -> None:
        if not _SNAPSHOT_ID.match(name):
            raise errors.BadRequest(f"{name!r} is not a snapshot id")
        limit = min(self.max_bytes, limit_bytes or self.max_bytes)
        async with self._locks.setdefault(name, asyncio.Lock()):
            final = snapshots_dir / name
            if (final / "meta.json").is_file():
                return
            partial = snapshots_dir / f".partial-{name}"
            await asyncio.to_thread(shutil.rmtree, partial, True)
            partial.mkdir(parents=True)
            try:
                url = f"{source_url.rstrip('/')}/internal/v1/images/{name}"
                await asyncio.to_thread(_receive_snapshot, name, url, authorization, partial, limit)
                partial.replace(final)
                _fsync_dir(snapshots_dir)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, partial, True)
                raise
        log.info("snapshot_fetched", snapshot_id=name, source=source_url)


def _receive_snapshot(name: str, url: str, authorization: str, partial: Path, limit_bytes: int) -> None:
    try:
        with _fetched(name, url, authorization, limit_bytes) as reader:
            meta = _snapshot_meta(reader.readline(MAX_SNAPSHOT_META_BYTES + 1), name, url)
            _write_extents(reader, partial / "disk.img", int(meta["size"]))
            with open(partial / "meta.json", "x") as out:
                json.dump({key: meta[key] for key in ("id", "image", "fs", "disk_mib")}, out)
                out.flush()
                os.fsync(out.fileno())
            _fsync_dir(partial)
    except (UnpackError, OSError) as exc:
        raise errors.BadRequest(f"receiving {name} from {url}: {exc}") from exc


def _snapshot_meta(line: bytes, name: str, url: str) -> dict[str, Any]:
    """The stream's first line, checked field by field (a peer's word, written into this host's store)."""
    try:
        if len(line) > MAX_SNAPSHOT_META_BYTES or not line.endswith(b"\n"):
            raise ValueError("no description line")
        meta = json.loads(line)
        disk_mib = meta["disk_mib"]
        ok = (
            meta["id"] == name
            and meta["fs"] in ("xfs", "ext4")
            and isinstance(meta["image"], str)
            and _IMAGE_NAME.match(meta["image"]) is not None
            and isinstance(disk_mib, int)
            and 0 < disk_mib <= MAX_DISK_MIB
            and meta["size"] == disk_mib * (1 << 20)
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise errors.BadRequest(f"{url} sent no snapshot description: {exc}") from exc
    if not ok:
        raise errors.BadRequest(f"{url} sent a description that is not of snapshot {name}")
    return dict(meta)


def _write_extents(reader: IO[bytes], target: Path, size: int) -> None:
    """Writes the stream's extents into a new sparse file of ``size`` bytes, then syncs it. Extents must
    come in order, inside the image; the stream must end with the end header."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        position = 0
        while True:
            header = reader.read(_EXTENT.size)
            if len(header) != _EXTENT.size:
                raise UnpackError("the snapshot's stream ended before its last extent")
            offset, length = _EXTENT.unpack(header)
            if length == 0 and offset == size:
                break
            if offset < position or length == 0 or offset + length > size:
                raise UnpackError(f"an extent at {offset} of {length} bytes lies outside the image")
            left = length
            while left:
                chunk = reader.read(min(CHUNK_BYTES, left))
                if not chunk:
                    raise UnpackError("the snapshot's stream ended inside an extent")
                os.pwrite(fd, chunk, offset + length - left)
                left -= len(chunk)
            position = offset + length
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
