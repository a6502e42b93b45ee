"""A volume's copy for a fork (``VolumeStore.clone``, ``include_volumes``) on real loop devices and XFS:
the copy of a mounted volume holds what was written, mounts beside its source (same XFS UUID: the
host mounts ``nouuid``), and the two diverge. On a filesystem without reflink (the test's tmp) the copy
is one of the data with the holes kept; on one with reflink (an XFS made with ``reflink=1`` on a loop
device, as a host whose state directory is XFS has) ``FICLONE`` shares the blocks, so a copy of a full
volume takes no room and no time that grows with what the volume holds."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.storage import loops, mounts
from paddock_hostagent.drivers.storage.volumes import VolumeStore
from paddock_hostagent.drivers.system.commands import run
from tests.loopdevices import wait_released

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


@pytest.fixture
async def reflink_store(tmp_path: Path) -> AsyncIterator[VolumeStore]:
    """A store whose directory is on an XFS with reflink (a loop device on a sparse file in tmp)."""
    backing = tmp_path / "state.xfs"
    with open(backing, "wb") as image:
        image.truncate(4 << 30)
    await run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", str(backing)])
    device = await loops.attach(backing, direct_io=True)
    state = tmp_path / "state"
    state.mkdir()
    try:
        mounts.mount(device, state, "xfs")
        try:
            made = VolumeStore(state / "volumes")
            yield made
            await _emptied(made)
        finally:
            mounts.unmount(state)
    finally:
        await loops.detach(device)
    assert wait_released(
        backing
    )  # a copy of the mount held elsewhere goes in a moment (tests/loopdevices.py)


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


async def test_a_copy_on_a_reflink_filesystem_shares_the_blocks_and_takes_no_room(
    reflink_store: VolumeStore,
) -> None:
    assert await _copy_of_a_mounted_volume(reflink_store) is True
    # A volume holding 256 MiB of data: its copy shares every block, so the filesystem's free space
    # does not move by the data's size, and the copy holds the bytes.
    big, big_copy = "vol_01TESTVOLUMECLONE000000000C", "vol_01TESTVOLUMECLONE000000000D"
    await reflink_store.create(big, 1024)
    await reflink_store.mount_on_host(big)
    data = os.urandom(1 << 20) * 256
    (reflink_store.mount_dir(big) / "data.bin").write_bytes(data)
    mounts.sync_filesystem(reflink_store.mount_dir(big))  # the data in the volume's file, counted
    os.sync()
    stats = os.statvfs(reflink_store.directory)
    free_before = stats.f_bavail * stats.f_frsize
    started = time.monotonic()
    _meta, shared = await reflink_store.clone(big, big_copy)
    took_s = time.monotonic() - started
    stats = os.statvfs(reflink_store.directory)
    free_after = stats.f_bavail * stats.f_frsize
    assert shared is True
    assert free_before - free_after < 32 << 20, (free_before, free_after)
    await reflink_store.unmount_on_host(big)
    await reflink_store.mount_on_host(big_copy)
    assert (reflink_store.mount_dir(big_copy) / "data.bin").read_bytes() == data
    await reflink_store.unmount_on_host(big_copy)
    print(f"clone of a volume holding 256 MiB: {took_s * 1000:.1f} ms")
