"""Hourly metering: each running project consumes its monthly price × 100 / 730 credits per hour.

The worker looks for ended hours on every pass (and when woken after a top-up). For each live project
it writes one usage entry per ended hour, keyed ``usage:<project>:<hour>`` so a re-run pass cannot
charge twice. Hour ``h`` costs ``cum(h) − cum(h−1)`` with ``cum(h) = ⌊h × monthly × 100 / 730⌋``
micro-credits, so 730 hours cost exactly one month and no rounding accumulates.

When a wallet's balance reaches zero its live projects are paused (their sandboxes paused); after a
top-up the next pass resumes them, and the paused hours are not billed. Projects whose deployment
failed are not billed. The clock is injected, so tests move time instead of waiting.

A project funded by an x402 ``upto`` authorisation (``upto``) is billed by the second against that
authorisation instead: hourly metering skips it, it is neither paused for the wallet's balance nor waits
for one to resume, and each pass first settles the authorisations that are due (``UptoBilling``), each
exactly once. Once settled, the project is back on the wallet's credits from the period's end. The worker
wakes for the next due authorisation as well as every ``metering_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import Clock, as_utc
from paddock_gateway import auth, credits, siwx, upto
from paddock_gateway.adapters.hosting import HostingError, HostingPlatform
from paddock_gateway.models import Project
from paddock_gateway.settings import GatewaySettings

log = get_logger("paddock.gateway.metering")
HOUR = dt.timedelta(hours=1)


@dataclass
class MeteringReport:
    hours_billed: int = 0
    micro_credits: int = 0
    paused: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    settled: list[upto.Settled] = field(default_factory=list)


def hour_cost_micro(monthly_raw: int, hour_index: int, hours_per_month: int) -> int:
    """Micro-credits for hour ``hour_index`` (1-based) of a project priced ``monthly_raw`` 10^-6 USD."""
    monthly_micro = monthly_raw * credits.MICRO_CREDITS_PER_RAW
    return (hour_index * monthly_micro) // hours_per_month - (
        (hour_index - 1) * monthly_micro
    ) // hours_per_month


class Metering:
    """The hourly worker: it needs the database, the clock, its settings and the hosting platform only."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        clock: Clock,
        settings: GatewaySettings,
        hosting: HostingPlatform,
        billing: upto.UptoBilling | None = None,
        enforce: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> None:
        self.enforce = enforce  # pauses the wallets' sandboxes whose paid time is used up
        self.sessions = sessions
        self.clock = clock
        self.settings = settings
        self.hosting = hosting
        self.billing = billing
        self.event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()

    def wake(self) -> None:
        self.event.set()

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name="gateway-metering")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
                await auth.prune_nonces(self.sessions, self.clock(), self.settings.nonce_retention_s)
                await siwx.prune_nonces(self.sessions, self.clock(), self.settings.timestamp_skew_ms / 1000)
            except Exception as exc:  # keep the worker alive; the next pass retries
                log.error("metering_pass_failed", exc_info=exc)
            self.event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), timeout=await self._sleep_s())

    async def _sleep_s(self) -> float:
        """Until the next pass: the interval, or less when an ``upto`` authorisation falls due sooner."""
        interval = self.settings.metering_interval_s
        if self.billing is None:
            return interval
        try:
            due = await self.billing.next_due()
        except Exception as exc:
            log.warning("upto_due_lookup_failed", error=str(exc))
            return interval
        if due is None:
            return interval
        return max(0.0, min(interval, (due - self.clock()).total_seconds() + 0.01))

    async def run_once(self) -> MeteringReport:
        async with self.lock:
            report = MeteringReport()
            if self.enforce is not None:
                report.paused.extend(await self.enforce())
            if self.billing is not None:
                report.settled = await self.billing.settle_due()
            now = self.clock()
            for project_id in await self._project_ids("live"):
                await self._bill(project_id, now, report)
            await self._pause_exhausted(report)
            await self._resume_funded(now, report)
            if report.hours_billed or report.paused or report.resumed or report.settled:
                log.info(
                    "metering_pass",
                    hours=report.hours_billed,
                    micro_credits=report.micro_credits,
                    paused=len(report.paused),
                    resumed=len(report.resumed),
                    upto_settled=len(report.settled),
                )
            return report

    async def _project_ids(self, state: str) -> list[str]:
        async with self.sessions() as session:
            return list(await session.scalars(select(Project.id).where(Project.state == state)))

    async def _on_upto(self, project_id: str) -> bool:
        """Whether an ``upto`` authorisation funds the project now (then credits play no part)."""
        async with self.sessions() as session:
            return await upto.funding(session, project_id) is not None

    async def _failed(self, project: Project) -> bool:
        if project.latest_deployment_id is None:
            return False
        try:
            state = await self.hosting.deployment_status(project.id, project.latest_deployment_id)
        except HostingError:
            return False
        return state.status in ("failed", "deleted")

    async def _bill(self, project_id: str, now: dt.datetime, report: MeteringReport) -> None:
        async with self.sessions() as session:
            project = await session.get(Project, project_id)
        if project is None or project.state != "live" or as_utc(project.metered_until) + HOUR > now:
            return
        if await self._on_upto(project_id):
            return
        failed = await self._failed(project)
        hours_per_month = self.settings.hours_per_month
        async with transaction(self.sessions) as session:
            project = await session.get(Project, project_id)
            if project is None or project.state != "live":
                return
            await credits.lock_wallet(session, project.wallet, now)
            until, hours = as_utc(project.metered_until), project.hours_metered
            while until + HOUR <= now:
                if failed:
                    until = until + HOUR
                    continue
                hours += 1
                cost = hour_cost_micro(project.monthly_raw, hours, hours_per_month)
                debited = await credits.consume(
                    session, project.wallet, cost, f"usage:{project.id}:{hours}", project.id, until + HOUR
                )
                report.hours_billed += 1
                report.micro_credits += debited
                until = until + HOUR
                if await credits.balance_micro(session, project.wallet) <= 0:
                    break
            project.metered_until = until
            project.hours_metered = hours

    async def _pause_exhausted(self, report: MeteringReport) -> None:
        for project_id in await self._project_ids("live"):
            async with self.sessions() as session:
                project = await session.get(Project, project_id)
                if project is None:
                    continue
                balance = await credits.balance_micro(session, project.wallet)
            if balance > 0 or await self._on_upto(project_id):
                continue
            try:
                await self.hosting.pause_project(project_id)
            except HostingError as exc:
                log.warning("pause_failed", project_id=project_id, error=str(exc))
                continue
            await self._set_state(project_id, "live", state="paused")
            report.paused.append(project_id)
            log.info(
                "project_paused", project_id=project_id, wallet=project.wallet, reason="credits exhausted"
            )

    async def _resume_funded(self, now: dt.datetime, report: MeteringReport) -> None:
        for project_id in await self._project_ids("paused"):
            async with self.sessions() as session:
                project = await session.get(Project, project_id)
                if project is None:
                    continue
                balance = await credits.balance_micro(session, project.wallet)
            funded = await self._on_upto(project_id)
            if balance <= 0 and not funded:
                continue
            try:
                await self.hosting.resume_project(project_id)
            except HostingError as exc:
                log.warning("resume_failed", project_id=project_id, error=str(exc))
                continue
            await self._set_state(
                project_id, "paused", state="live", **({} if funded else {"metered_until": now})
            )
            report.resumed.append(project_id)
            log.info("project_resumed", project_id=project_id, wallet=project.wallet)

    async def _set_state(self, project_id: str, expected: str, **values: object) -> None:
        async with transaction(self.sessions) as session:
            await session.execute(
                update(Project).where(Project.id == project_id, Project.state == expected).values(**values)
            )
