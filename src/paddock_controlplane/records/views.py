"""Rendering sandbox rows as the contract's views (§10.7–§10.10). Optional fields are left out, never null."""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect
from sqlalchemy.orm.base import NO_VALUE

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.states import TERMINAL, WITH_REASON
from paddock_core.timeutil import rfc3339


def ingress_url_template(sandbox: Sandbox, scheme: str, domain: str) -> str:
    return f"{scheme}://<port>-{sandbox.id}.{domain}"


def sandbox_view(sandbox: Sandbox, *, scheme: str, domain: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": sandbox.id,
        "status": sandbox.status,
        "vcpu": sandbox.vcpu,
        "mem_mib": sandbox.mem_mib,
        "disk_mib": sandbox.disk_mib,
        "created_at": rfc3339(sandbox.created_at),
        "ingress_enabled": bool(sandbox.ingress_enabled),
        "name": sandbox.name,
        "shape": sandbox.shape,
        "rootfs": sandbox.rootfs,
        "region": sandbox.region,
        "created_by": sandbox.user_id,
    }
    optional: dict[str, Any] = {
        "ip": sandbox.ip,
        "running_at": sandbox.running_at and rfc3339(sandbox.running_at),
        "destroyed_at": sandbox.destroyed_at and rfc3339(sandbox.destroyed_at),
        "paused_at": sandbox.paused_at and rfc3339(sandbox.paused_at),
        "last_resumed_at": sandbox.last_resumed_at and rfc3339(sandbox.last_resumed_at),
        "spawn_ms": sandbox.spawn_ms,
        "egress": list(sandbox.egress or []) or None,
        "envs": sorted(sandbox.env_keys or []) or None,
        "ssh_pubkeys": list(sandbox.ssh_pubkeys or []) or None,
        "bandwidth_ingress_bytes": int(sandbox.bandwidth_ingress_bytes or 0) or None,
        "forked_from": sandbox.forked_from,
        "auto_pause_after_seconds": sandbox.auto_pause_after_seconds,
        # Additive: what the idle pause does, shown when it hibernates (absent: a frozen pause).
        "on_idle": "hibernate" if sandbox.on_idle == "hibernate" else None,
        # Additive (issue #34): a paused sandbox whose host keeps only its disk (docs/hibernation.md).
        "hibernated": True if sandbox.hibernated and sandbox.status not in TERMINAL else None,
        "auto_hibernate_after_seconds": sandbox.auto_hibernate_after_seconds,
        "oom_kills": int(sandbox.oom_kills or 0) or None,
        "status_reason": sandbox.status_reason if sandbox.status in WITH_REASON else None,
        "timeout_s": sandbox.timeout_s,
        "on_timeout": sandbox.on_timeout,
        "end_at": (sandbox.end_at and sandbox.status not in TERMINAL and rfc3339(sandbox.end_at)) or None,
        "metadata": dict(sandbox.labels) if sandbox.labels else None,
        # Additive: how its ports are reached, when it says (records/app_ports.py, docs/ingress.md).
        **app_ports_view(sandbox),
    }
    out.update({key: value for key, value in optional.items() if value is not None})
    networks = network_refs(sandbox)
    if networks:
        out["networks"] = networks
    if sandbox.ingress_enabled and sandbox.status not in TERMINAL:
        out["ingress_url_template"] = ingress_url_template(sandbox, scheme, domain)
    return out


def network_refs(sandbox: Sandbox) -> list[dict[str, Any]]:
    """``[{id, status, ip?}]`` from memberships loaded with the row; never loads anything itself."""
    loaded = inspect(sandbox).attrs.memberships.loaded_value
    if loaded is NO_VALUE or not loaded:
        return []
    out = []
    for member in loaded:
        ref: dict[str, Any] = {"id": member.network_id, "status": member.status}
        if member.status == "active":
            ref["ip"] = member.ip
        out.append(ref)
    return out


def create_response(sandbox: Sandbox, *, scheme: str, domain: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": sandbox.id,
        "status": sandbox.status,
        "name": sandbox.name,
        "ip": sandbox.ip or "",
        "shape": sandbox.shape,
        "rootfs": sandbox.rootfs,
        "vcpu": sandbox.vcpu,
        "mem_mib": sandbox.mem_mib,
        "disk_mib": sandbox.disk_mib,
        "spawn_ms": sandbox.spawn_ms or 0,
        "egress": list(sandbox.egress or []),
        "bandwidth_quota_bytes": int(sandbox.bandwidth_quota_bytes),
        "ingress_enabled": bool(sandbox.ingress_enabled),
        "created_at": rfc3339(sandbox.created_at),
        "region": sandbox.region,
    }
    if sandbox.ingress_enabled:
        out["ingress_url_template"] = ingress_url_template(sandbox, scheme, domain)
    networks = network_refs(sandbox)
    if networks:
        out["networks"] = networks
    if sandbox.timeout_s:
        out["timeout_s"] = sandbox.timeout_s
        out["on_timeout"] = sandbox.on_timeout
    if sandbox.end_at:
        out["end_at"] = rfc3339(sandbox.end_at)
    if sandbox.labels:
        out["metadata"] = dict(sandbox.labels)
    out.update(app_ports_view(sandbox))
    return out


def app_ports_view(sandbox: Sandbox) -> dict[str, Any]:
    """``ingress_host_header`` and ``ingress_https_ports``, each only when set."""
    ports = sandbox.app_ports
    out: dict[str, Any] = {}
    if ports.host_header:
        out["ingress_host_header"] = ports.host_header
    if ports.https_ports:
        out["ingress_https_ports"] = sorted(ports.https_ports)
    return out


def event_data(sandbox: Sandbox, **extra: Any) -> dict[str, Any]:
    """``data`` of a ``sandbox.*`` webhook event (§11.15), with the action's own fields."""
    return {
        "sandbox_id": sandbox.id,
        "user_id": sandbox.user_id,
        "name": sandbox.name,
        "shape": sandbox.shape,
        "disk_mib": sandbox.disk_mib,
        "region": sandbox.region,
        **extra,
    }


def bandwidth_view(sandbox: Sandbox, *, capped: bool | None = None) -> dict[str, Any]:
    """``capped`` is the host's word when it was asked: the kernel blocks the first packet that does not
    fit in the budget, so a capped sandbox may have used slightly less than its quota (then nothing
    remains)."""
    quota = int(sandbox.bandwidth_quota_bytes)
    used = int(sandbox.bandwidth_used_bytes or 0)
    unmetered = quota < 0
    is_capped = (not unmetered) and (used >= quota if capped is None else capped)
    return {
        "id": sandbox.id,
        "quota_bytes": quota,
        "used_bytes": used,
        "ingress_bytes": int(sandbox.bandwidth_ingress_bytes or 0),
        "remaining_bytes": -1 if unmetered else (0 if is_capped else max(0, quota - used)),
        "capped": is_capped,
    }
