"""A sandbox's traffic: its egress allowlist and its bandwidth budget (§11.7), both pushed to its host
when they change, and both re-pushed by the reconciler when a heartbeat shows the host lacks them."""

from __future__ import annotations

from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import validation
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.queries import get_owned
from paddock_controlplane.records.schemas.base import MAX_BANDWIDTH_QUOTA_BYTES
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import BOOTED, TERMINAL
from paddock_controlplane.records.views import bandwidth_view, event_data
from paddock_controlplane.resources import webhooks
from paddock_controlplane.resources.accounts import check_credit
from paddock_core import errors
from paddock_core.db import transaction


async def get_egress(services: Services, user_id: str, sandbox_id: str) -> dict[str, Any]:
    async with services.sessions() as session:
        sandbox = await get_owned(session, user_id, sandbox_id)
    return {"id": sandbox.id, "egress": list(sandbox.egress or [])}


async def set_egress(
    services: Services, user_id: str, sandbox_id: str, rules: list[str] | None
) -> dict[str, Any]:
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        normalised = validation.egress_rules(rules)
        if sandbox.status in TERMINAL:
            raise errors.InvalidState(f"sandbox is {sandbox.status}")
        sandbox.egress = normalised
        await webhooks.emit(
            session, user_id=user_id, action="sandbox.egress.set", data=event_data(sandbox, egress=normalised)
        )
        status, host_id = sandbox.status, sandbox.host_id
    if status in BOOTED:
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
    if sandbox.status not in BOOTED:
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
        if sandbox.status in TERMINAL:
            raise errors.InvalidState(f"sandbox is {sandbox.status}")
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
    if status not in BOOTED:
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
