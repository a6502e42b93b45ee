"""Pausing and resuming a sandbox (§11.8): by the API, and on the control plane's own initiative (idle,
out of credit, or a guest's self-pause)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, scheduler
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.records.views import event_data
from paddock_controlplane.resources import accounts, billing, webhooks
from paddock_controlplane.sandboxes.destruction import reason_data
from paddock_controlplane.sandboxes.transition import changing, claim, owned, require_status, settle
from paddock_core import errors
from paddock_core.logging import get_logger

log = get_logger("paddock.suspension")


async def pause(
    services: Services, user_id: str, sandbox_id: str, *, reason: str = "api", label: str | None = None
) -> Sandbox:
    async with changing(services, sandbox_id) as session:
        claimed = await claim(
            session,
            user_id,
            sandbox_id,
            expect=SandboxStatus.RUNNING,
            to=SandboxStatus.PAUSING,
            verb="paused",
        )
    host_id = claimed.host_id

    async def pause_on_host() -> None:
        await (await hostlink.for_host(services, host_id)).pause(sandbox_id)

    async def paused(session: AsyncSession, row: Sandbox, _: None) -> None:
        now = services.clock()
        await billing.settle(session, row, now)
        row.status, row.paused_at = SandboxStatus.PAUSED, now
        await webhooks.emit(
            session,
            user_id=row.user_id,
            action="sandbox.pause",
            data=event_data(row, **reason_data(reason, label)),
        )

    async def failed(session: AsyncSession, row: Sandbox, exc: Exception) -> None:
        log.warning("pause_failed", sandbox_id=sandbox_id, error=str(exc))
        await billing.settle(session, row, services.clock())
        row.status, row.status_reason = SandboxStatus.ERROR, "pause failed on the host"

    outcome = await settle(
        services,
        sandbox_id,
        pause_on_host,
        expect=(SandboxStatus.PAUSING,),
        on_success=paused,
        on_failure=failed,
        plain=True,
    )
    assert outcome.row is not None  # a row is deleted only while ``creating``
    return outcome.row


def pause_later(services: Services, sandbox: Sandbox, reason: str, *, label: str | None = None) -> None:
    """Pause in the background (idle, out of credit, self-pause), at most once at a time per sandbox."""
    pausing = services.auto_pausing
    if sandbox.id in pausing:
        return
    pausing.add(sandbox.id)

    async def run() -> None:
        try:
            await pause(services, sandbox.user_id, sandbox.id, reason=reason, label=label)
            log.info("sandbox_auto_paused", sandbox_id=sandbox.id, reason=reason)
        except errors.InvalidState:
            pass  # paused or destroyed meanwhile: nothing left to do
        except Exception as exc:
            log.warning("auto_pause_failed", sandbox_id=sandbox.id, error=str(exc))
        finally:
            pausing.discard(sandbox.id)

    services.tasks.spawn(run(), name=f"{reason} pause {sandbox.id}")


async def resume(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    async with changing(services, sandbox_id) as session:
        account = await accounts.lock_user(session, user_id)
        require_status(await owned(session, user_id, sandbox_id), SandboxStatus.PAUSED, "resumed")
        accounts.require_credit(account)
        plan = await accounts.cached_plan(session, account.plan_id)
        await accounts.check_quotas(
            session, plan, user_id, now=services.clock(), needs_slot=True, new_sandbox=False
        )
        claimed = await claim(
            session,
            user_id,
            sandbox_id,
            expect=SandboxStatus.PAUSED,
            to=SandboxStatus.RESUMING,
            verb="resumed",
        )
    host_id, disk_mib = claimed.host_id, claimed.disk_mib

    async def resume_on_host() -> None:
        await (await hostlink.for_host(services, host_id)).resume(sandbox_id, disk_mib=disk_mib)

    async def running(session: AsyncSession, row: Sandbox, _: None) -> None:
        now = services.clock()
        row.status, row.running_at, row.last_resumed_at = SandboxStatus.RUNNING, now, now
        row.billed_until, row.last_activity_at = now, now
        await webhooks.emit(session, user_id=row.user_id, action="sandbox.resume", data=event_data(row))

    async def failed(session: AsyncSession, row: Sandbox, exc: Exception) -> None:
        if isinstance(exc, hostlink.CapacityError):
            # The host had no room: the sandbox stays as it was (paused, intact on its host), so the
            # 503 changes nothing, as the contract asks of a 503; the client may try again later.
            row.status = SandboxStatus.PAUSED
            log.info("resume_refused_for_capacity", sandbox_id=sandbox_id)
            return
        log.warning("resume_failed", sandbox_id=sandbox_id, error=str(exc))
        row.status, row.status_reason = SandboxStatus.ERROR, "resume failed on the host"

    outcome = await settle(
        services,
        sandbox_id,
        resume_on_host,
        expect=(SandboxStatus.RESUMING,),
        on_success=running,
        on_failure=failed,
        plain=True,
    )
    if isinstance(outcome.error, hostlink.CapacityError):
        raise scheduler.no_capacity(f"host {host_id}: {outcome.error}") from None
    row = outcome.row
    assert row is not None  # a row is deleted only while ``creating``
    if row.status == SandboxStatus.RUNNING:  # the first exec needs no database read
        services.running.put(row.id, row)
    return row
