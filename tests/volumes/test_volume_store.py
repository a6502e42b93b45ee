"""The host's volume store (``drivers/storage/volumes.py``) on real loop devices and XFS: a volume keeps
what was written across unmounts and a detach of its loop (what a reboot does), grows online, refuses
deletion while held, and an agent that died making one leaves nothing another agent would use."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.base import CapacityError, DriverError
from paddock_hostagent.drivers.storage import mounts
from paddock_hostagent.drivers.storage.nsmount import unescape
from paddock_hostagent.drivers.storage.volumes import (
    Holder,
    VolumeBusyError,
    VolumeMissingError,
    VolumeStore,
    device_number,
)

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("mkfs.xfs") is None, reason="needs root and mkfs.xfs"
    ),
]

VOLUME = "vol_01TESTVOLUME0000000000000A"


async def _until_detached(store: VolumeStore) -> None:
    """Waits for the volume's loop device to be freed. ``LOOP_CLR_FD`` on a device some other process
    has open at that moment (anything that opens devices to look at them) only marks it autoclear, and
    the kernel frees it at that opener's close: once, a full run found it still bound right after."""
    deadline = time.monotonic() + 10
    while store.device_of(VOLUME) is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert store.device_of(VOLUME) is None, "the volume's loop device was not freed within 10 s"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[VolumeStore]:
    made = VolumeStore(tmp_path / "volumes")
    yield made
    for meta in made.all():  # nothing left mounted or on a loop
        meta.holders = []
        made.save(meta)
        await made.delete(meta.id)
    assert not any(
        str(made.directory) in line for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


async def test_a_volume_keeps_its_files_across_unmount_and_loop_detach(store: VolumeStore) -> None:
    meta = await store.create(VOLUME, 512)
    assert meta.size_mib == 512 and store.image(VOLUME).stat().st_size == 512 << 20
    assert store.used_bytes(VOLUME) < 128 << 20  # sparse: XFS's metadata and log only
    device = await store.mount_on_host(VOLUME)
    assert mounts.top_fstype(store.mount_dir(VOLUME)) == "xfs" and store.device_of(VOLUME) == device
    assert await store.mount_on_host(VOLUME) == device  # already mounted: the same
    (store.mount_dir(VOLUME) / "kept.txt").write_text("kept\n")
    await store.unmount_on_host(VOLUME)
    assert not mounts.is_mountpoint(store.mount_dir(VOLUME))
    await _until_detached(store)
    assert not (store.mount_dir(VOLUME) / "kept.txt").exists()
    await store.mount_on_host(VOLUME)
    assert (store.mount_dir(VOLUME) / "kept.txt").read_text() == "kept\n"
    assert device_number(str(store.device_of(VOLUME))).count(":") == 1
    await store.unmount_on_host(VOLUME)
    assert await store.create(VOLUME, 2048) == store.load(VOLUME)  # the same id again: what is there


async def test_a_volume_grows_mounted_or_not(store: VolumeStore) -> None:
    meta = await store.create(VOLUME, 512)
    await store.grow(meta, 1024)  # not mounted: mounted for the growth, then unmounted
    assert not mounts.is_mountpoint(store.mount_dir(VOLUME))
    await store.mount_on_host(VOLUME)
    _, total = mounts.filesystem_use(store.mount_dir(VOLUME))
    assert total > 900 << 20
    await store.grow(meta, 2048)  # mounted: online
    _, total = mounts.filesystem_use(store.mount_dir(VOLUME))
    assert total > 1900 << 20 and store.load(VOLUME).size_mib == 2048
    await store.unmount_on_host(VOLUME)


async def test_a_held_volume_is_not_deleted_and_a_half_made_one_is_removed(store: VolumeStore) -> None:
    meta = await store.create(VOLUME, 512)
    meta.holders = [Holder("sb-holder", "/data", False)]
    store.save(meta)
    with pytest.raises(VolumeBusyError, match="sb-holder"):
        await store.delete(VOLUME)
    meta.holders = []
    store.save(meta)
    assert await store.delete(VOLUME) and not (store.directory / VOLUME).exists()
    assert not await store.delete(VOLUME)  # gone: no error
    with pytest.raises(VolumeMissingError):
        store.load(VOLUME)
    partial = store.directory / ".partial-vol_01HALF"
    partial.mkdir(parents=True)
    (partial / "volume.img").write_bytes(b"\0" * 4096)
    store.remove_partial()
    assert not partial.exists() and store.all() == []


async def test_ids_that_are_not_volume_ids_name_no_path(store: VolumeStore) -> None:
    for bad in ("../etc", "vol_../x", "vol_", "snap_01X", "vol_a/b"):
        with pytest.raises(VolumeMissingError):
            store.image(bad)
    with pytest.raises(DriverError):
        store.load("../../etc/passwd")


def test_mountinfo_paths_are_unescaped() -> None:
    assert unescape(r"/data\040dir/x") == "/data dir/x"
    assert unescape(r"/a\134b") == "/a\\b"
    assert unescape("/plain") == "/plain"


async def test_a_volume_larger_than_the_free_disk_is_refused_and_leaves_nothing(store: VolumeStore) -> None:
    free_mib = shutil.disk_usage(store.directory.parent).free >> 20
    with pytest.raises(CapacityError, match="does not fit"):
        await store.create(VOLUME, free_mib + 1024)
    assert store.all() == [] and list(store.directory.iterdir()) == []
    meta = await store.create(VOLUME, 512)
    with pytest.raises(CapacityError, match="does not fit"):
        await store.grow(meta, free_mib + 2048)
    assert store.load(VOLUME).size_mib == 512 and store.image(VOLUME).stat().st_size == 512 << 20
