"""Reconciler passes for sandboxes: dead hosts, host reports, billing, idle auto-pause, stuck transitions."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane import billing, hostlink, power
from paddock_controlplane.models import Host, Sandbox
from paddock_controlplane.services import Services
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import as_utc

log = get_logger("paddock.upkeep")

REPORT_GRACE_S = 10.0
HOST_DEAD_REASON = "host stopped responding"
ON_HOST = ("creating", "running", "pausing", "paused", "resuming", "forking")


async def dead_host_pass(session: AsyncSession, services: Services) -> None:
    """Sandboxes on a ``dead`` host become ``error`` (they can still be destroyed)."""
    dead = select(Host.id).where(Host.status == "dead")
    rows = (
        await session.scalars(select(Sandbox).where(Sandbox.host_id.in_(dead), Sandbox.status.in_(ON_HOST)))
    ).all()
    for sandbox in rows:
        if sandbox.status == "running":
            await billing.settle(session, sandbox, services.clock())
        sandbox.status, sandbox.status_reason = "error", HOST_DEAD_REASON
        log.warning("sandbox_error_host_dead", sandbox_id=sandbox.id, host_id=sandbox.host_id)


async def apply_host_report(services: Services, beat: dict[str, Any]) -> None:
    """Fold a heartbeat's per-sandbox report into the rows: OOM kills, activity, vanished sandboxes."""
    reports = {str(r.get("id")): r for r in beat.get("sandboxes", []) if r.get("id")}
    activity = services.activity.last_seen_s
    async with transaction(services.sessions) as session:
        rows = (
            await session.scalars(
                select(Sandbox).where(
                    Sandbox.host_id == beat["id"], Sandbox.status.in_(("running", "paused", "error"))
                )
            )
        ).all()
        now = services.clock()
        for sandbox in rows:
            report = reports.get(sandbox.id)
            if sandbox.status == "error":
                _revive(sandbox, report, now)
                continue
            changed_at = [
                t
                for t in (sandbox.created_at, sandbox.running_at, sandbox.paused_at, sandbox.last_resumed_at)
                if t
            ]
            if changed_at and (now - as_utc(max(changed_at, key=as_utc))).total_seconds() < REPORT_GRACE_S:
                continue  # the report may predate this sandbox's latest transition
            if report is None or report.get("status") == "stopped":
                if sandbox.status == "running":
                    await billing.settle(session, sandbox, services.clock())
                sandbox.status = "error"
                sandbox.status_reason = "sandbox stopped unexpectedly on its host"
                continue
            kills = int(report.get("oom_kills") or 0)
            if kills > (sandbox.oom_kills or 0):
                sandbox.oom_kills = kills
            seen = report.get("last_activity_at")
            if seen:
                activity[sandbox.id] = max(activity.get(sandbox.id, 0.0), float(seen))
            wish = report.get("self_request")
            if isinstance(wish, dict) and sandbox.status == "running":
                _act_on_self_request(services, sandbox, wish)
            if "egress_bytes" in report:
                _fold_usage(services, sandbox, report)


def _fold_usage(services: Services, sandbox: Sandbox, report: dict[str, Any]) -> None:
    """Bandwidth counted by the host; an allowlist or budget the host does not hold yet is pushed again
    (a PUT egress or recharge whose push failed, or that raced a boot)."""
    sandbox.bandwidth_used_bytes = max(int(sandbox.bandwidth_used_bytes or 0), int(report["egress_bytes"]))
    ingress = int(report.get("ingress_bytes") or 0)
    sandbox.bandwidth_ingress_bytes = max(int(sandbox.bandwidth_ingress_bytes or 0), ingress)
    rules, quota = list(sandbox.egress or []), int(sandbox.bandwidth_quota_bytes)
    if report.get("egress") == rules and report.get("quota_bytes") == quota:
        return
    pushing = services.egress_pushing
    if sandbox.id in pushing:
        return
    pushing.add(sandbox.id)
    sandbox_id, host_id = sandbox.id, sandbox.host_id

    async def push() -> None:
        try:
            link = await hostlink.for_host(services, host_id)
            await link.set_egress(sandbox_id, rules)
            await link.set_bandwidth(sandbox_id, quota)
            log.info("sandbox_egress_resynced", sandbox_id=sandbox_id)
        except Exception as exc:
            log.warning("egress_resync_failed", sandbox_id=sandbox_id, error=str(exc))
        finally:
            pushing.discard(sandbox_id)

    services.tasks.spawn(push(), name=f"egress resync {sandbox_id}")


async def billing_pass(session: AsyncSession, services: Services) -> None:
    if time.monotonic() - services.billing_last < services.settings.billing_interval_s:
        return
    services.billing_last = time.monotonic()
    exhausted = await billing.billing_pass(session, services.clock())
    if exhausted:
        running = (
            await session.scalars(
                select(Sandbox).where(Sandbox.user_id.in_(exhausted), Sandbox.status == "running")
            )
        ).all()
        for sandbox in running:
            _pause_later(services, sandbox, "credit")


async def idle_pass(session: AsyncSession, services: Services) -> None:
    now = services.clock()
    activity = services.activity.last_seen_s
    inflight = services.activity.inflight
    rows = (
        await session.scalars(
            select(Sandbox).where(Sandbox.status == "running", Sandbox.auto_pause_after_seconds.is_not(None))
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
            _pause_later(services, sandbox, "idle")


def _revive(sandbox: Sandbox, report: dict[str, Any] | None, now: Any) -> None:
    """A host declared dead came back with this sandbox intact: it is running (or paused) again."""
    if sandbox.status_reason != HOST_DEAD_REASON or report is None:
        return
    if report.get("status") == "running":
        sandbox.status, sandbox.status_reason, sandbox.billed_until = "running", None, now
    elif report.get("status") == "paused":
        sandbox.status, sandbox.status_reason = "paused", None
    else:
        return
    log.info("sandbox_revived", sandbox_id=sandbox.id, status=sandbox.status)


def _act_on_self_request(services: Services, sandbox: Sandbox, wish: dict[str, Any]) -> None:
    """A guest asked to pause or delete its own sandbox (spec 12.4): act as the API would, reason "self"."""
    label = str(wish.get("reason") or "")[:128] or None
    if wish.get("action") == "pause":
        _pause_later(services, sandbox, "self", label=label)
    elif wish.get("action") == "delete":
        _destroy_later(services, sandbox, label)


def _destroy_later(services: Services, sandbox: Sandbox, label: str | None) -> None:
    async def run() -> None:
        try:
            await power.destroy(services, sandbox.user_id, sandbox.id, reason="self", label=label)
            log.info("sandbox_self_destroyed", sandbox_id=sandbox.id)
        except Exception as exc:
            log.warning("self_destroy_failed", sandbox_id=sandbox.id, error=str(exc))

    services.tasks.spawn(run(), name=f"self destroy {sandbox.id}")


def _pause_later(services: Services, sandbox: Sandbox, reason: str, *, label: str | None = None) -> None:
    pausing = services.auto_pausing
    if sandbox.id in pausing:
        return
    pausing.add(sandbox.id)

    async def run() -> None:
        try:
            await power.pause(services, sandbox.user_id, sandbox.id, reason=reason, label=label)
            log.info("sandbox_auto_paused", sandbox_id=sandbox.id, reason=reason)
        except errors.InvalidState:
            pass  # paused or destroyed meanwhile: nothing left to do
        except Exception as exc:
            log.warning("auto_pause_failed", sandbox_id=sandbox.id, error=str(exc))
        finally:
            pausing.discard(sandbox.id)

    services.tasks.spawn(run(), name=f"{reason} pause {sandbox.id}")


PASSES = [dead_host_pass, billing_pass, idle_pass, power.settle_stuck]
