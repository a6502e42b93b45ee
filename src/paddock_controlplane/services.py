"""The control plane's wired services, built once in the app's lifespan and passed explicitly."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from paddock_controlplane.hotcache import StatusWatch, TTLCache
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.crypto import SecretBox
from paddock_core.timeutil import Clock, utcnow


@dataclass
class Services:
    settings: ControlPlaneSettings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    secret_box: SecretBox
    clock: Clock = utcnow
    #: Monotonic time of the last healthy reconciler pass, for ``/readyz``.
    reconciler_last_ok: float | None = None
    extras: dict[str, object] = field(default_factory=dict)
    #: Principals by key hash, and running sandboxes by id, for the exec hot path.
    principals: TTLCache[object] = field(default_factory=lambda: TTLCache(1.0))
    running: TTLCache[object] = field(default_factory=lambda: TTLCache(1.0))
    #: Wakes ``GET /v1/sandboxes/{id}?wait_for=`` when this process commits a change to the sandbox.
    status_watch: StatusWatch = field(default_factory=StatusWatch)

    def mark_reconciled(self) -> None:
        self.reconciler_last_ok = time.monotonic()
