"""Builder storage per owner: buildah's images, layer cache and working containers for one account,
on a filesystem of their own.

Each owner (the account the control plane names in a build) gets an ext4 filesystem in a sparse file
(``<root>/stores/<owner>.ext4``) on a loop device, mounted at ``<root>/stores/<owner>/`` while a build or
a clean-up uses it. buildah's ``--root`` is on it, so:

- no other account's image is in the store a build resolves names and image-id prefixes in
  (``COPY --from=<id prefix>``, a second ``FROM``);
- a RUN step's root is an overlay whose upper layer is on that filesystem: it sees the filesystem's
  size, and writing past it fails with ENOSPC instead of filling the host's disk;
- everything a build leaves (working containers, mounts, cache) is inside it: when the last user lets go,
  working containers are removed, what containers/storage left mounted is unmounted, and the filesystem
  is unmounted and its loop device detached.

The size is the one asked by the first build that creates the store; a later build asking for more grows
it (``resize2fs`` online). A store past ``PRUNE_AT`` full drops its layer cache before a build.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.build.buildah import Buildah
from paddock_hostagent.drivers.build.layers import stands_on_missing_layers
from paddock_hostagent.drivers.storage import loops, mounts
from paddock_hostagent.drivers.storage.rootdisks import loop_of, unmount_image
from paddock_hostagent.drivers.system.commands import run

log = get_logger(__name__)

MIB = 1024 * 1024
OWNER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MS_NOATIME = 1024
#: A store fuller than this (used / size) drops its layer cache before the next build.
PRUNE_AT = 0.75


@dataclass
class _Open:
    buildah: Buildah
    device: str
    users: int = 0


class BuildStores:
    def __init__(self, root: Path, runtime: str, *, image_store: Path | None = None) -> None:
        """``image_store``: the catalog's images (``basestore.py``), which every store reads and none
        writes."""
        self.root = root
        self.runtime = runtime
        self.image_store = image_store
        self._open: dict[str, _Open] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: Per owner, the tags known to be in its store: kept while it is unmounted between builds, so
        #: a build does not spawn ``buildah inspect`` again for a base it imported before.
        self._present: dict[str, set[str]] = {}

    def _paths(self, owner: str) -> tuple[Path, Path]:
        if not OWNER.fullmatch(owner):
            raise DriverError(f"not a store owner: {owner!r}")
        stores = self.root / "stores"
        return stores / f"{owner}.ext4", stores / owner

    def exists(self, owner: str) -> bool:
        return self._paths(owner)[0].exists()

    @contextlib.asynccontextmanager
    async def open(self, owner: str, size_mib: int | None = None) -> AsyncIterator[Buildah]:
        """The owner's store, mounted (created at ``size_mib`` if missing, grown to it if smaller) for
        the time of the block; the last user out cleans it and takes it down."""
        lock = self._locks.setdefault(owner, asyncio.Lock())
        async with lock:
            current = self._open.get(owner)
            if current is None:
                current = await self._mount(owner, size_mib)
                self._open[owner] = current
            elif size_mib is not None:
                await self._grow(owner, current.device, size_mib)
            current.users += 1
        try:
            yield current.buildah
        finally:
            async with lock:
                current.users -= 1
                if current.users == 0:
                    del self._open[owner]
                    await self._unmount(owner, current)

    async def close(self) -> None:
        """Takes every store down (agent shutdown): their builds were cancelled before."""
        for owner, current in list(self._open.items()):
            self._open.pop(owner, None)
            with contextlib.suppress(Exception):
                await self._unmount(owner, current)

    def usage(self, owner: str) -> tuple[int, int]:
        """(bytes used, bytes in all) of a mounted store."""
        stats = os.statvfs(self._paths(owner)[1])
        return (stats.f_blocks - stats.f_bfree) * stats.f_frsize, stats.f_blocks * stats.f_frsize

    async def _mount(self, owner: str, size_mib: int | None) -> _Open:
        image, directory = self._paths(owner)
        directory.mkdir(parents=True, exist_ok=True)
        if not image.exists():
            if size_mib is None:
                raise DriverError(f"no builder store for {owner}")
            partial = image.with_suffix(".partial")
            with open(partial, "wb") as handle:
                handle.truncate(size_mib * MIB)
            await run(
                ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", "-L", "pdk-build", str(partial)]
            )
            partial.replace(image)
        device = await loop_of(image)
        if not mounts.is_mountpoint(directory):
            try:
                mounts.mount(device, directory, "ext4", flags=MS_NOATIME)
            except DriverError:
                await loops.detach(device)
                raise
        buildah = Buildah(
            directory / "storage",
            self.runtime,
            runroot=self.root / "run" / owner,
            present=self._present.setdefault(owner, set()),
            image_store=self.image_store,
        )
        opened = _Open(buildah, device)
        if size_mib is not None:
            await self._grow(owner, device, size_mib)
        if self.image_store is not None and stands_on_missing_layers(buildah.storage, self.image_store):
            # The catalog store lost an image this store's cache or templates stood on (removed by
            # hand, or a tag dropped as its tree changed): buildah cannot list such a store, so it
            # starts empty; a template base is imported again when a build needs it.
            log.warning("build_store_reset", owner=owner, reason="its images stand on catalog layers gone")
            await buildah.remove_all_images()
        used, total = self.usage(owner)
        if total and used / total > PRUNE_AT:
            log.info("build_store_pruned", owner=owner, used_bytes=used, size_bytes=total)
            await buildah.remove_all_images()
        return opened

    async def _grow(self, owner: str, device: str, size_mib: int) -> None:
        image, _ = self._paths(owner)
        if image.stat().st_size >= size_mib * MIB:
            return
        with open(image, "r+b") as handle:
            handle.truncate(size_mib * MIB)
        await run(["losetup", "--set-capacity", device])
        await run(["resize2fs", device])
        log.info("build_store_grown", owner=owner, size_mib=size_mib)

    async def _unmount(self, owner: str, current: _Open) -> None:
        image, directory = self._paths(owner)
        await current.buildah.release()
        await unmount_image(directory, image)
        with contextlib.suppress(OSError):
            directory.rmdir()

    async def remove(self, owner: str) -> None:
        """Deletes an owner's store (none of its builds may run)."""
        image, directory = self._paths(owner)
        if owner in self._open:
            return
        self._present.pop(owner, None)
        await unmount_image(directory, image)
        image.unlink(missing_ok=True)
