"""The metrics worker (issue #35): every ``metrics_interval_s`` it pulls each live host's per-sandbox
stats (the host agent's ``GET /internal/v1/stats``, one call a host, all hosts at once) and stores them
as raw samples; then it writes the one-minute rollups of the minutes that ended and deletes what is past
retention (records/sandbox_metrics.py: raw samples an hour, rollups a day).

Samples are stamped with the pass's instant snapped to the interval's grid, and inserted skipping any
already there: several control-plane processes on one PostgreSQL each run this worker and still write
one sample per sandbox and interval (the host agent answers a second pull within half a second with the
same CPU percent). A host that does not answer within the interval (at least 5 s) is skipped this pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from sqlalchemy import select

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import sandbox_metrics
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import ON_HOST
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_hostagent.schemas import HostStats

log = get_logger("paddock.sandbox_metrics")

#: A rollup waits this long past the end of its minute (plus one interval) for late samples.
SETTLE_S = 5.0


class MetricsWorker:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.interval_s = services.settings.metrics_interval_s
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()  # hosts whose last pull failed (logged once until they answer)

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="sandbox metrics")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            # On the interval's grid, so that every process pulls at the same instants.
            await asyncio.sleep(self.interval_s - time.time() % self.interval_s)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away: the next pass tries again
                log.warning("metrics_pass_failed", error=str(exc))

    async def run_once(self) -> int:
        """One pass; returns how many samples it stored."""
        services = self.services
        at = sandbox_metrics.snap(services.clock(), self.interval_s)
        async with services.sessions() as session:
            host_ids = (await session.scalars(select(Host.id).where(Host.status != "dead"))).all()
            placed = (
                await session.execute(
                    select(Sandbox.id, Sandbox.user_id, Sandbox.host_id).where(Sandbox.status.in_(ON_HOST))
                )
            ).all()
        owners = {(row.host_id, row.id): row.user_id for row in placed}
        answers = await asyncio.gather(*(self._pull(host_id) for host_id in host_ids))
        rows: list[dict[str, Any]] = []
        for host_id, stats in zip(host_ids, answers, strict=True):
            for sandbox in stats.sandboxes if stats is not None else ():
                user_id = owners.get((host_id, sandbox.id))
                if user_id is None or sandbox.cpu_pct is None:  # not placed there, or no interval yet
                    continue
                rows.append(
                    {
                        "sandbox_id": sandbox.id,
                        "at": at,
                        "user_id": user_id,
                        "vcpu": sandbox.vcpu,
                        "cpu_pct": sandbox.cpu_pct,
                        "mem_used_bytes": sandbox.mem_used_bytes,
                        "mem_limit_bytes": sandbox.mem_limit_bytes,
                        "disk_used_bytes": sandbox.disk_used_bytes,
                        "disk_limit_bytes": sandbox.disk_limit_bytes,
                        "net_rx_bytes": sandbox.net_rx_bytes,
                        "net_tx_bytes": sandbox.net_tx_bytes,
                    }
                )
        now = services.clock()
        async with transaction(services.sessions) as session:
            for start in range(0, len(rows), 500):
                await sandbox_metrics.store(session, rows[start : start + 500])
            await sandbox_metrics.roll_up(session, now, settle_s=SETTLE_S + self.interval_s)
            await sandbox_metrics.prune(session, now)
        return len(rows)

    async def _pull(self, host_id: str) -> HostStats | None:
        try:
            link = await hostlink.for_host(self.services, host_id)
            async with asyncio.timeout(max(self.interval_s, 5.0)):
                stats = await link.stats()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if host_id not in self._failing:
                log.warning("metrics_pull_failed", host_id=host_id, error=str(exc) or type(exc).__name__)
            self._failing.add(host_id)
            return None
        self._failing.discard(host_id)
        return stats
