"""The reconciler loop: host liveness, and (as resources grow) billing, idle auto-pause, cleanup.

Runs inside the control-plane process; every pass is a short transaction, so several control-plane
processes on PostgreSQL can run it side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane import hosts
from paddock_controlplane.services import Services
from paddock_core.db import transaction
from paddock_core.logging import get_logger

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
