"""Changing a sandbox's settings that need no restart (§11.7): PATCH (ingress, auto-pause and what it
does), disk resize and SSH keys."""

from __future__ import annotations

from typing import Any

from paddock_controlplane.hosts import hostlink, scheduler
from paddock_controlplane.records import app_ports, validation
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.queries import get_owned
from paddock_controlplane.records.schemas.sandboxes import PatchSandboxRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import CLOSED, TERMINAL, SandboxStatus
from paddock_controlplane.records.views import event_data
from paddock_controlplane.resources import access_tokens, accounts, webhooks
from paddock_controlplane.sandboxes import lifecycle, suspension
from paddock_core import errors
from paddock_core.db import transaction


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
    on_idle = lifecycle.check_on_idle(req.on_idle)
    # Checked before anything is written; ``""`` and ``[]`` clear them (records/app_ports.py).
    host_header = app_ports.host_header(req.ingress_host_header)
    https_ports = app_ports.https_ports(req.ingress_https_ports)
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        _require_open(sandbox)
        changed: dict[str, Any] = {}
        if on_idle is not None and on_idle != (sandbox.on_idle or "pause"):
            if on_idle == "hibernate":
                suspension.require_hibernating_host(await session.get(Host, sandbox.host_id), "on_idle")
            sandbox.on_idle = changed["on_idle"] = on_idle
        if req.ingress_enabled is not None and req.ingress_enabled != sandbox.ingress_enabled:
            sandbox.ingress_enabled = changed["ingress_enabled"] = req.ingress_enabled
        if req.ingress_host_header is not None and host_header != sandbox.ingress_host_header:
            sandbox.ingress_host_header = changed["ingress_host_header"] = host_header
        if req.ingress_https_ports is not None and https_ports != (sandbox.ingress_https_ports or []):
            sandbox.ingress_https_ports = https_ports or None
            changed["ingress_https_ports"] = https_ports
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
        if sandbox.status not in (SandboxStatus.RUNNING, SandboxStatus.PAUSED):
            raise errors.InvalidState(f"sandbox is {sandbox.status}; resize needs running or paused")
        status = sandbox.status
        if status == SandboxStatus.PAUSED:  # a running one's host refuses it itself (409)
            await hostlink.check_tier(session, sandbox.host_id, hostlink.DISK_RESIZE)
    if status == SandboxStatus.RUNNING:
        try:
            await (await hostlink.for_host(services, sandbox.host_id)).resize(sandbox_id, disk_mib)
        except hostlink.CapacityError as exc:
            # The host admits the growth before touching the disk, so its refusal changed nothing: a
            # retryable 503, as for a resume the host has no room for. The sandbox cannot move hosts,
            # so the room comes back only as other sandboxes on that host go.
            raise scheduler.no_capacity(f"host {sandbox.host_id}: {exc}") from None
        except hostlink.HostError as exc:
            raise errors.ServerError(f"resize failed on the host: {exc}") from None
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        sandbox.disk_mib = max(sandbox.disk_mib, disk_mib)
        await webhooks.emit(session, user_id=user_id, action="sandbox.resize", data=event_data(sandbox))
    return {"id": sandbox_id, "disk_mib": disk_mib}


#: Keys a sandbox may hold, each list (the account's, and its token's) counted on its own: every key is
#: tried at each SSH connection, and the list is the tenant's to grow.
MAX_SSH_PUBKEYS = 100


async def add_ssh_keys(
    services: Services, user_id: str, sandbox_id: str, keys: list[str] | None, *, token_id: str | None = None
) -> dict[str, int]:
    """Keys added with the account's key join the sandbox's own list (shown in its view, copied by a
    fork). Keys added through the sandbox's access token (``token_id``, that token generation's id)
    belong to that token: the SSH gateway accepts them only while it is enabled (access_tokens.py).
    ``count`` is how many distinct keys open the sandbox now."""
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if not keys:
            raise errors.ValidationFailed.field("keys", "at least one key is required")
        added = validation.ssh_pubkeys(keys, "keys")
        _require_open(sandbox, TERMINAL)
        now = services.clock()
        owned = list(sandbox.ssh_pubkeys or [])
        if token_id is None:
            owned = _bounded([*owned, *added])
            sandbox.ssh_pubkeys = owned
            token_keys = (await access_tokens.enabled_ssh_keys(session, [sandbox_id], now)).get(
                sandbox_id, []
            )
        else:
            token_keys = await access_tokens.add_ssh_keys(session, sandbox_id, token_id, added, now)
            _bounded(token_keys)
        count = len(set(owned) | set(token_keys))
        await webhooks.emit(
            session,
            user_id=user_id,
            action="sandbox.ssh_pubkey.update",
            data=event_data(sandbox, count=count),
        )
    return {"count": count}


def _bounded(keys: list[str]) -> list[str]:
    merged = list(dict.fromkeys(keys))
    if len(merged) > MAX_SSH_PUBKEYS:
        raise errors.ValidationFailed.field("keys", f"a sandbox holds at most {MAX_SSH_PUBKEYS} keys")
    return merged
