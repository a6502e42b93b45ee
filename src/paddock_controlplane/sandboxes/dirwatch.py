"""A directory watch from the guest's inotify (the host agent's ``GET …/files/watch``, ``guest/watch.c``),
one source for ``/v1``'s ``fileops.watch`` and the E2B edge's ``WatchDir``.

``open_stream`` opens it once the directory is known to be there (the callers check it first, with the
same exec and exit codes as their listings, so a missing path or a file is refused in the same words as
before). It answers ``None`` when the watch has to be polled instead: the sandbox's guest has no watch to
give (a guest agent older than WATCH, or no inotify instance left in the sandbox), or the tree holds more
directories than the guest watches. ``follow`` turns the stream into what the callers emit: ``Event``
with the path as a listing prints it (the watched path as given, then the relative path), ``Overflow``
(events were lost: list again), ``Tick`` when nothing came for ``tick_s``, and ``Ended`` last when the
watched directory or the sandbox went.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from paddock_controlplane.hosts import hostlink


@dataclass(frozen=True)
class Event:
    kind: str  # "create" | "modify" | "delete"
    path: str  # as ``find "$watched"`` prints it
    type: str  # "file" | "dir" | "symlink" | "other" (a deleted entry: "dir" or "file")


@dataclass(frozen=True)
class Overflow:
    """The guest lost events (its kernel queue overflowed, or a new directory was past its cap)."""


@dataclass(frozen=True)
class Tick:
    """Nothing came for ``tick_s``."""


@dataclass(frozen=True)
class Ended:
    missing: bool  # the watched directory went (else the sandbox did)


Item = Event | Overflow | Tick | Ended
Lines = AsyncGenerator[dict[str, Any], None]


async def open_stream(
    link: hostlink.HostLinkAPI, sandbox_id: str, directory: str, recursive: bool
) -> Lines | None:
    """The guest's watch of ``directory`` (absolute), or ``None`` when it is to be polled (also for a
    link without ``watch``)."""
    watch = getattr(link, "watch", None)
    if watch is None:
        return None
    try:
        lines: Lines = await watch(sandbox_id, directory, recursive=recursive)
    except hostlink.TierRefusedError:
        return None  # this guest has no watch to give: poll
    try:
        head = await anext(lines)
    except StopAsyncIteration:
        head = {}
    except BaseException:
        await lines.aclose()
        raise
    if "watching" not in head or not head.get("complete", False):
        await lines.aclose()  # more directories than the guest watches: a listing covers more of them
        return None
    return lines


def _join(watched: str, relative: str) -> str:
    """``relative`` under ``watched`` as ``find`` prints it: one slash between, none added after one."""
    return watched + relative if watched.endswith("/") else f"{watched}/{relative}"


async def follow(lines: Lines, watched: str, tick_s: float, until: float) -> AsyncIterator[Item]:
    """The stream's items until it ends or the event loop's clock passes ``until``. The next line is
    awaited in a task of its own, so a tick never cancels the stream's read."""
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[dict[str, Any]] | None = None
    try:
        while (left := until - loop.time()) > 0:
            if pending is None:
                pending = asyncio.ensure_future(anext(lines))
            done, _ = await asyncio.wait({pending}, timeout=min(tick_s, left))
            if not done:
                if until - loop.time() > 0:
                    yield Tick()
                continue
            future, pending = pending, None
            try:
                line = future.result()
            except (StopAsyncIteration, hostlink.HostError, hostlink.SandboxGoneError):
                yield Ended(missing=False)
                return
            if line.get("event") == "overflow":
                yield Overflow()
            elif "event" in line:
                yield Event(str(line["event"]), _join(watched, str(line["path"])), str(line["type"]))
            elif "error" in line:
                yield Ended(missing=line.get("code") == "file_not_found")
                return
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await lines.aclose()
