"""A heartbeat's per-sandbox report folded into the rows: OOM kills, activity, bandwidth counted, sandboxes
that stopped or vanished, a dead host's sandboxes coming back, and guests' self-pause/self-delete wishes
(spec §12.4), which become the same pause or destroy an API call makes, with ``reason: "self"``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import raiseload

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox, SandboxDisk
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import REPORTED, SandboxStatus
from paddock_controlplane.resources import billing
from paddock_controlplane.sandboxes import destruction, suspension
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import as_utc

log = get_logger("paddock.host_reports")

REPORT_GRACE_S = 10.0
#: ``status_reason`` of sandboxes on a dead host; only these come back when their host does.
HOST_DEAD_REASON = "host stopped responding"


async def apply_host_report(services: Services, beat: dict[str, Any]) -> None:
    """Fold a heartbeat's per-sandbox report into the rows: OOM kills, activity, vanished sandboxes."""
    reports = {str(r.get("id")): r for r in beat.get("sandboxes", []) if r.get("id")}
    activity = services.activity.last_seen_s
    async with transaction(services.sessions) as session:
        # Every heartbeat reads all of its host's sandboxes (a thousand on a dense host, every 2 s), so
        # their network memberships, which no report touches, are not loaded with them.
        rows = (
            await session.scalars(
                select(Sandbox)
                .where(Sandbox.host_id == beat["id"], Sandbox.status.in_(REPORTED))
                .options(raiseload(Sandbox.memberships))
            )
        ).all()
        now = services.clock()
        for sandbox in rows:
            report = reports.get(sandbox.id)
            if sandbox.status == SandboxStatus.ERROR:
                _revive(sandbox, report, now)
                continue
            changed_at = [
                t
                for t in (sandbox.created_at, sandbox.running_at, sandbox.paused_at, sandbox.last_resumed_at)
                if t
            ]
            if report is not None and isinstance(report.get("disk_errors"), dict):  # whatever its state
                await _fold_disk_errors(session, sandbox.id, report["disk_errors"])
            if changed_at and (now - as_utc(max(changed_at, key=as_utc))).total_seconds() < REPORT_GRACE_S:
                continue  # the report may predate this sandbox's latest transition
            kills = int((report or {}).get("oom_kills") or 0)
            out_of_memory = kills > (sandbox.oom_kills or 0)
            if out_of_memory:
                sandbox.oom_kills = kills
            if report is None or report.get("status") in ("stopped", "error"):
                if sandbox.status == SandboxStatus.RUNNING:
                    await billing.settle(session, sandbox, services.clock())
                sandbox.status = SandboxStatus.ERROR
                # On gVisor the memory limit's OOM kill takes the whole sandbox (docs/isolation.md).
                # "error": the host holds it but cannot run it (restarted on another tier), and says why.
                sandbox.status_reason = (
                    "sandbox ran out of memory and was stopped on its host"
                    if out_of_memory
                    else str((report or {}).get("status_reason") or "")[:300]
                    or "sandbox stopped unexpectedly on its host"
                )
                continue
            seen = report.get("last_activity_at")
            if seen:
                activity[sandbox.id] = max(activity.get(sandbox.id, 0.0), float(seen))
            wish = report.get("self_request")
            if isinstance(wish, dict) and sandbox.status == SandboxStatus.RUNNING:
                _act_on_self_request(services, sandbox, wish)
            if "egress_bytes" in report:
                _fold_usage(services, sandbox, report)


async def _fold_disk_errors(session: AsyncSession, sandbox_id: str, failed: dict[str, Any]) -> None:
    """Mounts the host holds as failed (one it could not restore after its restart or an s3fs crash)
    are ``error`` here too, with the host's reason, instead of ``mounted``."""
    rows = (
        await session.scalars(
            select(SandboxDisk).where(
                SandboxDisk.sandbox_id == sandbox_id,
                SandboxDisk.mount_status == "mounted",
                SandboxDisk.mount_path.in_([str(path) for path in failed]),
            )
        )
    ).all()
    for row in rows:
        reason = str(failed.get(row.mount_path) or "the host could not mount the disk again")
        row.mount_status, row.mount_error = "error", reason[:500]
        log.warning("disk_mount_lost", sandbox_id=sandbox_id, mount_path=row.mount_path)


def _fold_usage(services: Services, sandbox: Sandbox, report: dict[str, Any]) -> None:
    """Bandwidth counted by the host; an allowlist or budget the host does not hold yet is pushed again
    (a PUT egress or recharge whose push failed, or that raced a boot)."""
    # Assigned only when they grew: a row assigned at all is flushed and checked at commit, which for a
    # host's every idle sandbox on every heartbeat was most of the heartbeat's cost.
    egress = int(report["egress_bytes"])
    if egress > int(sandbox.bandwidth_used_bytes or 0):
        sandbox.bandwidth_used_bytes = egress
    ingress = int(report.get("ingress_bytes") or 0)
    if ingress > int(sandbox.bandwidth_ingress_bytes or 0):
        sandbox.bandwidth_ingress_bytes = ingress
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


def _revive(sandbox: Sandbox, report: dict[str, Any] | None, now: dt.datetime) -> None:
    """A host declared dead came back with this sandbox intact: it is running (or paused) again."""
    if sandbox.status_reason != HOST_DEAD_REASON or report is None:
        return
    if report.get("status") == SandboxStatus.RUNNING:
        sandbox.status, sandbox.status_reason, sandbox.billed_until = SandboxStatus.RUNNING, None, now
    elif report.get("status") == SandboxStatus.PAUSED:
        sandbox.status, sandbox.status_reason = SandboxStatus.PAUSED, None
    else:
        return
    log.info("sandbox_revived", sandbox_id=sandbox.id, status=sandbox.status)


def _act_on_self_request(services: Services, sandbox: Sandbox, wish: dict[str, Any]) -> None:
    """A guest asked to pause or delete its own sandbox (spec 12.4): act as the API would, reason "self"."""
    label = str(wish.get("reason") or "")[:128] or None
    if wish.get("action") == "pause":
        suspension.pause_later(services, sandbox, "self", label=label)
    elif wish.get("action") == "delete":
        destruction.destroy_later(services, sandbox, reason="self", label=label)
