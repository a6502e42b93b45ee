"""The audit trail's writer (``records/audit.py``): flushes the queue, reads the hosts' egress attempts,
prunes by age and by count.

- Every ``audit_flush_interval_s`` (or as soon as 500 events wait) the queued events are inserted in
  one statement. A flush that fails puts its events back (as many as the queue has room for; the rest
  become a ``dropped`` marker) and is retried on the next tick.
- Every ``audit_egress_poll_s`` the hosts with attempts not yet recorded are asked for them
  (``GET /internal/v1/egress/attempts``). A host's heartbeat says how far its attempts have come
  (``egress_audit``: its run and last number), so only a host past what this process last recorded is
  asked, once; a host beats one control plane at a time, so the hosts split between control planes
  as their beats do. A host whose agent does not say is asked every time, as before. The position read
  is kept per host in ``audit_egress_cursors`` and moved in the same transaction as the inserts, under
  the row's lock, so two control planes polling the same host record each attempt once.
- Every ``audit_prune_interval_s`` events older than ``audit_retention_days`` go, and each sandbox this
  process wrote for keeps its newest ``audit_max_events_per_sandbox``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import audit
from paddock_controlplane.records.audit import AuditEgressCursor, AuditEvent
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_hostagent.client import HostAgentError
from paddock_hostagent.schemas import EgressAttempts

log = get_logger(__name__)

#: Attempts asked for per poll of a host.
POLL_LIMIT = 1000


class AuditWriter:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.log = services.audit
        self._tasks: list[asyncio.Task[None]] = []
        #: Sandboxes written for since the last prune (only they can have grown past the cap).
        self._grown: set[str] = set()
        self.flushed = 0
        #: One flush at a time: a read's ``flush_now`` that finds the queue just taken by the loop
        #: waits here for that insert to commit, so the read still sees what was done before it.
        self._flushing = asyncio.Lock()
        #: Host id → (agent run, last attempt number) recorded, as this process last saw the cursor.
        self._recorded: dict[str, tuple[str, int]] = {}

    def start(self) -> None:
        self.log.flusher = self.flush
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="audit-flush"),
            asyncio.create_task(self._egress_loop(), name="audit-egress"),
            asyncio.create_task(self._prune_loop(), name="audit-prune"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.log.flusher = None
        with contextlib.suppress(Exception):  # what is queued still goes in, if the database is there
            await self.flush()

    # -- flushing ----------------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        interval = self.services.settings.audit_flush_interval_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.log.full.wait(), interval)
            try:
                await self.flush()
            except Exception as exc:  # the database is away: the events wait for the next tick
                log.warning("audit_flush_failed", problem=str(exc) or type(exc).__name__)

    async def flush(self) -> int:
        async with self._flushing:
            events = self.log.take()
            if not events:
                return 0
            try:
                await self._insert(events)
            except BaseException:
                self.log.putback(events)
                raise
        self._grown.update(event.sandbox_id for event in events)
        self.flushed += len(events)
        return len(events)

    async def _insert(self, events: list[audit.Pending]) -> None:
        async with transaction(self.services.sessions) as session:
            await session.execute(insert(AuditEvent), [event.row() for event in events])

    # -- egress attempts ---------------------------------------------------------------------------

    async def _egress_loop(self) -> None:
        while True:
            await asyncio.sleep(self.services.settings.audit_egress_poll_s)
            try:
                await self.poll_hosts()
            except Exception as exc:
                log.warning("audit_egress_poll_failed", problem=str(exc) or type(exc).__name__)

    def due_hosts(self) -> list[str]:
        """The hosts to ask now: those heard from since ``host_dead_after_s`` whose heartbeat says they
        have attempts past what this process last recorded of them, and those whose agent does not say."""
        now = time.monotonic()
        fresh_s = max(
            self.services.settings.host_dead_after_s, 3 * self.services.settings.audit_egress_poll_s
        )
        due: list[str] = []
        for host_id, heard in list(self.log.egress_heard.items()):
            if now - heard.at > fresh_s:  # a dead host, or one that beats another control plane now
                del self.log.egress_heard[host_id]
                self._recorded.pop(host_id, None)
                continue
            if heard.epoch is None:
                due.append(host_id)
                continue
            recorded = self._recorded.get(host_id)
            if heard.seq > 0 and (recorded is None or recorded[0] != heard.epoch or recorded[1] < heard.seq):
                due.append(host_id)
        return due

    async def poll_hosts(self) -> int:
        recorded = 0
        for host_id in self.due_hosts():
            try:
                recorded += await self.poll_host(host_id)
            except (HostAgentError, hostlink.HostError, OSError) as exc:
                log.info("audit_egress_host_unreachable", host_id=host_id, problem=str(exc))
        return recorded

    async def poll_host(self, host_id: str) -> int:
        async with self.services.sessions() as session:
            cursor = await session.get(AuditEgressCursor, host_id)
            epoch, after = (cursor.epoch, cursor.seq) if cursor is not None else ("", 0)
        link = await hostlink.for_host(self.services, host_id)
        answer = await link.client.egress_attempts(epoch, after, POLL_LIMIT)
        if not answer.epoch:  # the host has no egress table (egress not enforced there)
            self._recorded[host_id] = ("", answer.next)
            return 0
        return await self._record_attempts(host_id, answer)

    async def _record_attempts(self, host_id: str, answer: EgressAttempts) -> int:
        async with transaction(self.services.sessions) as session:
            # The row first (one process makes it, another's insert does nothing), so that the lock
            # below always has a row to hold: a first poll by two control planes at once is serialised.
            dialect = postgresql if self.services.engine.dialect.name == "postgresql" else sqlite
            await session.execute(
                dialect.insert(AuditEgressCursor)
                .values(host_id=host_id, epoch=answer.epoch, seq=0)
                .on_conflict_do_nothing()
            )
            cursor = await session.get(
                AuditEgressCursor, host_id, with_for_update=True, populate_existing=True
            )
            if cursor is None:  # just made, or made by another control plane
                raise RuntimeError(f"no egress cursor row for host {host_id}")
            if cursor.epoch != answer.epoch:
                cursor.epoch, cursor.seq = answer.epoch, 0
            fresh = [item for item in answer.attempts if item.seq > cursor.seq]
            if answer.lost:
                log.warning("audit_egress_attempts_lost", host_id=host_id, lost=answer.lost)
            if fresh:
                ids = {item.sandbox_id for item in fresh}
                owners = dict(
                    (
                        await session.execute(select(Sandbox.id, Sandbox.user_id).where(Sandbox.id.in_(ids)))
                    ).all()
                )
                rows: list[dict[str, Any]] = [
                    {
                        "sandbox_id": item.sandbox_id,
                        "user_id": owners[item.sandbox_id],
                        "at": dt.datetime.fromtimestamp(item.at, dt.UTC),
                        "kind": "egress",
                        "actor": None,
                        "detail": {
                            "verdict": item.verdict,
                            "address": item.address,
                            "protocol": item.protocol,
                            "port": item.port,
                            "packets": item.packets,
                        },
                    }
                    for item in fresh
                    if item.sandbox_id in owners
                ]
                if rows:
                    await session.execute(insert(AuditEvent), rows)
                    self._grown.update(row["sandbox_id"] for row in rows)
                cursor.seq = max(item.seq for item in fresh)
            elif answer.next > cursor.seq:
                cursor.seq = answer.next
            position = (cursor.epoch, cursor.seq)
        self._recorded[host_id] = position
        return len(fresh)

    # -- retention ---------------------------------------------------------------------------------

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(self.services.settings.audit_prune_interval_s)
            try:
                await self.prune()
            except Exception as exc:
                log.warning("audit_prune_failed", problem=str(exc) or type(exc).__name__)

    async def prune(self) -> int:
        """Deletes what retention no longer keeps; the number of events deleted."""
        settings = self.services.settings
        started = time.perf_counter()
        cutoff = self.services.clock() - dt.timedelta(days=settings.audit_retention_days)
        async with transaction(self.services.sessions) as session:
            aged = await session.execute(delete(AuditEvent).where(AuditEvent.at < cutoff))
            deleted = int(aged.rowcount or 0)  # type: ignore[attr-defined]
        grown, self._grown = self._grown, set()
        cap = settings.audit_max_events_per_sandbox
        for sandbox_id in grown:
            async with transaction(self.services.sessions) as session:
                count = await session.scalar(
                    select(func.count()).select_from(AuditEvent).where(AuditEvent.sandbox_id == sandbox_id)
                )
                if not count or count <= cap:
                    continue
                edge = (
                    await session.execute(
                        select(AuditEvent.at, AuditEvent.id)
                        .where(AuditEvent.sandbox_id == sandbox_id)
                        .order_by(AuditEvent.at.desc(), AuditEvent.id.desc())
                        .offset(cap)
                        .limit(1)
                    )
                ).first()
                if edge is None:
                    continue
                result = await session.execute(
                    delete(AuditEvent).where(
                        AuditEvent.sandbox_id == sandbox_id,
                        or_(
                            AuditEvent.at < edge.at, and_(AuditEvent.at == edge.at, AuditEvent.id <= edge.id)
                        ),
                    )
                )
                deleted += int(result.rowcount or 0)  # type: ignore[attr-defined]
        if deleted:
            log.info("audit_pruned", events=deleted, ms=audit.elapsed_ms(started))
        return deleted
