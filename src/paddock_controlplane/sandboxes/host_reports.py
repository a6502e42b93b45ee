"""A heartbeat's per-sandbox report folded into the rows: OOM kills, activity, bandwidth counted, sandboxes
that stopped or vanished, a dead host's sandboxes coming back, and guests' self-pause/self-delete wishes
(spec §12.4), which become the same pause or destroy an API call makes, with ``reason: "self"``."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, bindparam, not_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import raiseload

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox, SandboxDisk
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import REPORTED, SandboxStatus
from paddock_controlplane.resources import billing
from paddock_controlplane.sandboxes import destruction, suspension
from paddock_core.db import transaction
from paddock_core.heartbeat import SUMMARY_FULL, SUMMARY_OK, ids_digest
from paddock_core.logging import get_logger
from paddock_core.timeutil import as_utc

log = get_logger("paddock.host_reports")

REPORT_GRACE_S = 10.0
#: ``status_reason`` of sandboxes on a dead host; only these come back when their host does.
HOST_DEAD_REASON = "host stopped responding"


#: What a heartbeat's fold reads of each of its host's reported sandboxes: plain columns. Only the rows
#: it changes or acts on are then loaded whole (:func:`_writes`); loading every row of a dense host
#: through the ORM, on every beat, was most of the beat's cost.
_REPORTED_COLUMNS = (
    Sandbox.id,
    Sandbox.host_id,
    Sandbox.status,
    Sandbox.status_reason,
    Sandbox.oom_kills,
    Sandbox.created_at,
    Sandbox.running_at,
    Sandbox.paused_at,
    Sandbox.last_resumed_at,
    Sandbox.bandwidth_used_bytes,
    Sandbox.bandwidth_ingress_bytes,
    Sandbox.bandwidth_quota_bytes,
    Sandbox.egress,
    Sandbox.hibernated,
)
_ON_HOST = (Sandbox.host_id == bindparam("host_id"), Sandbox.status.in_(REPORTED))
_IS_HIBERNATED = and_(Sandbox.status == SandboxStatus.PAUSED, Sandbox.hibernated.is_(True))
_REPORTED_ROWS = select(*_REPORTED_COLUMNS).where(*_ON_HOST)
#: The same, but the hibernated sandboxes: for a beat that leaves them out (its summary says so).
_LIVE_ROWS = select(*_REPORTED_COLUMNS).where(*_ON_HOST, not_(_IS_HIBERNATED))
#: The ids of a host's hibernated sandboxes, to check a beat's summary of them against.
_HIBERNATED_IDS = select(Sandbox.id).where(Sandbox.host_id == bindparam("host_id"), _IS_HIBERNATED)
#: How long a host's digest found equal is trusted without reading its hibernated rows again. Within it
#: a change made here alone (a second control plane's, or a row errored with its host) waits for the
#: next check; the host's own changes (a sandbox hibernated, woken or lost) change its digest at once.
SUMMARY_TRUSTED_S = 30.0
_WRITTEN_ROWS = (
    select(Sandbox)
    .where(Sandbox.id.in_(bindparam("ids", expanding=True)), Sandbox.status.in_(REPORTED))
    .options(raiseload(Sandbox.memberships))  # which no report touches
)


class _Grace:
    """Whether a report may predate a sandbox's latest transition (within ``REPORT_GRACE_S`` of it).
    The grace's start is worked out once a beat, in both the forms a database hands back (SQLite's
    naive UTC, PostgreSQL's aware): converting each row's four times, twice a row, was a third of the
    fold of a 1,000-sandbox beat (issue #36)."""

    def __init__(self, now: dt.datetime) -> None:
        self.since = as_utc(now) - dt.timedelta(seconds=REPORT_GRACE_S)
        self.since_naive = self.since.replace(tzinfo=None)

    def holds(self, row: Any) -> bool:
        for changed_at in (row.created_at, row.running_at, row.paused_at, row.last_resumed_at):
            if changed_at is not None and changed_at > (
                self.since_naive if changed_at.tzinfo is None else self.since
            ):
                return True
        return False


def _writes(row: Any, report: dict[str, Any] | None, in_grace: bool) -> bool:
    """Whether folding ``report`` changes the row or acts on it (the rest only read it)."""
    if row.status == SandboxStatus.ERROR:
        return (
            row.status_reason == HOST_DEAD_REASON
            and report is not None
            and report.get("status") in (SandboxStatus.RUNNING, SandboxStatus.PAUSED)
        )
    if in_grace:
        return False
    if report is None or report.get("status") in ("stopped", "error"):
        return True
    if int(report.get("oom_kills") or 0) > (row.oom_kills or 0):
        return True
    if isinstance(report.get("self_request"), dict) and row.status == SandboxStatus.RUNNING:
        return True
    return "egress_bytes" in report and (
        int(report["egress_bytes"]) > int(row.bandwidth_used_bytes or 0)
        or int(report.get("ingress_bytes") or 0) > int(row.bandwidth_ingress_bytes or 0)
    )


async def apply_host_report(services: Services, beat: dict[str, Any]) -> str | None:
    """Fold a heartbeat's per-sandbox report into the rows: OOM kills, activity, vanished sandboxes;
    and note where the host's egress attempts stand, for the audit writer (``workers/audit_writer.py``).

    Returns the answer to the beat's summary of its hibernated sandboxes (``paddock_core/heartbeat.py``;
    None for an agent that sends none): a beat that leaves them out is folded over the other rows only,
    which is what lets one host hold thousands of them at no cost per beat."""
    host_id = str(beat["id"])
    services.audit.hear_egress(host_id, beat.get("egress_audit"))
    reports = {str(r.get("id")): r for r in beat.get("sandboxes", []) if r.get("id")}
    activity = services.activity.last_seen_s
    summary = beat.get("hibernated") if isinstance(beat.get("hibernated"), dict) else None
    listed = summary is None or bool(summary.get("listed", True))
    async with transaction(services.sessions) as session:
        # On the session's connection, as a plain Core statement: through the ORM each of 1,000 rows
        # also passed its loading machinery, for columns it would not track anyway.
        connection = await session.connection()
        statement = _REPORTED_ROWS if listed else _LIVE_ROWS
        rows = (await connection.execute(statement, {"host_id": host_id})).all()
        answer = None if summary is None else await _answer_summary(services, session, host_id, summary, rows)
        now = services.clock()
        grace = _Grace(now)
        in_grace = {row.id for row in rows if grace.holds(row)}
        written = [row.id for row in rows if _writes(row, reports.get(row.id), row.id in in_grace)]
        if written:
            loaded = (await session.scalars(_WRITTEN_ROWS, {"ids": written})).all()
            for sandbox in loaded:
                await _fold(services, session, sandbox, reports.get(sandbox.id), now, grace)
        writing = set(written)
        for row in rows:
            if row.id in writing or row.status == SandboxStatus.ERROR:
                continue
            report = reports.get(row.id)
            if report is not None and isinstance(report.get("disk_errors"), dict):  # whatever its state
                await _fold_disk_errors(session, row.id, report["disk_errors"])
            if report is None or row.id in in_grace:
                continue
            seen = report.get("last_activity_at")
            if seen:
                activity[row.id] = max(activity.get(row.id, 0.0), float(seen))
            if "egress_bytes" in report:
                _resync_egress(services, row.id, row.host_id, row.egress, row.bandwidth_quota_bytes, report)
    return answer


async def _answer_summary(
    services: Services, session: AsyncSession, host_id: str, summary: dict[str, Any], rows: Sequence[Any]
) -> str:
    """``ok`` when the host holds hibernated the sandboxes this database has hibernated on it, else
    ``full``: its next beat lists them, and that beat's fold finds one it lost (``error``) or revives
    those errored while the host was dead. A row errored with its host always asks for a full beat,
    since its revival needs its report."""
    digests = services.hibernated_digests
    if any(
        row.status == SandboxStatus.ERROR and row.hibernated and row.status_reason == HOST_DEAD_REASON
        for row in rows
    ):
        digests.pop(host_id, None)
        return SUMMARY_FULL
    digest = str(summary.get("digest") or "")
    trusted = digests.get(host_id)
    if trusted is not None and trusted[0] == digest and time.monotonic() - trusted[1] < SUMMARY_TRUSTED_S:
        return SUMMARY_OK
    if summary.get("listed", True):  # the rows read for the fold hold them already
        held = [row.id for row in rows if row.status == SandboxStatus.PAUSED and row.hibernated]
    else:
        held = list((await session.scalars(_HIBERNATED_IDS, {"host_id": host_id})).all())
    if ids_digest(held) != digest:
        digests.pop(host_id, None)
        return SUMMARY_FULL
    digests[host_id] = (digest, time.monotonic())
    return SUMMARY_OK


async def _fold(
    services: Services,
    session: AsyncSession,
    sandbox: Sandbox,
    report: dict[str, Any] | None,
    now: dt.datetime,
    grace: _Grace,
) -> None:
    """One row the report changes or acts on, loaded whole."""
    activity = services.activity.last_seen_s
    if sandbox.status == SandboxStatus.ERROR:
        _revive(sandbox, report, now)
        return
    if report is not None and isinstance(report.get("disk_errors"), dict):  # whatever its state
        await _fold_disk_errors(session, sandbox.id, report["disk_errors"])
    if grace.holds(sandbox):
        return
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
        return
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
    """Bandwidth counted by the host (assigned only when it grew: a row assigned at all is flushed and
    checked at commit), then the allowlist and budget checked (:func:`_resync_egress`)."""
    egress = int(report["egress_bytes"])
    if egress > int(sandbox.bandwidth_used_bytes or 0):
        sandbox.bandwidth_used_bytes = egress
    ingress = int(report.get("ingress_bytes") or 0)
    if ingress > int(sandbox.bandwidth_ingress_bytes or 0):
        sandbox.bandwidth_ingress_bytes = ingress
    _resync_egress(
        services, sandbox.id, sandbox.host_id, sandbox.egress, sandbox.bandwidth_quota_bytes, report
    )


def _resync_egress(
    services: Services,
    sandbox_id: str,
    host_id: str | None,
    egress: list[Any] | None,
    quota_bytes: int,
    report: dict[str, Any],
) -> None:
    """An allowlist or budget the host does not hold yet is pushed again (a PUT egress or recharge
    whose push failed, or that raced a boot)."""
    rules, quota = list(egress or []), int(quota_bytes)
    if report.get("egress") == rules and report.get("quota_bytes") == quota:
        return
    pushing = services.egress_pushing
    if sandbox_id in pushing:
        return
    pushing.add(sandbox_id)

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
