"""Short-lived in-process caches for the hot paths (auth and exec), so a command costs no database trip.

Entries live ``ttl_s`` (default 1 s): a key revoked, or a sandbox paused, by another control-plane
process is seen within that time. Changes made by this process invalidate at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Generic, TypeVar

from sqlalchemy import inspect
from sqlalchemy.orm import Session

V = TypeVar("V")


class TTLCache(Generic[V]):
    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[str, tuple[float, V]] = {}

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            self._entries.pop(key, None)
            return None
        return entry[1]

    def put(self, key: str, value: V) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self.ttl_s, value)

    def drop(self, key: str) -> None:
        self._entries.pop(key, None)


class StatusWatch:
    """Wakes requests waiting on a sandbox (``GET …?wait_for=``) when this process commits a change to
    it. Changes made by another control-plane process are not seen here: waiters re-read on a timer too.
    """

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def watch(self, sandbox_id: str) -> asyncio.Event:
        """The event the next committed change to ``sandbox_id`` sets. Take it *before* reading the row:
        a change committed while the read is in flight (PostgreSQL's reads suspend) then still wakes
        the waiter, where an event taken after the read would wait for the one after."""
        return self._events.setdefault(sandbox_id, asyncio.Event())

    @staticmethod
    async def wait(changed: asyncio.Event, timeout_s: float) -> None:
        """Returns once ``changed`` (from :meth:`watch`) is set, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout_s)

    def changed(self, sandbox_id: str) -> None:
        event = self._events.pop(sandbox_id, None)
        if event is not None:
            event.set()


SANDBOX_CACHES = ("running_cache", "ingress_cache")
_CHANGED = "changed_sandboxes"


def drop_sandbox(info: dict[Any, Any], sandbox_id: str) -> None:
    """The sandbox leaves this process's sandbox caches (those its sessions carry in ``info``): what a
    change to its row does, whether the ORM flushed it or a plain statement wrote it."""
    for name in SANDBOX_CACHES:
        cache = info.get(name)
        if isinstance(cache, TTLCache):
            cache.drop(sandbox_id)


def drop_changed_sandboxes(session: Session, _: object) -> None:
    """``after_flush`` hook: any sandbox row this process changes leaves the sandbox caches at once,
    and is noted for the status watch, woken once the transaction commits."""
    watch = session.info.get("status_watch")
    if watch is None and not any(session.info.get(name) is not None for name in SANDBOX_CACHES):
        return
    for obj in (*session.dirty, *session.deleted):
        sandbox_id = getattr(obj, "__tablename__", None) == "sandboxes" and getattr(obj, "id", None)
        if sandbox_id and (obj in session.deleted or _changes_what_is_cached(obj)):
            drop_sandbox(session.info, sandbox_id)
            if watch is not None:
                session.info.setdefault(_CHANGED, set()).add(sandbox_id)


#: What the hot paths read from a cached row (exec: owner, host, status, envs; ingress: address, switch,
#: how its ports are reached) and what waiters wait on (status). Heartbeats and billing rewrite usage
#: counters and ``billed_until`` of every running sandbox every few seconds; those must not empty the
#: caches each time.
CACHED_COLUMNS = (
    "status",
    "user_id",
    "host_id",
    "ip",
    "envs_sealed",
    "env_keys",
    "ingress_enabled",
    "ingress_host_header",
    "ingress_https_ports",
)


def _changes_what_is_cached(obj: object) -> bool:
    state = inspect(obj)
    return any(state.attrs[name].history.has_changes() for name in CACHED_COLUMNS)


def wake_watchers(session: Session) -> None:
    """``after_commit`` hook: the changes noted at flush are now visible to other sessions."""
    changed = session.info.pop(_CHANGED, None)
    watch = session.info.get("status_watch")
    if changed and isinstance(watch, StatusWatch):
        for sandbox_id in changed:
            watch.changed(sandbox_id)


def forget_changes(session: Session) -> None:
    """``after_rollback`` hook: nothing noted at flush was committed."""
    session.info.pop(_CHANGED, None)
