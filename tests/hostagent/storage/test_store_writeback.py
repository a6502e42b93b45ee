"""The disk store holds little dirty, so a fork's clone does not first write back what its source synced.

A sandbox's disk drops its flushes (``loops.write_through``): what it syncs lands dirty in its image
file, in the store. ``FICLONE`` writes a file's dirty pages back before sharing its blocks, so a fork
right after its source synced 1 GiB wrote that 1 GiB to the host's disk inside the fork (280-470 ms
here). ``open_store`` bounds what the store's loop device holds dirty (``writeback.STORE_DIRTY_BYTES``),
so that writeback happens while the sandbox writes and syncs, and the clone finds at most the bound.
A fork's own sync of its source runs with the bound lifted and sends the image's pages to the disk
beside it (``writeback.sync_copied``): that data has to reach the disk before the clone anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.base import CommandFailedError
from paddock_hostagent.drivers.storage import loops, mounts, rootdisks, writeback, xfsreadahead
from paddock_hostagent.drivers.storage.rootdisks import Disk
from paddock_hostagent.host import hurry_xfs_log_worker

pytestmark = pytest.mark.root

MIB = 1 << 20


def _written_bytes(device: str) -> int:
    """What the device has written to the host's disk so far."""
    fields = Path(f"/sys/block/{os.path.basename(device)}/stat").read_text().split()
    return int(fields[6]) * 512


@pytest.fixture
def slots(tmp_path: Path) -> Iterator[Path]:
    """A slots directory whose disk store ``open_store`` made, taken down by ``close_store`` after."""
    slots_dir = tmp_path / "slots"
    slots_dir.mkdir()
    store = asyncio.run(rootdisks.open_store(slots_dir))
    assert store is not None and mounts.is_mountpoint(store)
    try:
        yield slots_dir
    finally:
        for image in store.glob("*.img"):
            image.unlink()
        asyncio.run(rootdisks.close_store(slots_dir))


def _store_device(slots_dir: Path) -> str:
    (device,) = rootdisks.loops_backing(slots_dir.parent / "disks.xfs")
    return device


@contextlib.contextmanager
def _source(slots: Path, disk_mib: int, written_mib: int) -> Iterator[tuple[Disk, bytes]]:
    """A sandbox disk in the store that has just written ``written_mib`` of one random MiB, unsynced."""
    store = rootdisks.store_dir(slots)
    source = Disk(store / "source.img", slots / "source", "xfs")
    asyncio.run(rootdisks.format_from_blank(source.image_path, disk_mib, "xfs", store))
    asyncio.run(rootdisks.attach(source))
    try:
        chunk = os.urandom(MIB)
        with open(source.upper_dir / "data", "wb") as data:
            for _ in range(written_mib):
                data.write(chunk)
        yield source, chunk
    finally:
        asyncio.run(rootdisks.detach(source))


def test_a_clone_right_after_its_source_synced_1_gib_writes_back_at_most_the_bound(slots: Path) -> None:
    store, device = rootdisks.store_dir(slots), _store_device(slots)
    with _source(slots, 2048, 1024) as (source, chunk):
        mounts.sync_filesystem(source.mount_dir)  # the sandbox's ``sync -f``

        before = _written_bytes(device)
        rootdisks.clone_file(source.image_path, store / "fork.img")
        written = _written_bytes(device) - before
        # Unbounded, the clone wrote back the whole GiB the source had just synced (1,024+ MiB).
        assert written <= writeback.STORE_DIRTY_BYTES + 16 * MIB, (
            f"the clone wrote back {written / MIB:.0f} MiB"
        )

        fork = Disk(store / "fork.img", slots / "fork", "xfs")
        asyncio.run(rootdisks.attach(fork))
        try:
            with open(fork.upper_dir / "data", "rb") as copy:
                assert copy.read(MIB) == chunk and os.fstat(copy.fileno()).st_size == 1024 * MIB
                copy.seek(1023 * MIB)
                assert copy.read() == chunk
        finally:
            asyncio.run(rootdisks.detach(fork))


def test_the_store_bounds_its_dirty_pages_and_gives_its_device_the_defaults_back(slots: Path) -> None:
    device = _store_device(slots)
    bdi = loops.bdi_dir(device)
    assert (bdi / "strict_limit").read_text().strip() == "1"
    # The kernel keeps the bound as a share of the host's dirty threshold: it reads back rounded.
    assert abs(int((bdi / "max_bytes").read_text()) - writeback.STORE_DIRTY_BYTES) < MIB

    # An agent started again finds the store mounted, and bounds it again.
    (bdi / "strict_limit").write_text("0")
    assert asyncio.run(rootdisks.open_store(slots)) == rootdisks.store_dir(slots)
    assert (bdi / "strict_limit").read_text().strip() == "1"

    asyncio.run(rootdisks.close_store(slots))
    assert not rootdisks.loops_backing(slots.parent / "disks.xfs")
    assert (bdi / "strict_limit").read_text().strip() == "0"
    assert (bdi / "max_ratio").read_text().strip() == "100"


def test_a_device_without_those_knobs_is_left_as_it_is() -> None:
    """Before Linux 6.2 a device's writeback domain has no ``strict_limit`` or ``max_bytes``: the store
    then opens unbounded (the agent logs it) rather than failing the agent's start."""
    assert not Path("/sys/class/bdi/1:3").exists()  # /dev/null's numbers: a device with no such domain
    assert loops.bound_dirty("/dev/null", writeback.STORE_DIRTY_BYTES) is False


# Serial: its source must still hold its 100 MiB unsynced when its sync starts, and a `sync` run in any
# other worker's sandbox is sync(2), which writes back every filesystem of the host, this one's too; its
# sync then has nothing to push (CI run 46, beside the other workers).
@pytest.mark.serial
def test_a_forks_own_sync_runs_unbounded_and_writes_beside_itself_and_the_bound_comes_back(
    slots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a fork's source holds unsynced must reach the disk before its clone anyway. Paced at the
    bound, a fork after 100 MiB unsynced took 112 ms; with the bound lifted for its sync 84 ms, and with
    the image's pages also sent to the disk while the sync runs, 68 ms."""
    store, device = rootdisks.store_dir(slots), _store_device(slots)
    strict = loops.bdi_dir(device) / "strict_limit"
    seen: list[str] = []
    real_sync = mounts.sync_filesystem

    def watched_sync(mount_dir: Path) -> None:
        seen.append(strict.read_text().strip())
        real_sync(mount_dir)

    monkeypatch.setattr(mounts, "sync_filesystem", watched_sync)
    pushes = _PushesSeen(writeback._libc)
    monkeypatch.setattr(writeback, "_libc", pushes)
    with _source(slots, 1024, 100) as (source, chunk):
        writeback.sync_copied(source.mount_dir, source.image_path)
        assert seen == ["0"], "the fork's sync ran with the store held to its bound"
        assert strict.read_text().strip() == "1", "the bound did not come back"
        # While the sync ran, the image's new pages were sent to the disk (``sync_file_range``, which
        # does not wait for the writes). Without it all 100 MiB stayed dirty until the clone wrote them
        # (or the kernel's flusher, 1.7-5 s later here). How much reaches the disk by when is the
        # disk's speed, which varies between machines and with their load (38-100 MiB within half a
        # second): bench.fork_after_write times the forks it shortens.
        assert source.image_path in pushes.files, f"no push of the source's image: {pushes.files}"
        with writeback.lifted():  # another fork's sync, still going on
            writeback.sync_copied(source.mount_dir, source.image_path)
            assert strict.read_text().strip() == "0", "one fork's sync ended the other's lift"
        assert strict.read_text().strip() == "1"

        rootdisks.clone_file(source.image_path, store / "fork.img")
        fork = Disk(store / "fork.img", slots / "fork", "xfs")
        asyncio.run(rootdisks.attach(fork))
        try:
            with open(fork.upper_dir / "data", "rb") as copy:
                assert os.fstat(copy.fileno()).st_size == 100 * MIB
                copy.seek(99 * MIB)
                assert copy.read() == chunk
        finally:
            asyncio.run(rootdisks.detach(fork))

        def failing_sync(mount_dir: Path) -> None:
            raise CommandFailedError(["syncfs", str(mount_dir)], 5, "Input/output error")

        monkeypatch.setattr(mounts, "sync_filesystem", failing_sync)
        with pytest.raises(CommandFailedError):
            writeback.sync_copied(source.mount_dir, source.image_path)
        assert strict.read_text().strip() == "1", "a failed sync left the store unbounded"


class _PushesSeen:
    """``writeback``'s libc, recording which file each ``sync_file_range`` asked to be written."""

    def __init__(self, libc: object) -> None:
        self._libc = libc
        self.files: list[Path] = []

    def sync_file_range(self, fd: int, offset: int, count: int, flags: int) -> int:
        self.files.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        return int(self._libc.sync_file_range(fd, offset, count, flags))  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._libc, name)


def _create_files(directory: Path, count: int) -> None:
    """``count`` new empty files in the new ``directory``: a burst of metadata in the log."""
    directory.mkdir()
    for index in range(count):
        os.close(os.open(directory / str(index), os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def _backlog_within(
    source: Disk, shape: xfsreadahead.XfsGeometry, bound: int, *, seconds: float
) -> tuple[int, xfsreadahead.LogPosition]:
    """The log ``source`` holds unwritten (basic blocks, from its tail in memory) and where its log is,
    once that is at most ``bound`` or after ``seconds``, whichever comes first; the caller asserts."""
    deadline = time.monotonic() + seconds
    while True:
        log = xfsreadahead.log_position(source.loop_device)
        assert log is not None
        backlog = xfsreadahead.replay_backlog(shape, log)
        if backlog <= bound or time.monotonic() > deadline:
            return backlog, log
        time.sleep(0.1)


def test_metadata_a_source_logged_goes_home_within_seconds_so_its_fork_clones_without_a_freeze(
    slots: Path,
) -> None:
    """20,000 new files leave ~13,000 blocks of XFS log since its tail, more than a clone may have to
    replay (``QUIESCE_REPLAY_BB``): a fork then freezes its source for the clone. XFS's log worker,
    which the agent hurries from every 30 s to each second (``host.hurry_xfs_log_worker``), writes
    that metadata home and moves the tail up: seconds later the log is short, and the fork's clone is
    taken without a freeze and holds every file."""
    hurry_xfs_log_worker()
    store = rootdisks.store_dir(slots)
    with _source(slots, 1024, 0) as (source, _):
        _create_files(source.upper_dir / "many", 20000)
        mounts.sync_filesystem(source.mount_dir)  # as the fork's own sync does
        shape = xfsreadahead.geometry(source.mount_dir)
        assert shape is not None
        # The worker's interval is 1 s; the kernel's default 30 s.
        backlog, _ = _backlog_within(source, shape, rootdisks.QUIESCE_REPLAY_BB, seconds=6)
        assert backlog <= rootdisks.QUIESCE_REPLAY_BB, f"{backlog} blocks of log are still to replay"

        fork = Disk(store / "fork.img", slots / "fork", "xfs")
        asyncio.run(rootdisks.format_from_blank(fork.image_path, 1024, "xfs", store))
        asyncio.run(rootdisks.attach(fork))
        mounts.unmount(fork.mount_dir)  # a warm slot readied for a fork: its loop device, no mount
        steps: list[str] = []
        asyncio.run(rootdisks.clone_disk(source, fork, step=steps.append))
        try:
            assert "quiesce" not in steps, steps
            assert len(os.listdir(fork.upper_dir / "many")) == 20000
        finally:
            asyncio.run(rootdisks.detach(fork))


def _logprint(image: Path) -> tuple[int, int, int]:
    """The size, tail and head (basic blocks) of the log of the XFS ``image``, as xfsprogs' own log
    reader finds them (``xfs_logprint``'s header; the rest of its output is not read): a mount of it
    replays from the tail to the head."""
    with subprocess.Popen(
        ["xfs_logprint", "-t", str(image)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as reader:
        assert reader.stdout is not None
        size = tail = head = None
        for line in reader.stdout:
            if (found := re.search(r"daddr: \d+ length: (\d+)", line)) is not None:
                size = int(found[1])
            if (found := re.search(r"log tail: (\d+) head: (\d+)", line)) is not None:
                tail, head = int(found[1]), int(found[2])
                break
        reader.kill()
    assert size is not None and tail is not None and head is not None, "xfs_logprint found no log"
    return size, tail, head


def _log_to_replay(image: Path) -> int:
    size, tail, head = _logprint(image)
    return (head - tail) % size


def _label(mount_dir: Path) -> str:
    shown = subprocess.run(
        ["xfs_io", "-c", "label", str(mount_dir)], capture_output=True, text=True, check=True
    )
    return shown.stdout.strip()


# Serial: it needs the 20,000 files' records still in the source's log when it looks, and on a loaded box
# (other workers' CPU and fsyncs) the hurried log worker had already written part of them home: 2,892
# blocks logged in full run 64, and 1,152 here beside two CPU burners and a dd with fsync (1 of 3 runs).
@pytest.mark.serial
def test_a_copy_taken_after_the_metadata_went_home_replays_only_what_is_left(slots: Path) -> None:
    """Seconds after 20,000 new files, XFS's log worker has written their metadata home and the tail it
    keeps in memory is near the head; but the last record on the device still names the old tail,
    and until the worker covers the log (two runs later) a copy of the image replays all ~13,000
    blocks since (a fork's mount of 48-331 ms against 7-9 ms). The copy is taken after the source
    wrote a record with its current tail (``mounts.write_log_tail``): it replays only what is left,
    holds every file, and the source keeps its label."""
    hurry_xfs_log_worker()
    store = rootdisks.store_dir(slots)
    with _source(slots, 1024, 0) as (source, _):
        subprocess.run(
            ["xfs_io", "-c", "label -s pdk-src", str(source.mount_dir)], check=True, capture_output=True
        )
        _create_files(source.upper_dir / "many", 20000)
        mounts.sync_filesystem(source.mount_dir)
        shape = xfsreadahead.geometry(source.mount_dir)
        assert shape is not None
        logged = _log_to_replay(source.image_path)
        assert logged > 8 * 512, f"only {logged} blocks logged: the 20,000 files were not in the log"
        # Until the worker has written the metadata home (the tail in memory moved up).
        backlog, log = _backlog_within(source, shape, 512, seconds=6)
        assert backlog <= 512, f"{backlog} blocks of log are still to be written home"
        # The device's last record still names the old tail, as xfsprogs reads it too.
        _, device_tail, _ = _logprint(source.image_path)
        assert xfsreadahead.device_log_tail(source.image_path, shape, log) == device_tail
        assert _log_to_replay(source.image_path) > 1024

        copy = store / "copy.img"
        rootdisks.snapshot_image(source, copy)
        assert _log_to_replay(copy) <= 1024, "the copy replays the log since before the metadata went home"
        assert _label(source.mount_dir) == 'label = "pdk-src"'
        restored = Disk(copy, slots / "copy", "xfs")
        asyncio.run(rootdisks.attach(restored))
        try:
            assert len(os.listdir(restored.upper_dir / "many")) == 20000
        finally:
            asyncio.run(rootdisks.detach(restored))


def test_a_copy_of_a_source_whose_log_is_covered_takes_no_log_record_of_its_own(slots: Path) -> None:
    """A source idle for a few seconds has its log covered by XFS's worker: its last record names the
    one before it. A copy of it needs no record with the current tail (``mounts.write_log_tail``), and
    the source writes none: its log's head stays where it was."""
    hurry_xfs_log_worker()
    store = rootdisks.store_dir(slots)
    with _source(slots, 1024, 1) as (source, _):
        mounts.sync_filesystem(source.mount_dir)
        deadline = time.monotonic() + 10
        while _log_to_replay(source.image_path) > 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _log_to_replay(source.image_path) <= 4, "the worker did not cover the log"
        time.sleep(2.5)  # its last covering runs: the log is then left alone while nothing changes
        before = xfsreadahead.log_position(source.loop_device)
        assert before is not None
        copy = store / "copy.img"
        rootdisks.snapshot_image(source, copy)
        assert xfsreadahead.log_position(source.loop_device) == before
        assert _log_to_replay(copy) <= 4
        restored = Disk(copy, slots / "copy", "xfs")
        asyncio.run(rootdisks.attach(restored))
        try:
            assert (restored.upper_dir / "data").stat().st_size == MIB
        finally:
            asyncio.run(rootdisks.detach(restored))
