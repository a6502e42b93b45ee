"""envd's ``filesystem.Filesystem`` service (``packages/envd/spec/filesystem/filesystem.proto``) on
Paddock's guest: each call runs ``find``/``mkdir``/``mv``/``rm`` in the sandbox through its exec, with the
paths passed as arguments (``sh -c SCRIPT sh PATH…``), never pasted into a command line. The scripts,
their output's parser and the watch limiter are ``sandbox_fs``'s, shared with ``/v1``'s ``fileops``.

``WatchDir`` follows the guest's inotify (``sandboxes/dirwatch.py``): create, write and remove as they
happen; an overflow (events lost) ends the stream with ``internal``, as envd's own watcher does. Where the
guest has no watch to give (an older guest agent, no inotify instance left, a tree past its directory
cap) it polls instead: the edge lists the tree (bounded by ``sandbox_fs.MAX_WATCH_ENTRIES``) every
``WATCH_INTERVAL_S`` and reports what appeared (create), changed size or time (write) or went away
(remove) since the previous look. The watcher API (``CreateWatcher``/``GetWatcherEvents``, what the sync
SDK polls) always looks on each poll: it holds nothing open between polls. A rename shows as a remove and
a create either way (docs/e2b.md lists it as a difference).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from paddock_controlplane.edge.e2b.edge.connect import ConnectError
from paddock_controlplane.edge.e2b.edge.context import Call, mapped
from paddock_controlplane.sandboxes import dirwatch, sandbox_fs
from paddock_controlplane.sandboxes.activity import Inflight
from paddock_core import errors

MAX_PATH = 4096
#: Watchers kept across all sandboxes (oldest dropped first).
MAX_WATCHERS = 1_000
#: A ``WatchDir`` stream says it is alive after this long without an event.
KEEPALIVE_S = 5.0


def _path(value: Any, field_name: str = "path") -> str:
    if not isinstance(value, str) or not value:
        raise ConnectError("invalid_argument", f"{field_name}: is required")
    if len(value) > MAX_PATH or "\0" in value:
        raise ConnectError("invalid_argument", f"{field_name}: must be under {MAX_PATH} bytes, without NUL")
    return value


async def _run(call: Call, script: str, *args: str) -> tuple[int, bytes, str]:
    with mapped(), Inflight(call.services, call.sandbox.id):
        result = await call.link.exec(call.sandbox.id, "/bin/sh", ["-c", script, "sh", *args], {}, None)
    if result.get("error"):
        raise ConnectError("unavailable", f"the sandbox did not run the call: {result['error']}")
    stdout = result.get("stdout", "")
    return (
        int(result.get("exit_code", -1)),
        stdout.encode("utf-8", "surrogateescape"),
        result.get("stderr", ""),
    )


def _fail(code: int, stderr: str, path: str) -> ConnectError:
    if code == sandbox_fs.MISSING:
        return ConnectError("not_found", f"path {path} does not exist")
    if code == sandbox_fs.NOT_DIR:
        return ConnectError("invalid_argument", f"path {path} is not a directory")
    if code == sandbox_fs.EXISTS:
        return ConnectError("already_exists", f"path {path} already exists")
    return ConnectError("internal", (stderr.strip() or f"exit status {code}")[:1000])


async def _one(call: Call, script: str, path: str, *more: str) -> dict[str, Any]:
    code, out, err = await _run(call, script, path, sandbox_fs.PRINTF, *more)
    entries = sandbox_fs.entries(out) if code == 0 else []
    if not entries:
        raise _fail(code, err, path)
    return entries[0]


async def stat(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    return {"entry": await _one(call, sandbox_fs.STAT, _path(req.get("path")))}


async def make_dir(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    return {"entry": await _one(call, sandbox_fs.MKDIR, _path(req.get("path")))}


async def move(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    source, destination = _path(req.get("source"), "source"), _path(req.get("destination"), "destination")
    return {"entry": await _one(call, sandbox_fs.MOVE, source, destination)}


async def remove(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    path = _path(req.get("path"))
    code, _, err = await _run(call, sandbox_fs.REMOVE, path)
    if code != 0:
        raise _fail(code, err, path)
    return {}


async def _listing(call: Call, path: str, depth: int) -> list[dict[str, Any]]:
    code, out, err = await _run(call, sandbox_fs.LIST, *sandbox_fs.list_args(path, depth))
    if code != 0:
        raise _fail(code, err, path)
    return sandbox_fs.listing(out)


async def list_dir(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    path = _path(req.get("path"))
    depth = req.get("depth") or 1
    if not isinstance(depth, int) or not 1 <= depth <= sandbox_fs.MAX_DEPTH:
        raise ConnectError("invalid_argument", f"depth: must be 1..{sandbox_fs.MAX_DEPTH}")
    return {"entries": await _listing(call, path, depth)}


# --- watching: WatchDir by inotify, the watcher API by polling -----------------------------------------


@dataclass
class _Watcher:
    sandbox_id: str
    path: str
    depth: int
    seen: dict[str, tuple[str, str]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_watchers: OrderedDict[str, _Watcher] = OrderedDict()


async def _snapshot(call: Call, watcher: _Watcher) -> dict[str, dict[str, Any]]:
    entries = await _listing(call, watcher.path, watcher.depth)
    return {entry["path"]: entry for entry in entries[: sandbox_fs.MAX_WATCH_ENTRIES]}


def _diff(watcher: _Watcher, now: dict[str, dict[str, Any]], include_entry: bool) -> list[dict[str, Any]]:
    events = []
    prefix = watcher.path.rstrip("/") + "/"

    def event(path: str, kind: str, entry: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": path.removeprefix(prefix), "type": kind}
        if include_entry and entry is not None:
            out["entry"] = entry
        return out

    for path, entry in now.items():
        mark = (entry["size"], entry["modifiedTime"])
        before = watcher.seen.get(path)
        if before is None:
            events.append(event(path, "EVENT_TYPE_CREATE", entry))
        elif before != mark:
            events.append(event(path, "EVENT_TYPE_WRITE", entry))
    for path in watcher.seen.keys() - now.keys():
        events.append(event(path, "EVENT_TYPE_REMOVE", None))
    watcher.seen = {path: (e["size"], e["modifiedTime"]) for path, e in now.items()}
    return events


async def _new_watcher(call: Call, req: dict[str, Any]) -> _Watcher:
    watcher = _Watcher(
        call.sandbox.id, _path(req.get("path")), sandbox_fs.MAX_DEPTH if req.get("recursive") else 1
    )
    await _diff_now(call, watcher, False)  # the starting state: no events for what was there
    return watcher


async def _diff_now(call: Call, watcher: _Watcher, include_entry: bool) -> list[dict[str, Any]]:
    async with watcher.lock:
        return _diff(watcher, await _snapshot(call, watcher), include_entry)


async def create_watcher(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    watcher = await _new_watcher(call, req)
    watcher_id = "w-" + secrets.token_hex(12)
    _watchers[watcher_id] = watcher
    while len(_watchers) > MAX_WATCHERS:
        _watchers.popitem(last=False)
    return {"watcherId": watcher_id}


def _watcher(call: Call, req: dict[str, Any]) -> tuple[str, _Watcher]:
    watcher_id = req.get("watcherId")
    watcher = _watchers.get(watcher_id) if isinstance(watcher_id, str) else None
    if watcher is None or watcher.sandbox_id != call.sandbox.id:
        raise ConnectError("not_found", f"watcher {watcher_id} not found")
    return watcher_id, watcher  # type: ignore[return-value]


async def get_watcher_events(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    _, watcher = _watcher(call, req)
    return {"events": await _diff_now(call, watcher, False)}


async def remove_watcher(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    watcher_id, _ = _watcher(call, req)
    _watchers.pop(watcher_id, None)
    return {}


def watch_dir(call: Call, req: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """Takes the watch's place first (a refusal is the stream's ``resource_exhausted``), then streams."""
    try:
        slot = sandbox_fs.watch_slots.take(call.sandbox.user_id, call.sandbox.id)
    except errors.RateLimited as exc:
        raise ConnectError("resource_exhausted", exc.message) from None
    stream = _watch_dir(call, req, slot)
    slot.hold_for(stream)
    return stream


async def _watch_dir(
    call: Call, req: dict[str, Any], slot: sandbox_fs.WatchSlot
) -> AsyncIterator[dict[str, Any]]:
    try:
        path = _path(req.get("path"))
        recursive, include_entry = bool(req.get("recursive")), bool(req.get("includeEntry"))
        code, out, err = await _run(call, sandbox_fs.DIRECTORY, path)
        if code != 0:
            raise _fail(code, err, path)
        absolute = path if path.startswith("/") else out.decode("utf-8", "surrogateescape").removesuffix("\n")
        with mapped():
            inotify = await dirwatch.open_stream(call.link, call.sandbox.id, absolute, recursive)
        stream = (
            _polled(call, req, include_entry)
            if inotify is None
            else _followed(call, path, inotify, include_entry)
        )
        async for message in stream:
            yield message
    finally:
        slot.release()


_KINDS = {"create": "EVENT_TYPE_CREATE", "modify": "EVENT_TYPE_WRITE", "delete": "EVENT_TYPE_REMOVE"}


async def _followed(
    call: Call, path: str, inotify: dirwatch.Lines, include_entry: bool
) -> AsyncIterator[dict[str, Any]]:
    yield {"start": {}}
    prefix = path.rstrip("/") + "/"
    async for item in dirwatch.follow(inotify, path, KEEPALIVE_S, math.inf):
        if isinstance(item, dirwatch.Event):
            event: dict[str, Any] = {"name": item.path.removeprefix(prefix), "type": _KINDS[item.kind]}
            if include_entry and item.kind != "delete":
                with contextlib.suppress(ConnectError):  # gone again already: the event without it
                    event["entry"] = await _one(call, sandbox_fs.STAT, item.path)
            yield {"filesystem": event}
        elif isinstance(item, dirwatch.Tick):
            yield {"keepalive": {}}
        elif isinstance(item, dirwatch.Overflow):
            # envd's own watcher ends the stream on an overflow (fsnotify's error) the same way
            raise ConnectError("internal", "watcher error: events were lost (too many at once); watch again")
        elif item.missing:
            raise ConnectError("not_found", f"path {path} does not exist")
        else:
            raise ConnectError("unavailable", "the sandbox is no longer running")


async def _polled(call: Call, req: dict[str, Any], include_entry: bool) -> AsyncIterator[dict[str, Any]]:
    watcher = await _new_watcher(call, req)
    yield {"start": {}}
    quiet = 0.0
    while True:
        await asyncio.sleep(sandbox_fs.WATCH_INTERVAL_S)
        events = await _diff_now(call, watcher, include_entry)
        for event in events:
            yield {"filesystem": event}
        quiet = 0.0 if events else quiet + sandbox_fs.WATCH_INTERVAL_S
        if quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield {"keepalive": {}}


UNARY = {
    "Stat": stat,
    "MakeDir": make_dir,
    "Move": move,
    "ListDir": list_dir,
    "Remove": remove,
    "CreateWatcher": create_watcher,
    "GetWatcherEvents": get_watcher_events,
    "RemoveWatcher": remove_watcher,
}
#: The calls that only read: they end with their caller (``edge/api/caller.py``); the others run to their
#: end, as envd's do, so a remove or a move never stops half done.
READS = frozenset({"Stat", "ListDir", "GetWatcherEvents"})
STREAMS = {"WatchDir": watch_dir}
