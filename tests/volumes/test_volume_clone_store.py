"""A volume's copy for a fork (``VolumeStore.clone``, ``include_volumes``) on real loop devices and XFS:
the copy of a mounted volume holds what was written, mounts beside its source (same XFS UUID: the
host mounts ``nouuid``), and the two diverge. The test's tmp filesystem does not reflink, so the copy
is one of the data with the holes kept (where it reflinks, ``FICLONE`` shares the blocks instead)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.storage import mounts
from paddock_hostagent.drivers.storage.volumes import VolumeStore

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("mkfs.xfs") is None, reason="needs root and mkfs.xfs"
    ),
]

SOURCE = "vol_01TESTVOLUMECLONE000000000A"
COPY = "vol_01TESTVOLUMECLONE000000000B"


async def _emptied(store: VolumeStore) -> None:
    for meta in store.all():
        meta.holders = []
        store.save(meta)
        await store.delete(meta.id)
    assert not any(
        str(store.directory) in line for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


@pytest.fixture
async def plain_store(tmp_path: Path) -> AsyncIterator[VolumeStore]:
    made = VolumeStore(tmp_path / "volumes")
    yield made
    await _emptied(made)


async def _copy_of_a_mounted_volume(store: VolumeStore) -> bool:
    await store.create(SOURCE, 1024)
    await store.mount_on_host(SOURCE)
    (store.mount_dir(SOURCE) / "f.txt").write_text("before\n")  # not synced: the freeze writes it
    meta, shared = await store.clone(SOURCE, COPY)
    assert meta.id == COPY and meta.size_mib == 1024 and meta.holders == []
    assert not list(store.directory.glob(".partial-*"))
    assert (await store.clone(SOURCE, COPY))[0] == store.load(COPY)  # again: what is there
    # The source was thawed: it takes writes again.
    (store.mount_dir(SOURCE) / "after.txt").write_text("source only\n")
    await store.mount_on_host(COPY)  # beside its source, the same XFS UUID
    assert (store.mount_dir(COPY) / "f.txt").read_text() == "before\n"
    assert not (store.mount_dir(COPY) / "after.txt").exists()
    (store.mount_dir(COPY) / "copy.txt").write_text("copy only\n")
    assert not (store.mount_dir(SOURCE) / "copy.txt").exists()
    assert mounts.top_fstype(store.mount_dir(COPY)) == "xfs"
    await store.unmount_on_host(COPY)
    await store.unmount_on_host(SOURCE)
    return shared


async def test_a_copy_on_a_filesystem_without_reflink_holds_the_data(plain_store: VolumeStore) -> None:
    assert await _copy_of_a_mounted_volume(plain_store) is False
    assert plain_store.used_bytes(COPY) < 256 << 20  # the holes kept: not the 1 GiB
