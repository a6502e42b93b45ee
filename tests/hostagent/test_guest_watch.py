"""The guest agent's WATCH (``guest/watch.c``) outside any container (``--listen PATH``): a directory's
create, modify and delete arrive within a second of the change, a recursive watch follows a directory
made after it started, an upload's temporary file is never an event, a directory moved away stops being
watched, the directory cap reports an overflow, and the watch ends when the watched directory goes or
the guest does. A guest built before WATCH refuses it, which the client names so a caller can poll."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from paddock_hostagent.guest import GuestClient, GuestFileNotFoundError, GuestUnavailableError
from paddock_hostagent.guest.build import BINARY_NAME
from paddock_hostagent.guest.client import DirectoryWatch, WatchEvent
from paddock_hostagent.guest.protocol import GuestNotDirectoryError, GuestWatchUnavailableError
from tests.hostagent.test_guest_agent import _listening
from tests.hostagent.test_guest_users import old_guest  # noqa: F401  (a fixture)

#: What "promptly" means here: the polled watch took up to 0.5 s plus a listing's exec.
PROMPT_S = 1.0
#: WATCH_MAX_DIRS in watch.c.
MAX_DIRS = 4096


@pytest.fixture
def guest_process(
    guest_binary_dir: Path, tmp_path: Path
) -> Iterator[tuple[GuestClient, subprocess.Popen[bytes]]]:
    socket_path = tmp_path / "g.sock"
    process = subprocess.Popen([str(guest_binary_dir / BINARY_NAME), "--listen", str(socket_path)])
    deadline = time.monotonic() + 5
    while not _listening(socket_path) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _listening(socket_path), "the guest agent did not listen"
    try:
        yield GuestClient(socket_path, kept=None), process
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def guest(guest_process: tuple[GuestClient, subprocess.Popen[bytes]]) -> GuestClient:
    return guest_process[0]


class Events:
    """A watch's events read by a task into a queue, so waiting for one with a timeout never cancels
    the watch's own iteration."""

    def __init__(self, watch: DirectoryWatch) -> None:
        self.queue: asyncio.Queue[WatchEvent | BaseException] = asyncio.Queue()
        self.task = asyncio.create_task(self._pump(watch))

    async def _pump(self, watch: DirectoryWatch) -> None:
        try:
            async for event in watch:
                await self.queue.put(event)
            await self.queue.put(StopAsyncIteration())
        except Exception as exc:
            await self.queue.put(exc)

    async def next(self, timeout_s: float = PROMPT_S) -> WatchEvent:
        async with asyncio.timeout(timeout_s):
            item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item


def _events(watch: DirectoryWatch) -> Events:
    return Events(watch)


async def _until(events: Events, wanted: WatchEvent, timeout_s: float = PROMPT_S) -> list[WatchEvent]:
    """Every event up to and including ``wanted``; fails if it does not come within ``timeout_s``."""
    seen: list[WatchEvent] = []
    deadline = time.monotonic() + timeout_s
    while not seen or seen[-1] != wanted:
        try:
            seen.append(await events.next(max(deadline - time.monotonic(), 0.001)))
        except TimeoutError:
            pytest.fail(
                f"{wanted} did not arrive within {timeout_s} s; {len(seen)} others did, last {seen[-5:]}"
            )
    return seen


async def _quiet(events: Events, for_s: float = 0.3) -> None:
    with pytest.raises(TimeoutError):
        event = await events.next(for_s)
        pytest.fail(f"unexpected event {event}")


async def test_create_modify_delete_arrive_within_a_second(guest: GuestClient, tmp_path: Path) -> None:
    watched = tmp_path / "w"
    watched.mkdir()
    (watched / "before.txt").write_text("old")
    async with guest.watch(str(watched)) as watch:
        assert (watch.directories, watch.complete) == (1, True)
        events = _events(watch)
        await _quiet(events)  # what was there is no event

        started = time.monotonic()
        (watched / "new.txt").write_text("x")
        seen = await _until(events, WatchEvent("create", "file", "new.txt"))
        latency = time.monotonic() - started
        assert seen == [WatchEvent("create", "file", "new.txt")]  # its write folds into the create
        assert latency < PROMPT_S

        await asyncio.sleep(0.1)
        with (watched / "before.txt").open("a") as f:  # many writes, one batch: one modify
            for _ in range(100):
                f.write("more")
                f.flush()
        assert await _until(events, WatchEvent("modify", "file", "before.txt")) == [
            WatchEvent("modify", "file", "before.txt")
        ]
        await _quiet(events)

        (watched / "before.txt").unlink()
        os.symlink("/etc/passwd", watched / "link")
        os.mkfifo(watched / "fifo")
        (watched / "new.txt").rename(watched / "renamed.txt")
        seen = await _until(events, WatchEvent("create", "file", "renamed.txt"))
        assert seen == [
            WatchEvent("delete", "file", "before.txt"),
            WatchEvent("create", "symlink", "link"),
            WatchEvent("create", "other", "fifo"),
            WatchEvent("delete", "file", "new.txt"),  # a rename: the old name goes, the new one comes
            WatchEvent("create", "file", "renamed.txt"),
        ]


async def test_an_upload_is_one_create_or_modify_and_its_temporary_file_no_event(
    guest: GuestClient, tmp_path: Path
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"uploaded"

    async with guest.watch(str(tmp_path)) as watch:
        events = _events(watch)
        assert await guest.write_file(str(tmp_path / "up.txt"), body()) == 8
        assert await _until(events, WatchEvent("create", "file", "up.txt")) == [
            WatchEvent("create", "file", "up.txt")
        ]
        await _quiet(events)
        # over the file it made: the upload replaces it by a rename, which is its modify
        assert await guest.write_file(str(tmp_path / "up.txt"), body()) == 8
        assert await _until(events, WatchEvent("modify", "file", "up.txt")) == [
            WatchEvent("modify", "file", "up.txt")
        ]
        await _quiet(events)


async def test_a_recursive_watch_follows_new_directories_and_drops_moved_ones(
    guest: GuestClient, tmp_path: Path
) -> None:
    watched = tmp_path / "w"
    (watched / "old" / "deep").mkdir(parents=True)
    async with guest.watch(str(watched), recursive=True) as watch:
        assert watch.directories == 3
        events = _events(watch)
        (watched / "old" / "deep" / "f").write_text("1")
        await _until(events, WatchEvent("create", "file", "old/deep/f"))

        # a directory made with its contents at once: the contents are reported as it is watched
        (watched / "new" / "sub").mkdir(parents=True)
        (watched / "new" / "sub" / "g.txt").write_text("2")
        seen = await _until(events, WatchEvent("create", "file", "new/sub/g.txt"))
        assert WatchEvent("create", "dir", "new") in seen
        await asyncio.sleep(0.1)
        (watched / "new" / "sub" / "g.txt").write_text("3")
        await _until(events, WatchEvent("modify", "file", "new/sub/g.txt"))

        # moved away: no longer watched; moved in: watched, and its contents created
        outside = tmp_path / "outside"
        (watched / "old").rename(outside)
        await _until(events, WatchEvent("delete", "dir", "old"))
        (outside / "deep" / "unseen").write_text("x")
        await _quiet(events)
        outside.rename(watched / "back")
        seen = await _until(events, WatchEvent("create", "file", "back/deep/unseen"), 2)
        assert WatchEvent("create", "dir", "back") in seen
        (watched / "back" / "deep" / "later").write_text("y")
        await _until(events, WatchEvent("create", "file", "back/deep/later"))

    async with guest.watch(str(watched)) as flat:  # not recursive: a subdirectory's files are not events
        events = _events(flat)
        assert flat.directories == 1
        (watched / "back" / "deep" / "flat").write_text("z")
        (watched / "top").write_text("t")
        assert await _until(events, WatchEvent("create", "file", "top")) == [
            WatchEvent("create", "file", "top")
        ]


async def test_the_directory_cap_reports_an_overflow(guest: GuestClient, tmp_path: Path) -> None:
    watched = tmp_path / "many"
    for i in range(MAX_DIRS + 10):
        (watched / f"d{i}").mkdir(parents=True)
    async with guest.watch(str(watched), recursive=True) as watch:
        assert (watch.directories, watch.complete) == (MAX_DIRS, False)
    shutil.rmtree(watched)

    small = tmp_path / "small"
    for i in range(MAX_DIRS - 2):
        (small / f"d{i}").mkdir(parents=True)
    async with guest.watch(str(small), recursive=True) as watch:
        assert (watch.directories, watch.complete) == (MAX_DIRS - 1, True)
        events = _events(watch)
        (small / "x").mkdir()  # the last one the cap allows: watched
        (small / "x" / "y").mkdir()  # one past it: an overflow, so the client lists again
        seen = await _until(events, WatchEvent("overflow", "dir", ""))
        assert WatchEvent("create", "dir", "x") in seen and WatchEvent("create", "dir", "x/y") in seen
        (small / "x" / "f").write_text("still watched")
        await _until(events, WatchEvent("create", "file", "x/f"))


async def test_the_kernel_queue_overflow_is_reported(
    guest_process: tuple[GuestClient, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    guest, process = guest_process
    max_queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    async with guest.watch(str(tmp_path)) as watch:
        events = _events(watch)
        # The watch's handler is stopped while more changes are made than the kernel queues for it.
        (handler,) = _watching(process)
        os.kill(handler, signal.SIGSTOP)
        try:
            await asyncio.to_thread(lambda: [(tmp_path / f"f{i}").touch() for i in range(max_queued + 100)])
        finally:
            os.kill(handler, signal.SIGCONT)
        seen = await _until(events, WatchEvent("overflow", "dir", ""), 10)
        assert len(seen) <= max_queued + 1  # what the queue held, then the overflow
        (tmp_path / "after").touch()  # and the watch goes on
        await _until(events, WatchEvent("create", "file", "after"), 10)


def _watching(process: subprocess.Popen[bytes]) -> set[int]:
    """The guest's processes (PID 1's children outside a container) that hold an inotify instance."""
    pids = set()
    for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split():
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if "anon_inode:inotify" in links:
            pids.add(int(pid))
    return pids


async def test_the_watch_ends_when_its_directory_or_the_guest_goes(
    guest_process: tuple[GuestClient, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    guest, process = guest_process
    watched = tmp_path / "w"
    watched.mkdir()
    async with guest.watch(str(watched)) as watch:
        events = _events(watch)
        (watched / "f").write_text("x")
        await _until(events, WatchEvent("create", "file", "f"))
        shutil.rmtree(watched)
        with pytest.raises(GuestFileNotFoundError, match="was removed"):
            while True:
                await events.next()

    watched.mkdir()
    async with guest.watch(str(watched)) as watch:
        events = _events(watch)
        process.kill()
        with pytest.raises(GuestUnavailableError):
            await events.next()


async def test_a_closed_watch_frees_its_guest_process(
    guest_process: tuple[GuestClient, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    guest, process = guest_process
    assert _watching(process) == set()
    watch = await guest.watch(str(tmp_path)).__aenter__()
    assert len(_watching(process)) == 1
    await watch.aclose()
    deadline = time.monotonic() + PROMPT_S
    while _watching(process) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert _watching(process) == set(), "the handler of a closed watch is still there"


async def test_refusals(guest: GuestClient, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(GuestFileNotFoundError):
        await DirectoryWatch(guest, str(tmp_path / "absent"), False).__aenter__()
    with pytest.raises(GuestNotDirectoryError):
        await DirectoryWatch(guest, str(tmp_path / "file"), False).__aenter__()


@pytest.mark.root
async def test_an_older_guest_refuses_watch_as_unavailable(old_guest: GuestClient, tmp_path: Path) -> None:  # noqa: F811
    with pytest.raises(GuestWatchUnavailableError, match="predates WATCH"):
        async with old_guest.watch(str(tmp_path)):
            pass
