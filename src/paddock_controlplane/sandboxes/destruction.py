"""Destroying a sandbox (§11.8): the API's destroy, a guest's self-delete, and the reclaim that removes
it from its host — retried by the reconciler when a process died before the host answered."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.queries import get_owned
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import TERMINAL, SandboxStatus
from paddock_controlplane.records.views import event_data
from paddock_controlplane.resources import billing, disks, networks, webhooks
from paddock_controlplane.sandboxes.transition import settle
from paddock_core.db import transaction
from paddock_core.logging import get_logger

log = get_logger("paddock.destruction")

#: Nothing runs on the host in these, so the destroy is carried out before the answer.
DESTROY_INLINE = (SandboxStatus.PAUSED, SandboxStatus.ERROR)


def reason_data(reason: str, label: str | None) -> dict[str, str]:
    """``data.reason`` of a pause/destroy event, plus ``data.label`` for self-signals (spec 12.4)."""
    return {"reason": reason, **({"label": label} if label else {})}


async def destroy(
    services: Services, user_id: str, sandbox_id: str, *, reason: str = "api", label: str | None = None
) -> dict[str, str]:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        status = sandbox.status
        if status in TERMINAL:
            return {"id": sandbox.id, "status": SandboxStatus.DESTROYED}
        if status == SandboxStatus.DESTROYING:
            return {"id": sandbox.id, "status": SandboxStatus.DESTROYING}
        if status == SandboxStatus.RUNNING:
            await billing.settle(session, sandbox, services.clock())
        sandbox.status = SandboxStatus.DESTROYING
    if status in DESTROY_INLINE:
        await reclaim(services, sandbox_id, reason=reason, label=label)
        return {"id": sandbox_id, "status": SandboxStatus.DESTROYED}
    spawn_reclaim(services, sandbox_id, reason=reason, label=label)
    return {"id": sandbox_id, "status": SandboxStatus.DESTROYING}


async def forget_on_host(services: Services, host_id: str, sandbox_id: str) -> None:
    """Destroy on its host a sandbox the control plane has already given up on (a failed or orphaned
    boot). Best effort: nothing retries it, so a host that cannot be reached keeps the sandbox until an
    operator removes it; the warning names it."""
    try:
        link = await hostlink.for_host(services, host_id)
        await link.destroy(sandbox_id)
    except Exception as exc:
        log.warning("cleanup_failed", sandbox_id=sandbox_id, error=str(exc))


def destroy_later(services: Services, sandbox: Sandbox, *, reason: str, label: str | None) -> None:
    """Destroy in the background as the API would (a guest asked to delete its own sandbox)."""

    async def run() -> None:
        try:
            await destroy(services, sandbox.user_id, sandbox.id, reason=reason, label=label)
            log.info("sandbox_self_destroyed", sandbox_id=sandbox.id)
        except Exception as exc:
            log.warning("self_destroy_failed", sandbox_id=sandbox.id, error=str(exc))

    services.tasks.spawn(run(), name=f"{reason} destroy {sandbox.id}")


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
    if sandbox is None or sandbox.status != SandboxStatus.DESTROYING:
        return
    host_id = sandbox.host_id

    async def remove_from_host() -> None:
        await (await hostlink.for_host(services, host_id)).destroy(sandbox_id)

    async def destroyed(session: AsyncSession, row: Sandbox, _: None) -> None:
        row.status = SandboxStatus.DESTROYED
        row.destroyed_at = services.clock()
        await networks.drop_memberships(session, sandbox_id)
        await disks.drop_attachments(session, sandbox_id)
        await webhooks.emit(
            session,
            user_id=row.user_id,
            action="sandbox.destroy",
            data=event_data(row, **reason_data(reason, label)),
        )

    # No on_failure: a host that failed leaves the row destroying, and the reconciler retries.
    outcome = await settle(
        services, sandbox_id, remove_from_host, expect=(SandboxStatus.DESTROYING,), on_success=destroyed
    )
    if outcome.error is not None:
        log.warning("reclaim_failed", sandbox_id=sandbox_id, error=str(outcome.error))


async def settle_stuck(session: AsyncSession, services: Services) -> None:
    """Reconciler pass: retry reclaiming ``destroying`` rows left by a process that died."""
    stuck = (
        await session.scalars(select(Sandbox.id).where(Sandbox.status == SandboxStatus.DESTROYING))
    ).all()
    for sandbox_id in stuck:
        spawn_reclaim(services, sandbox_id)
