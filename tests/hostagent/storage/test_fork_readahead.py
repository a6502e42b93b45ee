"""A fork's disk mount finds what it reads already read (drivers/storage/xfsreadahead.py).

The disk store reads the host's disk with direct I/O and a fork's image is a new file, so every block
an XFS mount of the clone reads was a read of the host's disk, one after the other (~25-40 of them,
~5 ms of a ~9 ms mount). The fork reads them ahead, all at once, right after the clone. These tests
build a store and a source disk as the agent does and count what the mount still reads from the store.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from paddock_hostagent.drivers.storage import loops, mounts, rootdisks, xfsreadahead
from paddock_hostagent.drivers.storage.rootdisks import Disk
from paddock_hostagent.drivers.system.commands import run_sync

pytestmark = pytest.mark.root


@dataclass
class Store:
    directory: Path
    device: str

    def reads(self) -> int:
        """Reads the store's device has completed."""
        name = os.path.basename(self.device)
        fields = Path(f"/sys/block/{name}/stat").read_text().split()
        return int(fields[0])

    def settle(self, timeout_s: float = 5.0) -> None:
        """Waits until no read or write of the store's device is in flight."""
        name = os.path.basename(self.device)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if Path(f"/sys/block/{name}/inflight").read_text().split() == ["0", "0"]:
                return
            time.sleep(0.005)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An XFS store with reflink on a direct-I/O loop device, as ``rootdisks.open_store`` makes one."""
    backing = tmp_path / "disks.xfs"
    with open(backing, "wb") as image:
        image.truncate(2 << 30)
    run_sync(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", str(backing)])
    device = asyncio.run(loops.attach(backing, direct_io=True))
    directory = tmp_path / "disks"
    directory.mkdir()
    try:
        mounts.mount(device, directory, "xfs")
        try:
            yield Store(directory, device)
        finally:
            mounts.unmount(directory)
    finally:
        asyncio.run(loops.detach(device))


def _disk(store: Store, tmp_path: Path, name: str) -> Disk:
    return Disk(store.directory / f"{name}.img", tmp_path / name, "xfs")


@pytest.fixture
def source(store: Store, tmp_path: Path) -> Iterator[Disk]:
    """A sandbox disk holding a file, with its writes synced (as a frozen source's are before a fork)."""
    disk = _disk(store, tmp_path, "source")
    asyncio.run(rootdisks.format_image(disk.image_path, 1024, "xfs"))
    asyncio.run(rootdisks.attach(disk))
    try:
        (disk.upper_dir / "data").write_bytes(os.urandom(8 << 20))
        mounts.sync_filesystem(disk.mount_dir)
        yield disk
    finally:
        asyncio.run(rootdisks.detach(disk))


def _mount_reads(store: Store, source: Disk, clone: Disk, *, read_ahead: bool) -> int:
    """Clones ``source`` to ``clone`` (reading ahead or not), then mounts the clone: what the mount
    read from the store."""
    reads = xfsreadahead.mount_reads_of(source.mount_dir, source.loop_device)
    rootdisks.clone_file(source.image_path, clone.image_path)
    if read_ahead:
        xfsreadahead.read_ahead(clone.image_path, reads)
    store.settle()
    before = store.reads()
    asyncio.run(rootdisks.attach(clone))
    try:
        assert (clone.upper_dir / "data").stat().st_size == 8 << 20
        return store.reads() - before
    finally:
        asyncio.run(rootdisks.detach(clone))
        clone.image_path.unlink()


def test_a_clone_read_ahead_mounts_without_reading_the_store(
    store: Store, source: Disk, tmp_path: Path
) -> None:
    cold = _mount_reads(store, source, _disk(store, tmp_path, "cold"), read_ahead=False)
    warm = _mount_reads(store, source, _disk(store, tmp_path, "warm"), read_ahead=True)
    assert cold >= 10, cold  # what the read-ahead spares
    assert warm <= 1, warm


@pytest.mark.serial  # XFS's log worker every 30 s (its fixture): the log stays long for both clones
def test_the_read_ahead_covers_a_long_log_to_replay(
    store: Store, source: Disk, tmp_path: Path, xfs_log_worker_every_30_s: None
) -> None:
    """Many metadata changes since the log's tail: the mount replays them, and finds them read."""
    many = source.upper_dir / "many"
    many.mkdir()
    for index in range(10000):
        (many / str(index)).write_bytes(b"")
    mounts.sync_filesystem(source.mount_dir)
    position = xfsreadahead.log_position(source.loop_device)
    assert position is not None and position.head - position.tail > 4096  # beyond the check's window
    warm = _mount_reads(store, source, _disk(store, tmp_path, "warm"), read_ahead=True)
    cold = _mount_reads(store, source, _disk(store, tmp_path, "cold"), read_ahead=False)
    assert warm * 4 < cold, (warm, cold)


def test_the_logs_window_wraps_only_once_the_log_has_wrapped() -> None:
    shape = xfsreadahead.XfsGeometry(
        block_size=4096,
        ag_blocks=1 << 16,
        ag_count=4,
        data_blocks=1 << 18,
        log_offset=1 << 28,
        log_bytes=8 << 20,
    )
    log_end = shape.log_offset + shape.log_bytes
    young = xfsreadahead.mount_reads(shape, xfsreadahead.LogPosition(head=100, tail=2, cycle=1))
    wrapped = xfsreadahead.mount_reads(shape, xfsreadahead.LogPosition(head=100, tail=2, cycle=5))
    # Both read the log's last block (the search for the head starts there); only a wrapped log's
    # window reaches back past its start into its end.
    assert [r for r in young if r[0] + r[1] == log_end] == [(log_end - 512, 512)]
    behind = (4096 - 100) * xfsreadahead.BASIC_BLOCK
    assert (log_end - behind, behind) in wrapped
    assert all(offset >= 0 and length > 0 for offset, length in young + wrapped)
