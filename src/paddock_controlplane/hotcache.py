"""Short-lived in-process caches for the hot paths (auth and exec), so a command costs no database trip.

Entries live ``ttl_s`` (default 1 s): a key revoked, or a sandbox paused, by another control-plane
process is seen within that time. Changes made by this process invalidate at once.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

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


SANDBOX_CACHES = ("running_cache", "ingress_cache")


def drop_changed_sandboxes(session: Session, _: object) -> None:
    """``after_flush`` hook: any sandbox row this process changes leaves the sandbox caches at once."""
    caches = [session.info[name] for name in SANDBOX_CACHES if session.info.get(name) is not None]
    if not caches:
        return
    for obj in (*session.dirty, *session.deleted):
        sandbox_id = getattr(obj, "__tablename__", None) == "sandboxes" and getattr(obj, "id", None)
        if sandbox_id:
            for cache in caches:
                cache.drop(sandbox_id)
