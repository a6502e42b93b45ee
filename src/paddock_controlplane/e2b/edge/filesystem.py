"""envd's ``filesystem.Filesystem`` service (``packages/envd/spec/filesystem/filesystem.proto``) on
Paddock's guest: each call runs ``find``/``mkdir``/``mv``/``rm`` in the sandbox through its exec, with the
paths passed as arguments (``sh -c SCRIPT sh PATH…``), never pasted into a command line.

Paddock's guest has no inotify API, so a directory watch is polled: the edge lists the tree (bounded by
``MAX_WATCH_ENTRIES``) and reports what appeared (create), changed size or time (write) or went away
(remove) since the previous look. ``WatchDir`` looks every ``WATCH_INTERVAL_S``; the watcher API
(``CreateWatcher``/``GetWatcherEvents``, what the sync SDK polls) looks on each poll. A rename shows as a
remove and a create (docs/e2b.md lists it as a difference).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import weakref
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from paddock_controlplane.activity import Inflight
from paddock_controlplane.e2b.edge.connect import ConnectError
from paddock_controlplane.e2b.edge.context import Call, mapped
from paddock_core import errors

#: One entry per ``\0``-separated record of 9 fields.
_PRINTF = r"%y\0%s\0%m\0%M\0%u\0%g\0%T@\0%l\0%p\0"
_FIELDS = 9
#: Exit codes the scripts use for E2B's answers.
_MISSING, _NOT_DIR, _EXISTS = 3, 4, 5
# ``$1`` is the path; a relative one is under the user's home, as envd resolves it.
_PRELUDE = 'cd "${HOME:-/}" 2>/dev/null || cd /; '
_STAT = _PRELUDE + '[ -e "$1" ] || [ -L "$1" ] || exit 3; exec find "$1" -maxdepth 0 -printf "$2"'
_LIST = (
    _PRELUDE + '[ -e "$1" ] || exit 3; [ -d "$1" ] || exit 4; '
    'find "$1" -mindepth 1 -maxdepth "$3" -printf "$2" 2>/dev/null | head -c "$4"; exit 0'
)
_MKDIR = _PRELUDE + '[ -e "$1" ] && exit 5; mkdir -p -- "$1" && exec find "$1" -maxdepth 0 -printf "$2"'
_MOVE = (
    _PRELUDE + '[ -e "$1" ] || [ -L "$1" ] || exit 3; mkdir -p -- "$(dirname -- "$3")" && mv -f -- "$1" "$3" '
    '&& exec find "$3" -maxdepth 0 -printf "$2"'
)
_REMOVE = _PRELUDE + '[ -e "$1" ] || [ -L "$1" ] || exit 3; exec rm -rf -- "$1"'
_TYPES = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY", "l": "FILE_TYPE_SYMLINK"}
MAX_PATH = 4096
MAX_DEPTH = 64
#: A listing's output, in bytes (about 20,000 entries).
MAX_LIST_BYTES = 4 << 20
MAX_WATCH_ENTRIES = 20_000
WATCH_INTERVAL_S = 0.5
#: Watchers kept across all sandboxes (oldest dropped first).
MAX_WATCHERS = 1_000


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


def _entries(raw: bytes) -> list[dict[str, Any]]:
    parts = raw.split(b"\0")
    out = []
    for i in range(0, len(parts) - _FIELDS + 1, _FIELDS):
        kind, size, mode, perms, owner, group, mtime, target, path = (
            p.decode("utf-8", "replace") for p in parts[i : i + _FIELDS]
        )
        seconds = float(mtime or 0)
        entry: dict[str, Any] = {
            "name": path.rstrip("/").rsplit("/", 1)[-1] or "/",
            "type": _TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
            "path": path,
            "size": str(int(size or 0)),
            "mode": int(mode or "0", 8),
            "permissions": perms,
            "owner": owner,
            "group": group,
            "modifiedTime": dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z"),
        }
        if kind == "l":
            entry["symlinkTarget"] = target
        out.append(entry)
    return out


def _fail(code: int, stderr: str, path: str) -> ConnectError:
    if code == _MISSING:
        return ConnectError("not_found", f"path {path} does not exist")
    if code == _NOT_DIR:
        return ConnectError("invalid_argument", f"path {path} is not a directory")
    if code == _EXISTS:
        return ConnectError("already_exists", f"path {path} already exists")
    return ConnectError("internal", (stderr.strip() or f"exit status {code}")[:1000])


async def _one(call: Call, script: str, path: str, *more: str) -> dict[str, Any]:
    code, out, err = await _run(call, script, path, _PRINTF, *more)
    entries = _entries(out) if code == 0 else []
    if not entries:
        raise _fail(code, err, path)
    return entries[0]


async def stat(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    return {"entry": await _one(call, _STAT, _path(req.get("path")))}


async def make_dir(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    return {"entry": await _one(call, _MKDIR, _path(req.get("path")))}


async def move(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    source, destination = _path(req.get("source"), "source"), _path(req.get("destination"), "destination")
    return {"entry": await _one(call, _MOVE, source, destination)}


async def remove(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    path = _path(req.get("path"))
    code, _, err = await _run(call, _REMOVE, path)
    if code != 0:
        raise _fail(code, err, path)
    return {}


async def _listing(call: Call, path: str, depth: int, limit: int = MAX_LIST_BYTES) -> list[dict[str, Any]]:
    code, out, err = await _run(call, _LIST, path, _PRINTF, str(depth), str(limit))
    if code != 0:
        raise _fail(code, err, path)
    return _entries(out)


async def list_dir(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    path = _path(req.get("path"))
    depth = req.get("depth") or 1
    if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise ConnectError("invalid_argument", f"depth: must be 1..{MAX_DEPTH}")
    return {"entries": await _listing(call, path, depth)}


# --- watching, by polling ----------------------------------------------------------------------------


@dataclass
class _Watcher:
    sandbox_id: str
    path: str
    depth: int
    seen: dict[str, tuple[str, str]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_watchers: OrderedDict[str, _Watcher] = OrderedDict()

#: Open watch streams (this edge's ``WatchDir`` and ``/v1``'s ``GET …/files/watch``, one limiter for
#: both) allowed per sandbox and per account: each one runs a listing in its sandbox every
#: ``WATCH_INTERVAL_S`` (isolation rule 5). One more is a 429 with Retry-After (Connect's
#: ``resource_exhausted`` on the edge) until one of them closes.
MAX_WATCHES_PER_SANDBOX = 8
MAX_WATCHES_PER_ACCOUNT = 32
WATCH_RETRY_AFTER_S = 5


class WatchSlot:
    """One open watch's place; ``release`` is idempotent (the stream's ``finally``, or its collection
    when it never started)."""

    def __init__(self, slots: WatchSlots, user_id: str, sandbox_id: str) -> None:
        self._slots, self.user_id, self.sandbox_id = slots, user_id, sandbox_id
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.give_back(self)

    def hold_for(self, stream: object) -> None:
        """Frees the place when ``stream`` is collected, should it never be iterated to its end."""
        weakref.finalize(stream, self.release)


class WatchSlots:
    def __init__(self, per_sandbox: int, per_account: int) -> None:
        self.per_sandbox, self.per_account = per_sandbox, per_account
        self.by_sandbox: Counter[str] = Counter()
        self.by_account: Counter[str] = Counter()

    def take(self, user_id: str, sandbox_id: str) -> WatchSlot:
        if self.by_sandbox[sandbox_id] >= self.per_sandbox:
            raise errors.RateLimited(
                f"a sandbox has at most {self.per_sandbox} open watches; close one and retry",
                retry_after_s=WATCH_RETRY_AFTER_S,
            )
        if self.by_account[user_id] >= self.per_account:
            raise errors.RateLimited(
                f"an account has at most {self.per_account} open watches; close one and retry",
                retry_after_s=WATCH_RETRY_AFTER_S,
            )
        self.by_sandbox[sandbox_id] += 1
        self.by_account[user_id] += 1
        return WatchSlot(self, user_id, sandbox_id)

    def give_back(self, slot: WatchSlot) -> None:
        for counter, key in ((self.by_sandbox, slot.sandbox_id), (self.by_account, slot.user_id)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]


watch_slots = WatchSlots(MAX_WATCHES_PER_SANDBOX, MAX_WATCHES_PER_ACCOUNT)


async def _snapshot(call: Call, watcher: _Watcher) -> dict[str, dict[str, Any]]:
    entries = await _listing(call, watcher.path, watcher.depth)
    return {entry["path"]: entry for entry in entries[:MAX_WATCH_ENTRIES]}


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
    watcher = _Watcher(call.sandbox.id, _path(req.get("path")), MAX_DEPTH if req.get("recursive") else 1)
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
        slot = watch_slots.take(call.sandbox.user_id, call.sandbox.id)
    except errors.RateLimited as exc:
        raise ConnectError("resource_exhausted", exc.message) from None
    stream = _watch_dir(call, req, slot)
    slot.hold_for(stream)
    return stream


async def _watch_dir(call: Call, req: dict[str, Any], slot: WatchSlot) -> AsyncIterator[dict[str, Any]]:
    try:
        watcher = await _new_watcher(call, req)
        include_entry = bool(req.get("includeEntry"))
        yield {"start": {}}
        quiet = 0.0
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            events = await _diff_now(call, watcher, include_entry)
            for event in events:
                yield {"filesystem": event}
            quiet = 0.0 if events else quiet + WATCH_INTERVAL_S
            if quiet >= 5:
                quiet = 0.0
                yield {"keepalive": {}}
    finally:
        slot.release()


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
STREAMS = {"WatchDir": watch_dir}
