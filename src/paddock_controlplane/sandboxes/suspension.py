"""Pausing and resuming a sandbox (§11.8): by the API, and on the control plane's own initiative (idle,
out of credit, or a guest's self-pause).

A pause freezes the sandbox (its memory and slot held). A pause with ``keep_memory: false`` hibernates
it (issue #34, docs/hibernation.md): its host stops it and keeps only its disk (a VM its memory too);
it stays ``paused`` with ``hibernated`` set, and its resume boots that disk again (a container's
processes restart and its address may change; a VM's processes go on)."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, hosts, scheduler
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.records.views import event_data
from paddock_controlplane.resources import accounts, billing, webhooks
from paddock_controlplane.sandboxes.destruction import reason_data
from paddock_controlplane.sandboxes.transition import changing, claim, owned, require_status, settle
from paddock_core import errors
from paddock_core.logging import get_logger

log = get_logger("paddock.suspension")

HIBERNATE = "hibernating a sandbox"
_HIBERNATED = select(Sandbox.hibernated).where(Sandbox.id == bindparam("sandbox_id"))


async def pause(
    services: Services,
    user_id: str,
    sandbox_id: str,
    *,
    reason: str = "api",
    label: str | None = None,
    keep_memory: bool = True,
    hibernate_after_seconds: int | None = None,
) -> Sandbox:
    """Freezes the sandbox; with ``keep_memory=False`` hibernates it instead. ``hibernate_after_seconds``
    (a frozen pause only) asks the reconciler to hibernate it once it has stayed paused that long."""
    if not keep_memory:
        return await hibernate(services, user_id, sandbox_id, reason=reason, label=label)
    if hibernate_after_seconds is not None:
        async with changing(services, sandbox_id) as session:
            await _require_hibernating_tier(session, (await owned(session, user_id, sandbox_id)).host_id)
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
        if hibernate_after_seconds is not None:
            row.auto_hibernate_after_seconds = hibernate_after_seconds
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


class Target(NamedTuple):
    """The sandbox a background pause or hibernation is for: what it needs of the row. A ``Sandbox``
    has both fields too; a pass that reads plain columns (``reconciler.idle_pass``) passes this."""

    id: str
    user_id: str


def pause_later(
    services: Services, sandbox: Target | Sandbox, reason: str, *, label: str | None = None
) -> None:
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


def _tier_refusal(host: Host | None, suffix: str) -> str | None:
    # The VM tier (qemu) hibernates too, keeping the VM's memory and its volumes' drives
    # (docs/hibernation.md); a VM an older agent booted with a volume is refused by its host (a 409).
    return hosts.container_tier_refusal(host, HIBERNATE, suffix, also=("runsc", "qemu"))


async def _require_hibernating_tier(session: AsyncSession, host_id: str | None) -> None:
    host = await session.get(Host, host_id) if host_id else None
    refusal = _tier_refusal(
        host, "; the container (crun, runc), gVisor and VM tiers hibernate: pause without keep_memory: false"
    )
    if refusal is not None:
        raise hostlink.TierRefusedError(refusal)


def require_hibernating_host(host: Host | None, field: str) -> None:
    """A create, fork, timeout or PATCH asking ``field: hibernate`` of a sandbox on ``host``: a 409 naming
    the field where its tier does not hibernate (the VM tier), rather than a lifetime or an idle pause
    that would not do what it says. Where a hibernation is refused only when it happens (a gVisor
    sandbox that has since mounted an S3 disk), :func:`hibernate_later` freezes it instead."""
    refusal = _tier_refusal(host, f"; ask {field}: pause (a frozen pause) on this host")
    if refusal is not None:
        raise hostlink.TierRefusedError(f"{field}: {refusal}", fields={field: refusal})


async def hibernate(
    services: Services,
    user_id: str,
    sandbox_id: str,
    *,
    reason: str = "api",
    label: str | None = None,
    expect: SandboxStatus = SandboxStatus.RUNNING,
) -> Sandbox:
    """Hibernates a running sandbox (``expect``: a frozen one, for the reconciler's auto-hibernate).

    The host commits a hibernation in one step (docs/hibernation.md): a host that answers an error left
    the sandbox as it was, and the row goes back to ``expect``; a host that did not answer (its agent
    died) may have done it or not, so the row stays ``pausing`` for the reconciler, which asks the host
    what it holds (``OrphanedTransitions``)."""
    async with changing(services, sandbox_id) as session:
        await _require_hibernating_tier(session, (await owned(session, user_id, sandbox_id)).host_id)
        claimed = await claim(
            session, user_id, sandbox_id, expect=expect, to=SandboxStatus.PAUSING, verb="paused"
        )
    host_id = claimed.host_id

    async def hibernate_on_host() -> None:
        await (await hostlink.for_host(services, host_id)).hibernate(sandbox_id)

    async def hibernated(session: AsyncSession, row: Sandbox, _: None) -> None:
        now = services.clock()
        if expect == SandboxStatus.RUNNING:
            await billing.settle(session, row, now)
            row.paused_at = now
        row.status, row.hibernated, row.auto_hibernate_after_seconds = SandboxStatus.PAUSED, True, None
        data = event_data(row, hibernated=True, **reason_data(reason, label))
        await webhooks.emit(session, user_id=row.user_id, action="sandbox.pause", data=data)

    async def failed(session: AsyncSession, row: Sandbox, exc: Exception) -> None:
        log.warning("hibernate_failed", sandbox_id=sandbox_id, error=str(exc))
        if not isinstance(exc, hostlink.HostLostError):
            row.status = expect

    outcome = await settle(
        services,
        sandbox_id,
        hibernate_on_host,
        expect=(SandboxStatus.PAUSING,),
        on_success=hibernated,
        on_failure=failed,
        failures=(hostlink.HostError, hostlink.SandboxGoneError, errors.PaddockError),
        plain=True,
    )
    error = outcome.error
    if isinstance(error, errors.PaddockError):
        raise error
    if isinstance(error, hostlink.SandboxGoneError):
        raise errors.InvalidState("sandbox is no longer on its host") from None
    if isinstance(error, hostlink.HostError) and not isinstance(error, hostlink.HostLostError):
        raise errors.ServerError(f"hibernate failed on the host: {error}") from None
    assert outcome.row is not None  # a row is deleted only while ``creating``
    return outcome.row


def hibernate_later(
    services: Services,
    sandbox: Target | Sandbox,
    *,
    reason: str = "idle",
    expect: SandboxStatus = SandboxStatus.PAUSED,
) -> None:
    """Hibernates a sandbox in the background: a frozen one whose ``auto_hibernate_after_seconds``
    passed (``expect`` paused), or a running one whose ``on_timeout`` or ``on_idle`` is ``hibernate``
    (``expect`` running; ``reason`` timeout or idle). A running sandbox whose host turns the hibernation
    down (its tier, or a gVisor sandbox with S3 disks: a 409 that changed nothing) is frozen instead,
    so that the timeout or the idle pause still stops it."""
    pausing = services.auto_pausing
    if sandbox.id in pausing:
        return
    pausing.add(sandbox.id)

    async def run() -> None:
        try:
            try:
                await hibernate(services, sandbox.user_id, sandbox.id, reason=reason, expect=expect)
                log.info("sandbox_auto_hibernated", sandbox_id=sandbox.id, reason=reason)
            except errors.InvalidState as refused:
                if expect != SandboxStatus.RUNNING:
                    raise
                # Refused by its tier, or no longer running: a frozen pause is the fallback of the
                # first, and is refused itself (InvalidState) in the second.
                await pause(services, sandbox.user_id, sandbox.id, reason=reason)
                log.info("sandbox_paused_not_hibernated", sandbox_id=sandbox.id, why=str(refused))
        except errors.InvalidState:
            pass  # resumed or destroyed meanwhile, or a tier that does not hibernate
        except Exception as exc:
            log.warning("auto_hibernate_failed", sandbox_id=sandbox.id, error=str(exc))
        finally:
            pausing.discard(sandbox.id)

    services.tasks.spawn(run(), name=f"{reason} hibernate {sandbox.id}")


async def resume(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    async with changing(services, sandbox_id) as session:
        account = await accounts.lock_user(session, user_id)
        require_status(await owned(session, user_id, sandbox_id), SandboxStatus.PAUSED, "resumed")
        accounts.require_credit(account)
        plan = await accounts.cached_plan(session, account.plan_id)
        await accounts.check_slot(session, plan, user_id)
        claimed = await claim(
            session,
            user_id,
            sandbox_id,
            expect=SandboxStatus.PAUSED,
            to=SandboxStatus.RESUMING,
            verb="resumed",
        )
        hibernated = bool(await session.scalar(_HIBERNATED, {"sandbox_id": sandbox_id}))
    host_id, disk_mib = claimed.host_id, claimed.disk_mib

    async def resume_on_host() -> hostlink.Booted | None:
        link = await hostlink.for_host(services, host_id)
        if hibernated:  # its disk boots again: processes restart, the address may be new
            return await link.wake(sandbox_id)
        await link.resume(sandbox_id, disk_mib=disk_mib)
        return None

    async def running(session: AsyncSession, row: Sandbox, woken: hostlink.Booted | None) -> None:
        now = services.clock()
        row.status, row.running_at, row.last_resumed_at = SandboxStatus.RUNNING, now, now
        row.billed_until, row.last_activity_at = now, now
        if row.auto_hibernate_after_seconds is not None:
            row.auto_hibernate_after_seconds = None
        extra = {}
        if woken is not None:
            row.ip, row.hibernated = woken.ip, False
            extra["hibernated"] = True  # it was: its processes started afresh
        data = event_data(row, **extra)
        await webhooks.emit(session, user_id=row.user_id, action="sandbox.resume", data=data)

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
