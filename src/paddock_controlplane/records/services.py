"""The control plane's wired services, built once in the app's lifespan and passed explicitly."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from paddock_controlplane.records.audit import AuditLog
from paddock_controlplane.records.hotcache import StatusWatch, TTLCache
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.principals import Principal
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.crypto import SecretBox
from paddock_core.db import PointReads
from paddock_core.group_commit import GroupCommit
from paddock_core.logging import get_logger
from paddock_core.timeutil import Clock, utcnow

log = get_logger("paddock.services")

#: Called with a heartbeat's body; returns what to add to the answer (``hibernated_summary``), if anything.
HeartbeatHook = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


class HostConnection(Protocol):
    """The link to one host agent that ``Services`` keeps per host id. ``hosts/hostlink.HostLink`` is
    the one kind; this is all ``records`` knows of it, so records imports nothing from ``hosts``, not
    even for an annotation (hostlink imports this module)."""

    url: str
    #: The host's runtime label when the link was made (a VM host's boots get a longer deadline).
    runtime: str | None

    async def aclose(self) -> None: ...


class BackgroundTasks:
    """Work set off by a request or a reconciler pass that outlives it (a fork's boot, a reclaim …).

    A task is held here until it ends, whatever its outcome, so it is neither garbage-collected while it
    runs nor kept once it is done; an exception it did not handle is logged.
    """

    def __init__(self) -> None:
        self.running: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], *, name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=name)
        self.running.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background_task_failed", task=task.get_name(), exc_info=task.exception())

    async def drain(self) -> None:
        """Wait for every task running now (and any they set off meanwhile)."""
        while self.running:
            await asyncio.gather(*self.running, return_exceptions=True)


@dataclass
class Activity:
    """In-process evidence that a sandbox is in use, read by the idle auto-pause pass."""

    #: Sandbox id → the latest activity seen (epoch seconds): commands, transfers, ingress, host reports.
    last_seen_s: dict[str, float] = field(default_factory=dict)
    #: Sandbox id → commands and transfers in flight now; a sandbox with any is never idle.
    inflight: dict[str, int] = field(default_factory=dict)


@dataclass
class Services:
    settings: ControlPlaneSettings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    #: Lookups by key on the hot paths (``db.PointReads``: on the loop for a SQLite file).
    reads: PointReads
    secret_box: SecretBox
    clock: Clock = utcnow
    #: Monotonic time of the last healthy reconciler pass, for ``/readyz``.
    reconciler_last_ok: float | None = None
    #: Held by each reconciler pass of this process: one at a time, the loop's or one run on its own
    #: (a test's). Two at once would each skip the rows the other holds locked (``SKIP LOCKED`` on
    #: PostgreSQL), and whoever asked for the second would see a pass that did nothing.
    reconciling: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Principals by key hash, and running sandboxes by id, for the exec hot path.
    principals: TTLCache[Principal] = field(default_factory=lambda: TTLCache(1.0))
    running: TTLCache[Sandbox] = field(default_factory=lambda: TTLCache(1.0))
    #: Wakes ``GET /v1/sandboxes/{id}?wait_for=`` when this process commits a change to the sandbox.
    status_watch: StatusWatch = field(default_factory=StatusWatch)
    tasks: BackgroundTasks = field(default_factory=BackgroundTasks)
    activity: Activity = field(default_factory=Activity)
    #: One client per host id, made on first use.
    hostlinks: dict[str, HostConnection] = field(default_factory=dict)
    #: Sandbox ids this process is reclaiming, pausing on its own, or pushing egress/budget to now: at
    #: most one such task per sandbox.
    reclaiming: set[str] = field(default_factory=set)
    auto_pausing: set[str] = field(default_factory=set)
    egress_pushing: set[str] = field(default_factory=set)
    #: Per host, the digest of its hibernated sandboxes' ids last found equal to this database's, and
    #: when (monotonic): a beat with the same digest is answered without reading them again
    #: (``sandboxes/host_reports.py``).
    hibernated_digests: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Monotonic time of the last billing pass (-inf: never, so the first pass bills at once; 0 was not
    #: that: the monotonic clock counts from the host's boot, and on a host up for less than
    #: ``billing_interval_s`` the first pass waited until it had been).
    billing_last: float = -math.inf
    #: The same for stored bytes (snapshots and volumes, ``billing.storage_pass``).
    storage_billing_last: float = -math.inf
    #: Monotonic time this process started judging host liveness (set by the first pass).
    liveness_since: float | None = None
    #: Set by a template submit: the build worker (``template_builds.py``) claims it at once.
    template_wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Called with every heartbeat after it is recorded (set by the app).
    on_heartbeat: HeartbeatHook | None = None
    #: The audit trail's queue (records/audit.py), flushed by workers/audit_writer.py.
    audit: AuditLog = field(default_factory=AuditLog)
    #: Creates of one account that arrive together, admitted in one transaction (``lifecycle.create``).
    create_groups: GroupCommit[Any, Any] = field(default_factory=GroupCommit)

    def mark_reconciled(self) -> None:
        self.reconciler_last_ok = time.monotonic()
