"""The reconciler: its loop and its passes — host liveness, sandboxes of dead hosts, billing, idle
auto-pause, and destroys and disk mounts a dead process left unfinished.

Runs inside the control-plane process; every pass is a short transaction, so several control-plane
processes on PostgreSQL can run it side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane import billing, destruction, disks, hosts, suspension
from paddock_controlplane.host_reports import HOST_DEAD_REASON
from paddock_controlplane.models import Host, Sandbox
from paddock_controlplane.services import Services
from paddock_controlplane.states import ON_HOST, SandboxStatus
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import as_utc

log = get_logger("paddock.reconciler")

Pass = Callable[[AsyncSession, Services], Awaitable[None]]


async def host_liveness_pass(session: AsyncSession, services: Services) -> None:
    # Hosts could not heartbeat while this process was down: give them one full period after start
    # before judging, or a control-plane restart would kill every host (and error every sandbox).
    if services.liveness_since is None:
        services.liveness_since = time.monotonic()
    since = services.liveness_since
    if time.monotonic() - since < services.settings.host_dead_after_s:
        return
    died = await hosts.mark_silent_hosts_dead(session, services.clock(), services.settings.host_dead_after_s)
    for host_id in died:
        log.warning("host_dead", host_id=host_id)


async def dead_host_pass(session: AsyncSession, services: Services) -> None:
    """Sandboxes on a ``dead`` host become ``error`` (they can still be destroyed)."""
    dead = select(Host.id).where(Host.status == "dead")
    rows = (
        await session.scalars(select(Sandbox).where(Sandbox.host_id.in_(dead), Sandbox.status.in_(ON_HOST)))
    ).all()
    for sandbox in rows:
        if sandbox.status == SandboxStatus.RUNNING:
            await billing.settle(session, sandbox, services.clock())
        sandbox.status, sandbox.status_reason = SandboxStatus.ERROR, HOST_DEAD_REASON
        log.warning("sandbox_error_host_dead", sandbox_id=sandbox.id, host_id=sandbox.host_id)


async def billing_pass(session: AsyncSession, services: Services) -> None:
    if time.monotonic() - services.billing_last < services.settings.billing_interval_s:
        return
    services.billing_last = time.monotonic()
    exhausted = await billing.billing_pass(session, services.clock())
    if exhausted:
        running = (
            await session.scalars(
                select(Sandbox).where(Sandbox.user_id.in_(exhausted), Sandbox.status == SandboxStatus.RUNNING)
            )
        ).all()
        for sandbox in running:
            suspension.pause_later(services, sandbox, "credit")


async def idle_pass(session: AsyncSession, services: Services) -> None:
    now = services.clock()
    activity = services.activity.last_seen_s
    inflight = services.activity.inflight
    rows = (
        await session.scalars(
            select(Sandbox).where(
                Sandbox.status == SandboxStatus.RUNNING, Sandbox.auto_pause_after_seconds.is_not(None)
            )
        )
    ).all()
    for sandbox in rows:
        if inflight.get(sandbox.id):
            continue
        marks = [
            as_utc(t).timestamp()
            for t in (sandbox.last_activity_at, sandbox.last_resumed_at, sandbox.running_at)
            if t
        ]
        if sandbox.id in activity:
            marks.append(activity[sandbox.id])
        last = max(marks) if marks else now.timestamp()
        if now.timestamp() - last >= int(sandbox.auto_pause_after_seconds or 0):
            suspension.pause_later(services, sandbox, "idle")


#: Every pass, in the order a round runs them.
PASSES: list[Pass] = [
    host_liveness_pass,
    dead_host_pass,
    billing_pass,
    idle_pass,
    destruction.settle_stuck,
    disks.settle_pending,
]


class Reconciler:
    def __init__(self, services: Services, passes: list[Pass]) -> None:
        self.services = services
        self.passes = passes
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> None:
        for step in self.passes:
            async with transaction(self.services.sessions) as session:
                await step(session, self.services)
        self.services.mark_reconciled()

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # keep the loop alive; readiness shows the staleness
                log.error("reconcile_failed", exc_info=exc)
            await asyncio.sleep(self.services.settings.reconcile_interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="reconciler")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
