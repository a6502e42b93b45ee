"""``files.watch`` follows the guest's inotify on every tier (crun, gVisor, the VM): a file created,
written, removed, or made in a directory that did not exist when the watch began arrives within a second
(the polled watch looked every 0.5 s, after a listing's exec); a new directory past the guest's cap is an
``overflow`` line; a tree larger than the cap falls back to polling and still sees every directory; and
the watch ends, saying so, when the sandbox is destroyed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048
PROMPT_S = 1.0
#: WATCH_MAX_DIRS in guest/watch.c.
MAX_DIRS = 4096


class Events:
    """A watch's events read by a task into a queue, so a wait with a timeout never cancels the watch."""

    def __init__(self, events: AsyncIterator[paddock.FileEvent]) -> None:
        self.events = events
        self.queue: asyncio.Queue[paddock.FileEvent | BaseException] = asyncio.Queue()
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        try:
            async for event in self.events:
                await self.queue.put(event)
            await self.queue.put(EOFError("the watch ended"))
        except Exception as exc:
            await self.queue.put(exc)

    async def until(self, wanted: paddock.FileEvent, timeout_s: float = PROMPT_S) -> list[paddock.FileEvent]:
        seen: list[paddock.FileEvent] = []
        deadline = time.monotonic() + timeout_s
        while not seen or seen[-1] != wanted:
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                    item = await self.queue.get()
            except TimeoutError:
                pytest.fail(
                    f"{wanted} did not come within {timeout_s} s; {len(seen)} others did: {seen[-5:]}"
                )
            if isinstance(item, BaseException):
                raise item
            seen.append(item)
        return seen

    async def some(self, first_by: float, wait_s: float = 1.0) -> list[paddock.FileEvent]:
        """The first event to arrive before ``first_by`` (a ``time.monotonic()`` deadline: a polled
        watch reports a pass's changes together, and a pass over thousands of directories in a busy
        gVisor sandbox can take ten seconds), with what follows it within ``wait_s``; [] if none came."""
        items = []
        try:
            async with asyncio.timeout(max(first_by - time.monotonic(), 0.001)):
                items.append(await self.queue.get())
        except TimeoutError:
            return []
        with_more = time.monotonic() + wait_s
        while not self.queue.empty() or time.monotonic() < with_more:
            try:
                async with asyncio.timeout(max(with_more - time.monotonic(), 0.001)):
                    items.append(await self.queue.get())
            except TimeoutError:
                break
        for item in items:
            if isinstance(item, BaseException):
                raise item
        return [item for item in items if isinstance(item, paddock.FileEvent)]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.events.aclose()  # type: ignore[attr-defined]


async def test_events_arrive_within_a_second_on_every_tier(tier_live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(tier_live.url, tier_live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        await sb.files.write_files({"/root/w/before.txt": "old"})
        events = Events(await sb.files.watch("/root/w", recursive=True))
        try:
            latencies: dict[str, float] = {}

            async def timed(
                what: str, change: Awaitable[object], event: paddock.FileEvent
            ) -> list[paddock.FileEvent]:
                """Makes the change, then waits for its event; notes how long after the change's call
                returned the event came (0 when it came first)."""
                await change
                returned = time.monotonic()
                seen = await events.until(event, PROMPT_S)
                latencies[what] = max(time.monotonic() - returned, 0.0)
                return seen

            seen = await timed(
                "create",
                sb.files.write("/root/w/new.txt", "x"),
                paddock.FileEvent("create", "/root/w/new.txt", "file"),
            )
            assert all(e.path != "/root/w/before.txt" for e in seen)  # what was there is no event
            await timed(
                "modify",
                sb.run_shell("echo more >> /root/w/before.txt"),
                paddock.FileEvent("modify", "/root/w/before.txt", "file"),
            )
            seen = await timed(  # a directory made after the watch began, with a file at once
                "recursive create",
                sb.run_shell("mkdir -p /root/w/sub/deep && echo x > /root/w/sub/deep/f"),
                paddock.FileEvent("create", "/root/w/sub/deep/f", "file"),
            )
            assert paddock.FileEvent("create", "/root/w/sub", "dir") in seen
            await timed(
                "delete",
                sb.files.remove("/root/w/before.txt"),
                paddock.FileEvent("delete", "/root/w/before.txt", "file"),
            )
            print(f"inotify watch: seconds from the change's call returning to its event: {latencies}")
        finally:
            await events.close()


async def test_a_directory_past_the_cap_is_an_overflow_and_a_larger_tree_is_polled(
    tier_live: LivePlatform,
) -> None:
    async with (
        paddock.AsyncClient(tier_live.url, tier_live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        # MAX_DIRS - 2 directories and the watched one: the guest watches them all, and one more
        made = await sb.run_shell(f"mkdir -p /root/big && cd /root/big && seq 1 {MAX_DIRS - 2} | xargs mkdir")
        assert made.exit_code == 0, made.stderr
        events = Events(await sb.files.watch("/root/big", recursive=True))
        try:
            await sb.run_shell("mkdir /root/big/x && mkdir /root/big/x/y")
            seen = await events.until(paddock.FileEvent("overflow", "/root/big", "dir"), 10)
            assert paddock.FileEvent("create", "/root/big/x", "dir") in seen
            await sb.run_shell("echo 1 > /root/big/x/still")  # what is watched still is
            await events.until(paddock.FileEvent("create", "/root/big/x/still", "file"), 10)
        finally:
            await events.close()

        # Past the cap when the watch begins: polled, so a file in every directory is seen
        more = await sb.run_shell(f"cd /root/big && seq {MAX_DIRS} {MAX_DIRS + 50} | xargs mkdir")
        assert more.exit_code == 0, more.stderr
        events = Events(await sb.files.watch("/root/big", recursive=True))
        try:
            started = time.monotonic()  # the polled watch's latency, for comparison
            await sb.files.write("/root/big/polled.txt", "p")
            await events.until(paddock.FileEvent("create", "/root/big/polled.txt", "file"), 30)
            print(
                f"polled watch of {MAX_DIRS + 50} directories: a create came {time.monotonic() - started:.2f} s after"
            )
            await sb.run_shell('for d in /root/big/*/; do : > "$d/f"; done')
            names = await sb.run_shell("find /root/big -mindepth 1 -maxdepth 1 -type d | wc -l")
            directories = int(names.stdout)
            assert directories > MAX_DIRS
            created: set[str] = set()
            deadline = time.monotonic() + 180
            while len(created) < directories:
                assert time.monotonic() < deadline, f"{len(created)} of {directories} files reported"
                for event in await events.some(deadline):
                    if event.event == "create" and event.path.endswith("/f"):
                        created.add(event.path)
        finally:
            await events.close()


async def test_the_watch_ends_when_the_sandbox_is_destroyed(tier_live: LivePlatform) -> None:
    async with paddock.AsyncClient(tier_live.url, tier_live.api_key()) as client:
        sb = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB)
        await sb.files.write_files({"/root/w/a": "a"})
        events = Events(await sb.files.watch("/root/w"))
        try:
            await sb.files.write("/root/w/b", "b")
            await events.until(paddock.FileEvent("create", "/root/w/b", "file"))
            started = time.monotonic()
            await sb.destroy()
            with pytest.raises(paddock.PaddockError, match="no longer running"):
                await events.until(paddock.FileEvent("create", "/never", "file"), 10)
            print(f"the watch ended {time.monotonic() - started:.2f} s after the destroy was sent")
        finally:
            await events.close()
