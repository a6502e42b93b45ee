"""Destroying a sandbox (§11.8): the API's destroy, a guest's self-delete, and the reclaim that removes
it from its host — retried by the reconciler when a process died before the host answered."""

from __future__ import annotations

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import TERMINAL, SandboxStatus
from paddock_controlplane.records.views import event_data
from paddock_controlplane.resources import billing, disks, networks, webhooks
from paddock_controlplane.sandboxes.transition import changing, locked_row, settle, write_back
from paddock_core import errors
from paddock_core.logging import get_logger

log = get_logger("paddock.destruction")

#: Nothing runs on the host in these, so the destroy is carried out before the answer.
DESTROY_INLINE = (SandboxStatus.PAUSED, SandboxStatus.ERROR)

#: What a reclaim not handed its host reads first: whether the row is still ``destroying``, and where.
_STATUS_AND_HOST = select(Sandbox.status, Sandbox.host_id).where(Sandbox.id == bindparam("sandbox_id"))


def reason_data(reason: str, label: str | None) -> dict[str, str]:
    """``data.reason`` of a pause/destroy event, plus ``data.label`` for self-signals (spec 12.4)."""
    return {"reason": reason, **({"label": label} if label else {})}


async def destroy(
    services: Services, user_id: str, sandbox_id: str, *, reason: str = "api", label: str | None = None
) -> dict[str, str]:
    # Plain statements, as a pause's (``transition``): every create that ends is destroyed once, and
    # the ORM's load of the row with its memberships, and its flush, were most of the destroy's cost.
    async with changing(services, sandbox_id) as session:
        sandbox = await locked_row(session, sandbox_id)
        if sandbox is None or sandbox.user_id != user_id:
            raise errors.NotFound("sandbox not found")
        status = sandbox.status
        if status in TERMINAL:
            return {"id": sandbox.id, "status": SandboxStatus.DESTROYED}
        if status == SandboxStatus.DESTROYING:
            return {"id": sandbox.id, "status": SandboxStatus.DESTROYING}
        if status == SandboxStatus.RUNNING:
            await billing.settle(session, sandbox, services.clock())
        sandbox.status = SandboxStatus.DESTROYING
        await write_back(session, sandbox)
    if status in DESTROY_INLINE:
        await reclaim(services, sandbox_id, reason=reason, label=label, host_id=sandbox.host_id)
        return {"id": sandbox_id, "status": SandboxStatus.DESTROYED}
    spawn_reclaim(services, sandbox_id, reason=reason, label=label, host_id=sandbox.host_id)
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
    services: Services,
    sandbox_id: str,
    *,
    reason: str = "api",
    label: str | None = None,
    host_id: str | None = None,
) -> None:
    """Reclaim in the background, at most once at a time per sandbox in this process (``host_id``: as
    :func:`reclaim`'s)."""
    inflight = services.reclaiming
    if sandbox_id in inflight:
        return
    inflight.add(sandbox_id)

    async def run() -> None:
        try:
            await reclaim(services, sandbox_id, reason=reason, label=label, host_id=host_id)
        finally:
            inflight.discard(sandbox_id)

    services.tasks.spawn(run(), name=f"reclaim {sandbox_id}")


async def reclaim(
    services: Services,
    sandbox_id: str,
    *,
    reason: str = "api",
    label: str | None = None,
    host_id: str | None = None,
) -> None:
    """Remove a ``destroying`` sandbox from its host and mark it ``destroyed`` (emitting once).

    ``host_id``: the sandbox's host, from the destroy that just committed ``destroying``; None (the
    reconciler's retry) reads it here. A reclaim that lost a race to another only asks the host again
    (destroying what the host no longer has succeeds), and the outcome is recorded once."""
    if host_id is None:
        async with services.sessions() as session:
            found = (await session.execute(_STATUS_AND_HOST, {"sandbox_id": sandbox_id})).first()
        if found is None or found.status != SandboxStatus.DESTROYING:
            return
        host_id = found.host_id  # none: ``for_host`` fails, and the row stays for the reconciler

    async def remove_from_host() -> None:
        await (await hostlink.for_host(services, host_id)).destroy(sandbox_id)

    async def destroyed(session: AsyncSession, row: Sandbox, _: None) -> None:
        row.status = SandboxStatus.DESTROYED
        row.destroyed_at = services.clock()
        if row.memberships:  # read with the locked row; none joins a sandbox that is not running
            await networks.drop_memberships(session, sandbox_id)
        await disks.drop_attachments(session, sandbox_id)
        await webhooks.emit(
            session,
            user_id=row.user_id,
            action="sandbox.destroy",
            data=event_data(row, **reason_data(reason, label)),
        )

    # No on_failure: a host that failed leaves the row destroying, and the reconciler retries. The
    # outcome changes the row's own columns; the memberships and attachments go by statements of
    # their own, so the row is read and written plainly.
    outcome = await settle(
        services,
        sandbox_id,
        remove_from_host,
        expect=(SandboxStatus.DESTROYING,),
        on_success=destroyed,
        plain=True,
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
