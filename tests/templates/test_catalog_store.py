"""The host's catalog store (``drivers/build/basestore.py``) with real buildah, on scratch directories:
a catalog image imported once and read by an account's store as an additional image store; an
account's store whose images stood on a catalog image the host no longer holds starts empty at its
next use (``buildstore.py``), where buildah could no longer list it; a rebuilt tree is imported under
a new tag, and the older import removed."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from paddock_hostagent.drivers.build.basestore import CatalogBases
from paddock_hostagent.drivers.build.buildstore import BuildStores
from paddock_hostagent.drivers.build.layers import layers_above

pytestmark = [pytest.mark.root, pytest.mark.slow]

RUNTIME = "/usr/bin/crun"
OWNER = "acct_catalog_probe"


def account_buildah(
    stores: BuildStores, catalog: CatalogBases, *args: str
) -> subprocess.CompletedProcess[str]:
    """buildah on the account's store (mounted) as the agent runs it, reading the catalog store."""
    storage = stores.root / "stores" / OWNER / "storage"
    return subprocess.run(
        ["buildah", "--root", str(storage), "--runroot", str(stores.root / "run" / OWNER),
         "--storage-driver", "overlay", "--storage-opt", f"overlay.imagestore={catalog.storage}", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def catalog_state(catalog: CatalogBases) -> tuple[bytes, bytes]:
    return (
        (catalog.storage / "overlay-images" / "images.json").read_bytes(),
        (catalog.storage / "overlay-layers" / "layers.json").read_bytes(),
    )


def test_an_account_reads_the_catalog_import_and_a_store_that_lost_its_base_starts_empty(
    debian_image: Path, tmp_path: Path
) -> None:
    catalog = CatalogBases(tmp_path / "catalog", RUNTIME)
    stores = BuildStores(tmp_path / "builder", RUNTIME, image_store=catalog.storage)
    said: list[str] = []
    tree = debian_image if (debian_image / "etc").is_dir() else debian_image / "rootfs"

    async def scenario() -> None:
        tag = await catalog.offer("debian:13", "debian_13", tree, "tree-1", said.append)
        assert said == ["importing base image debian:13 (once per host)"]
        assert await catalog.offer("debian:13", "debian_13", tree, "tree-1", said.append) == tag
        assert len(said) == 1  # imported once
        assert catalog.buildah.recorded_tree(tag) == "tree-1"
        before = catalog_state(catalog)
        try:
            async with stores.open(OWNER, 256):
                made = account_buildah(stores, catalog, "from", "--pull-never", tag)
                assert made.returncode == 0, made.stderr
                container = made.stdout.strip().splitlines()[-1]
                committed = account_buildah(
                    stores, catalog, "commit", "--quiet", container, "localhost/mine:latest"
                )
                assert committed.returncode == 0, committed.stderr
                account_buildah(stores, catalog, "rm", container)
                storage = stores.root / "stores" / OWNER / "storage"
                (layer,) = layers_above(storage, "localhost/mine:latest", tag, catalog.storage) or [None]
                assert layer is not None and layer.parent.parent == storage / "overlay"
            assert catalog_state(catalog) == before  # the account's work wrote nothing there
            await catalog.buildah.remove(tag)  # the catalog store lost the image the account's stood on
            async with stores.open(OWNER, 256):
                listed = account_buildah(stores, catalog, "images", "--format", "{{.Name}}")
                assert listed.returncode == 0, listed.stderr
                assert "localhost/mine" not in listed.stdout
                again = await catalog.offer("debian:13", "debian_13", tree, "tree-1", said.append)
                made = account_buildah(stores, catalog, "from", "--pull-never", again)
                assert made.returncode == 0, made.stderr
                account_buildah(stores, catalog, "rm", made.stdout.strip().splitlines()[-1])
            # The host's tree rebuilt (another ident): imported under a new tag, the older one removed.
            newer = await catalog.offer("debian:13", "debian_13", tree, "tree-2", said.append)
            assert newer != again and said[-1] == "importing base image debian:13 (once per host)"
            assert [
                name
                for name in await catalog.buildah.names("localhost/paddock-base/debian_13")
                if "debian_13" in name
            ] == [newer]
        finally:
            await stores.close()
            await stores.remove(OWNER)
            await catalog.buildah.release()
            await catalog.buildah.remove_all_images()

    asyncio.run(scenario())
