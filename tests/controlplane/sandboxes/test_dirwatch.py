"""``dirwatch``, the seam between the host agent's watch stream and the two watch APIs: when the watch is
to be polled instead (the sandbox's guest has no watch to give, the tree is past the guest's cap, a link
without ``watch``), and how the stream's lines become events with paths as ``find`` prints them, ticks
when quiet, and an end that says whether the directory or the sandbox went. The live tests
(tests/sdk/test_live_watch.py, tests/e2b/test_watch_inotify.py) run the real host agent and guest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.sandboxes import dirwatch


class Link:
    def __init__(
        self, lines: list[dict[str, Any]] | None = None, refuse: bool = False, gap_s: float = 0
    ) -> None:
        self.lines, self.refuse, self.gap_s = lines or [], refuse, gap_s
        self.closed = False
        self.asked: tuple[str, str, bool] | None = None

    async def watch(
        self, sandbox_id: str, path: str, *, recursive: bool
    ) -> AsyncGenerator[dict[str, Any], None]:
        self.asked = (sandbox_id, path, recursive)
        if self.refuse:
            raise hostlink.TierRefusedError("no directory watch from this sandbox")
        return self._lines()

    async def _lines(self) -> AsyncGenerator[dict[str, Any], None]:
        try:
            for line in self.lines:
                if line.get("wait"):
                    await asyncio.sleep(self.gap_s)
                    continue
                yield line
        finally:
            self.closed = True


HEAD = {"watching": "/w", "directories": 1, "complete": True}


async def test_a_guest_without_a_watch_or_a_tree_past_the_cap_is_polled() -> None:
    refused = Link(refuse=True)
    assert await dirwatch.open_stream(refused, "sb", "/w", True) is None  # type: ignore[arg-type]
    assert refused.asked == ("sb", "/w", True)

    past_cap = Link([{**HEAD, "complete": False}, {"event": "create", "type": "file", "path": "a"}])
    assert await dirwatch.open_stream(past_cap, "sb", "/w", True) is None  # type: ignore[arg-type]
    assert past_cap.closed  # the host agent's stream (and the guest's watch) is closed

    class OldLink:  # a link without watch (a fake host, an older hostlink)
        pass

    assert await dirwatch.open_stream(OldLink(), "sb", "/w", False) is None  # type: ignore[arg-type]


async def _items(link: Link, watched: str, tick_s: float = 5.0) -> list[dirwatch.Item]:
    lines = await dirwatch.open_stream(link, "sb", "/abs", False)  # type: ignore[arg-type]
    assert lines is not None
    loop = asyncio.get_running_loop()
    return [item async for item in dirwatch.follow(lines, watched, tick_s, loop.time() + 10)]


async def test_lines_become_events_with_paths_as_find_prints_them() -> None:
    events = [
        {"event": "create", "type": "file", "path": "a.txt"},
        {"event": "modify", "type": "file", "path": "sub/b"},
        {"event": "delete", "type": "dir", "path": "sub"},
        {"event": "overflow", "type": "dir", "path": ""},
    ]
    assert await _items(Link([HEAD, *events, {"error": "gone", "code": "file_not_found"}]), "/w") == [
        dirwatch.Event("create", "/w/a.txt", "file"),
        dirwatch.Event("modify", "/w/sub/b", "file"),
        dirwatch.Event("delete", "/w/sub", "dir"),
        dirwatch.Overflow(),
        dirwatch.Ended(missing=True),
    ]
    # the watched path as the caller gave it: a trailing slash is not doubled, a relative one kept
    items = await _items(Link([HEAD, events[0], {"error": "x", "code": "sandbox_gone"}]), "/")
    assert items == [dirwatch.Event("create", "/a.txt", "file"), dirwatch.Ended(missing=False)]
    items = await _items(Link([HEAD, events[0]]), "w/")
    assert items == [dirwatch.Event("create", "w/a.txt", "file"), dirwatch.Ended(missing=False)]


async def test_a_quiet_stream_ticks_without_losing_its_next_line() -> None:
    link = Link([HEAD, {"wait": True}, {"event": "create", "type": "file", "path": "late"}], gap_s=0.35)
    items = await _items(link, "/w", tick_s=0.1)
    ticks = [item for item in items if isinstance(item, dirwatch.Tick)]
    assert len(ticks) >= 2
    assert items[-2:] == [dirwatch.Event("create", "/w/late", "file"), dirwatch.Ended(missing=False)]
    assert link.closed


async def test_leaving_the_stream_closes_the_host_agents() -> None:
    link = Link([HEAD, {"wait": True}], gap_s=30)
    lines = await dirwatch.open_stream(link, "sb", "/w", False)  # type: ignore[arg-type]
    assert lines is not None
    items = dirwatch.follow(lines, "/w", 0.05, asyncio.get_running_loop().time() + 10)
    assert isinstance(await anext(items), dirwatch.Tick)
    await items.aclose()
    assert link.closed


async def test_the_stream_ends_at_its_deadline() -> None:
    until_s = 0.2
    link = Link([HEAD, {"wait": True}], gap_s=30)
    lines = await dirwatch.open_stream(link, "sb", "/w", False)  # type: ignore[arg-type]
    assert lines is not None
    loop = asyncio.get_running_loop()
    started = loop.time()
    items = [item async for item in dirwatch.follow(lines, "/w", 5.0, started + until_s)]
    assert items == [] and loop.time() - started < until_s + 0.5
    assert link.closed
