"""Destroy, pause and resume (§11.8), and the settling of interrupted transitions."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane import accounts, billing, hostlink, networks, scheduler, webhooks
from paddock_controlplane.lifecycle import check_quotas, event_data, get_owned, require_credit
from paddock_controlplane.models import Sandbox
from paddock_controlplane.services import Services
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.logging import get_logger

log = get_logger("paddock.power")

DESTROY_INLINE = ("paused", "error")
DESTROY_NOOP = ("destroyed", "failed")
CANCELLABLE = ("creating", "pausing", "resuming", "forking")


async def destroy(
    services: Services, user_id: str, sandbox_id: str, *, reason: str = "api", label: str | None = None
) -> dict[str, str]:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        status = sandbox.status
        if status in DESTROY_NOOP:
            return {"id": sandbox.id, "status": "destroyed"}
        if status == "destroying":
            return {"id": sandbox.id, "status": "destroying"}
        if status == "running":
            await billing.settle(session, sandbox, services.clock())
        sandbox.status = "destroying"
    if status in DESTROY_INLINE:
        await reclaim(services, sandbox_id, reason=reason, label=label)
        return {"id": sandbox_id, "status": "destroyed"}
    spawn_reclaim(services, sandbox_id, reason=reason, label=label)
    return {"id": sandbox_id, "status": "destroying"}


def _reason_data(reason: str, label: str | None) -> dict[str, str]:
    """``data.reason`` of a pause/destroy event, plus ``data.label`` for self-signals (spec 12.4)."""
    return {"reason": reason, **({"label": label} if label else {})}


def spawn_reclaim(
    services: Services, sandbox_id: str, *, reason: str = "api", label: str | None = None
) -> None:
    """Reclaim in the background, at most once at a time per sandbox in this process."""
    inflight = services.reclaiming
    if sandbox_id in inflight:
        return
    inflight.add(sandbox_id)

    async def run() -> None:
        try:
            await reclaim(services, sandbox_id, reason=reason, label=label)
        finally:
            inflight.discard(sandbox_id)

    services.tasks.spawn(run(), name=f"reclaim {sandbox_id}")


async def reclaim(
    services: Services, sandbox_id: str, *, reason: str = "api", label: str | None = None
) -> None:
    """Remove a ``destroying`` sandbox from its host and mark it ``destroyed`` (emitting once)."""
    async with services.sessions() as session:
        sandbox = await session.get(Sandbox, sandbox_id)
    if sandbox is None or sandbox.status != "destroying":
        return
    try:
        link = await hostlink.for_host(services, sandbox.host_id)
        await link.destroy(sandbox_id)
    except hostlink.HostError as exc:
        log.warning("reclaim_failed", sandbox_id=sandbox_id, error=str(exc))
        return  # stays destroying; the reconciler retries
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox_id, with_for_update=True)
        if row is None or row.status != "destroying":
            return
        row.status = "destroyed"
        row.destroyed_at = services.clock()
        await networks.drop_memberships(session, sandbox_id)
        await webhooks.emit(
            session,
            user_id=row.user_id,
            action="sandbox.destroy",
            data=event_data(row, **_reason_data(reason, label)),
        )


async def pause(
    services: Services, user_id: str, sandbox_id: str, *, reason: str = "api", label: str | None = None
) -> Sandbox:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if sandbox.status != "running":
            raise errors.InvalidState(f"sandbox is {sandbox.status}; only a running sandbox can be paused")
        sandbox.status = "pausing"
        host_id = sandbox.host_id
    return await _finish_pause(services, sandbox_id, host_id, reason, label)


async def _finish_pause(
    services: Services, sandbox_id: str, host_id: str | None, reason: str, label: str | None = None
) -> Sandbox:
    try:
        await (await hostlink.for_host(services, host_id)).pause(sandbox_id)
        ok = True
    except hostlink.HostError as exc:
        log.warning("pause_failed", sandbox_id=sandbox_id, error=str(exc))
        ok = False
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox_id, with_for_update=True)
        assert row is not None
        if row.status != "pausing":
            return row
        now = services.clock()
        await billing.settle(session, row, now)
        if ok:
            row.status, row.paused_at = "paused", now
            await webhooks.emit(
                session,
                user_id=row.user_id,
                action="sandbox.pause",
                data=event_data(row, **_reason_data(reason, label)),
            )
        else:
            row.status, row.status_reason = "error", "pause failed on the host"
    return row


async def resume(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if sandbox.status != "paused":
            raise errors.InvalidState(f"sandbox is {sandbox.status}; only a paused sandbox can be resumed")
        require_credit(account)
        plan = await accounts.cached_plan(session, account.plan_id)
        await check_quotas(session, services, plan, user_id, needs_slot=True, new_sandbox=False)
        sandbox.status = "resuming"
    try:
        link = await hostlink.for_host(services, sandbox.host_id)
        await link.resume(sandbox_id, disk_mib=sandbox.disk_mib)
        ok = True
    except hostlink.CapacityError as exc:
        await _still_paused(services, sandbox_id)
        raise scheduler.no_capacity(f"host {sandbox.host_id}: {exc}") from None
    except hostlink.HostError as exc:
        log.warning("resume_failed", sandbox_id=sandbox_id, error=str(exc))
        ok = False
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox_id, with_for_update=True)
        assert row is not None
        if row.status != "resuming":
            return row
        now = services.clock()
        if ok:
            row.status, row.running_at, row.last_resumed_at = "running", now, now
            row.billed_until, row.last_activity_at = now, now
            await webhooks.emit(session, user_id=row.user_id, action="sandbox.resume", data=event_data(row))
        else:
            row.status, row.status_reason = "error", "resume failed on the host"
    if row.status == "running":  # the first exec needs no database read
        services.running.put(row.id, row)
    return row


async def _still_paused(services: Services, sandbox_id: str) -> None:
    """The host had no room to resume: the sandbox stays as it was (paused, intact on its host), so the
    503 changes nothing, as the contract asks of a 503; the client may try again later."""
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox_id, with_for_update=True)
        if row is not None and row.status == "resuming":
            row.status = "paused"
    log.info("resume_refused_for_capacity", sandbox_id=sandbox_id)


async def settle_stuck(session: AsyncSession, services: Services) -> None:
    """Reconciler pass: retry reclaiming ``destroying`` rows left by a process that died."""
    stuck = (await session.scalars(select(Sandbox.id).where(Sandbox.status == "destroying"))).all()
    for sandbox_id in stuck:
        spawn_reclaim(services, sandbox_id)
