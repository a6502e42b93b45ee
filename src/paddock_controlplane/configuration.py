"""Sandbox settings that change without a restart: PATCH, resize, SSH keys, egress, bandwidth (§11.7)."""

from __future__ import annotations

from typing import Any

from paddock_controlplane import accounts, hostlink, validation, webhooks
from paddock_controlplane.lifecycle import check_credit, check_list, event_data, get_owned, validate_egress
from paddock_controlplane.models import Sandbox
from paddock_controlplane.schemas import MAX_BANDWIDTH_QUOTA_BYTES, PatchSandboxRequest
from paddock_controlplane.services import Services
from paddock_controlplane.views import bandwidth_view
from paddock_core import errors
from paddock_core.db import transaction

CLOSED = ("destroying", "destroyed", "failed")
TERMINAL = ("destroyed", "failed")
#: Statuses in which the sandbox exists on its host, so egress and budget changes are pushed there.
ON_HOST = ("running", "paused", "pausing", "resuming")


def _require_open(sandbox: Sandbox, states: tuple[str, ...] = CLOSED) -> None:
    if sandbox.status in states:
        raise errors.InvalidState(f"sandbox is {sandbox.status}")


async def patch(services: Services, user_id: str, sandbox_id: str, req: PatchSandboxRequest) -> Sandbox:
    if req.auto_pause_after_seconds is not None and req.disable_auto_pause:
        raise errors.ValidationFailed.field(
            "auto_pause_after_seconds", "cannot be combined with disable_auto_pause: true"
        )
    auto_pause = None
    if req.auto_pause_after_seconds is not None:
        low, high = validation.AUTO_PAUSE_RANGE
        if not low <= req.auto_pause_after_seconds <= high:
            raise errors.ValidationFailed.field(
                "auto_pause_after_seconds", f"must be between {low} and {high}"
            )
        auto_pause = req.auto_pause_after_seconds
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        _require_open(sandbox)
        changed: dict[str, Any] = {}
        if req.ingress_enabled is not None and req.ingress_enabled != sandbox.ingress_enabled:
            sandbox.ingress_enabled = changed["ingress_enabled"] = req.ingress_enabled
        if auto_pause is not None:
            sandbox.auto_pause_after_seconds = changed["auto_pause_after_seconds"] = auto_pause
            sandbox.last_activity_at = services.clock()
        if req.disable_auto_pause and sandbox.auto_pause_after_seconds is not None:
            sandbox.auto_pause_after_seconds = None
            changed["auto_pause_after_seconds"] = None
        if changed:
            await webhooks.emit(
                session, user_id=user_id, action="sandbox.patch", data=event_data(sandbox, **changed)
            )
    return sandbox


async def resize(services: Services, user_id: str, sandbox_id: str, disk_mib: int) -> dict[str, Any]:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if disk_mib <= sandbox.disk_mib:
            raise errors.ValidationFailed.field(
                "disk_mib", f"must be larger than the current size ({sandbox.disk_mib} MiB); disks only grow"
            )
        plan = await accounts.get_plan(session, (await accounts.require_user(session, user_id)).plan_id)
        if disk_mib > plan.max_disk_mib:
            raise errors.PlanLimit(
                f"disk_mib {disk_mib} exceeds the {plan.name} plan's max disk {plan.max_disk_mib}"
            )
        if sandbox.status not in ("running", "paused"):
            raise errors.InvalidState(f"sandbox is {sandbox.status}; resize needs running or paused")
        status = sandbox.status
    if status == "running":
        try:
            await (await hostlink.for_host(services, sandbox.host_id)).resize(sandbox_id, disk_mib)
        except hostlink.HostError as exc:
            raise errors.ServerError(f"resize failed on the host: {exc}") from None
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        sandbox.disk_mib = max(sandbox.disk_mib, disk_mib)
        await webhooks.emit(session, user_id=user_id, action="sandbox.resize", data=event_data(sandbox))
    return {"id": sandbox_id, "disk_mib": disk_mib}


async def add_ssh_keys(
    services: Services, user_id: str, sandbox_id: str, keys: list[str] | None
) -> dict[str, int]:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if not keys:
            raise errors.ValidationFailed.field("keys", "at least one key is required")
        added = check_list("keys", keys, validation.ssh_pubkey)
        _require_open(sandbox, TERMINAL)
        merged = list(dict.fromkeys([*(sandbox.ssh_pubkeys or []), *added]))
        sandbox.ssh_pubkeys = merged
        await webhooks.emit(
            session,
            user_id=user_id,
            action="sandbox.ssh_pubkey.update",
            data=event_data(sandbox, count=len(merged)),
        )
    return {"count": len(merged)}


async def get_egress(services: Services, user_id: str, sandbox_id: str) -> dict[str, Any]:
    async with services.sessions() as session:
        sandbox = await get_owned(session, user_id, sandbox_id)
    return {"id": sandbox.id, "egress": list(sandbox.egress or [])}


async def set_egress(
    services: Services, user_id: str, sandbox_id: str, rules: list[str] | None
) -> dict[str, Any]:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        normalised = validate_egress(rules)
        _require_open(sandbox, TERMINAL)
        sandbox.egress = normalised
        await webhooks.emit(
            session, user_id=user_id, action="sandbox.egress.set", data=event_data(sandbox, egress=normalised)
        )
        status, host_id = sandbox.status, sandbox.host_id
    if status in ON_HOST:
        # A sandbox still booting gets the list when its boot is recorded (lifecycle.boot).
        try:
            await (await hostlink.for_host(services, host_id)).set_egress(sandbox_id, normalised)
        except hostlink.SandboxGoneError:
            pass  # the reconciler settles a sandbox that vanished from its host
        except hostlink.HostError as exc:
            raise errors.Unavailable(
                f"the egress list is saved but its host did not apply it ({exc}); repeat the PUT"
            ) from None
    return {"id": sandbox_id, "egress": normalised}


async def get_bandwidth(services: Services, user_id: str, sandbox_id: str) -> dict[str, Any]:
    """Counted by the host's kernel right now when it can be asked; the last heartbeat's numbers if not."""
    async with services.sessions() as session:
        sandbox = await get_owned(session, user_id, sandbox_id)
    if sandbox.status not in ON_HOST:
        return bandwidth_view(sandbox)
    try:
        usage = await (await hostlink.for_host(services, sandbox.host_id)).bandwidth(sandbox_id)
    except (hostlink.HostError, hostlink.SandboxGoneError):
        return bandwidth_view(sandbox)
    return await _record_usage(services, sandbox_id, usage)


async def _record_usage(services: Services, sandbox_id: str, usage: hostlink.Usage) -> dict[str, Any]:
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox_id, with_for_update=True)
        assert row is not None
        if usage.egress_bytes > int(row.bandwidth_used_bytes or 0):
            row.bandwidth_used_bytes = usage.egress_bytes
        if usage.ingress_bytes > int(row.bandwidth_ingress_bytes or 0):
            row.bandwidth_ingress_bytes = usage.ingress_bytes
        return bandwidth_view(row, capped=usage.capped)


async def recharge(services: Services, user_id: str, sandbox_id: str, add_bytes: int) -> dict[str, Any]:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if add_bytes <= 0:
            raise errors.ValidationFailed.field("add_bytes", "must be an integer greater than 0")
        await check_credit(session, user_id)
        _require_open(sandbox, TERMINAL)
        if sandbox.bandwidth_quota_bytes < 0:
            return bandwidth_view(sandbox)  # unmetered: nothing to add
        quota = int(sandbox.bandwidth_quota_bytes) + add_bytes
        if quota > MAX_BANDWIDTH_QUOTA_BYTES:  # the budget is a signed 64-bit column
            raise errors.ValidationFailed.field(
                "add_bytes", f"would take the budget over {MAX_BANDWIDTH_QUOTA_BYTES} bytes"
            )
        sandbox.bandwidth_quota_bytes = quota
        await webhooks.emit(
            session,
            user_id=user_id,
            action="sandbox.bandwidth.update",
            data=event_data(sandbox, quota_bytes=quota),
        )
        status, host_id = sandbox.status, sandbox.host_id
        view = bandwidth_view(sandbox)
    if status not in ON_HOST:
        return view
    try:
        usage = await (await hostlink.for_host(services, host_id)).set_bandwidth(sandbox_id, quota)
    except hostlink.SandboxGoneError:
        return view
    except hostlink.HostError as exc:
        raise errors.Unavailable(
            f"the recharge is saved but its host did not apply it yet ({exc}); it is retried"
        ) from None
    return await _record_usage(services, sandbox_id, usage)
