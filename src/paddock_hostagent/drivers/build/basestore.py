"""The catalog's images as buildah images, once per host: the store every account's builds read their
catalog base from.

A template ``FROM debian:13`` (or ``devbox:1``, E2B's ``base``) needs its base as a local image in the
store buildah builds in. Each account builds in a store of its own (``buildstore.py``), and importing a
catalog tree there cost every account's first build on a host 3-7 s for ``debian:13`` and 26-52 s for
``devbox:1``'s 1 GB (a copy of the tree, then ``buildah commit``'s diff, digest and second copy), and
that much of the account's store.

Here the catalog's trees are imported once per host, into one store beside the image cache
(``<image_dir>/.builder-base``), and each account's buildah is given it as an *additional image
store* (``--storage-opt overlay.imagestore=``):

- containers/storage opens an additional store read-only: a build resolves names in it and stacks its
  layers under the build's own, and everything the build writes (its layers, cache, working
  containers) lands in the account's store, as before;
- a RUN step's root is an overlay whose lower layers are the base's: read-only to the step;
- only catalog images, which Paddock makes from Debian's packages (``images.py``), are ever imported
  here; a template used as a base (a tenant's image) is imported into its own account's store, as
  before, so no name or id prefix in this store resolves to a tenant's image (docs/security.md);
- a tag names the tree it holds (``base_tag``: the catalog name and a digest of
  ``ImageStore.tree_ident``), so a catalog image rebuilt on the host is imported under a new tag and a
  build never stands on a stale one. The older import is then removed (each holds a whole tree); an
  account's store whose cache stood on it can no longer be listed by buildah, so it is emptied at its
  next open (``buildstore.py``) and its cache is built again.

Imports are serialized across processes by a lock file (agents sharing an image cache, as the test
suite's do), and an import first removes what a killed one left (working containers, mounts)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.build.buildah import Buildah

log = get_logger(__name__)

LOCK_FILE = "import.lock"


def base_tag(slug: str, ident: str) -> str:
    """buildah's name for the catalog image whose directory name is ``slug`` (``images.slug``: the
    drivers do not import the agent's modules), holding the host tree ``ident``."""
    return f"localhost/paddock-base/{slug}:{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


class CatalogBases:
    def __init__(self, root: Path, runtime: str) -> None:
        self.root = root
        self.buildah = Buildah(root, runtime)
        self._lock = asyncio.Lock()

    @property
    def storage(self) -> Path:
        """The store's ``--root``: what accounts' builds get as their additional image store."""
        return self.buildah.storage

    async def offer(self, name: str, slug: str, tree: Path, ident: str, say: Callable[[str], None]) -> str:
        """The tag of catalog image ``name`` (``slug`` its directory's name, its tree ``tree`` on this
        host, ``ident`` its ``tree_ident``), imported first if this host's store lacks it."""
        tag = base_tag(slug, ident)
        if self.buildah.knows(tag):
            return tag
        async with self._lock, self._import_lock():
            if await self.buildah.has_image(tag):
                return tag
            await self.buildah.release()  # a killed import's working container and mounts
            say(f"importing base image {name} (once per host)")
            await self.buildah.import_tree(tag, tree, ident)
            await self._drop_older(slug, tag)
        return tag

    async def _drop_older(self, slug: str, current: str) -> None:
        """Removes the image's older imports: the host's tree was rebuilt (an agent whose recipe
        changed), so no new build stands on them, and each held a whole tree. An account's store whose
        cache stood on one is emptied at its next open (``buildstore.py``)."""
        for name in await self.buildah.names(current.rpartition(":")[0]):
            if name != current:
                await self.buildah.remove(name)
                log.info("catalog_base_dropped", image=slug, tag=name)

    @contextlib.asynccontextmanager
    async def _import_lock(self) -> AsyncIterator[None]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # lets the lock go
