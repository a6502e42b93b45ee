"""Host inventory: heartbeats in, liveness out, and the images the fleet can serve."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import String, cast, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import scheduler
from paddock_controlplane.records.models import Host, NetworkMember, Sandbox
from paddock_controlplane.records.states import TERMINAL
from paddock_core import errors
from paddock_core.rootfs import ROOT_IMAGES_BY_NAME

HOST_STATUSES = ("active", "draining", "dead")


#: The runtimes of the container tier: the only tier whose disks the host can clone into snapshots and
#: mount volumes beside (gVisor's gofer and the VM's block device do not take them yet).
CONTAINER_RUNTIMES = ("crun", "runc")
#: The VM tier's runtime: it snapshots a sandbox with its memory (drivers/vm/vmsnapshots.py).
VM_RUNTIMES = ("qemu",)


def runtime_of(host: Host | None) -> str | None:
    """The host's runtime label (``paddock.io/runtime``: crun, runc, runsc or qemu), if it said."""
    return ((host.labels or {}) if host is not None else {}).get("paddock.io/runtime")


def container_tier_refusal(
    host: Host | None, operation: str, suffix: str, *, also: tuple[str, ...] = ()
) -> str | None:
    """Why ``host`` cannot do ``operation`` (its runtime is neither a container runtime nor one of
    ``also``, the other runtimes the caller's operation runs on), or None; the message names the tier
    and the runtime (``paddock.io/isolation``, ``paddock.io/runtime`` labels)."""
    runtime = runtime_of(host)
    if runtime is None or runtime in CONTAINER_RUNTIMES or runtime in also:
        return None
    tier = ((host.labels or {}) if host is not None else {}).get("paddock.io/isolation", runtime)
    return f"{operation} is not supported on the {tier} isolation tier ({runtime}){suffix}"


def host_view(host: Host) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": host.id,
        "status": host.status,
        "free_mib": int(host.free_mib),
        "vm_count": int(host.vm_count),
    }
    # Catalog images only: the templates a host holds belong to their users (their ids are private).
    catalog = sorted(name for name in host.rootfses or [] if name in ROOT_IMAGES_BY_NAME)
    if catalog:
        out["rootfses"] = catalog
    # Additive to §10.4: the labels ``node_selector`` matches, among them the isolation tier the host
    # gives (``paddock.io/isolation``: container, gvisor or vm; docs/isolation.md).
    if host.labels:
        out["labels"] = {str(key): str(value) for key, value in dict(host.labels).items()}
    return out


async def record_heartbeat(session: AsyncSession, beat: dict[str, Any], now: dt.datetime) -> Host:
    host = await session.get(Host, beat["id"])
    status = beat.get("status", "active")
    if status not in HOST_STATUSES:
        status = "active"
    if host is None:
        host = Host(id=beat["id"], created_at=now, drained=False)
        session.add(host)
    host.url = beat["url"]
    host.status = "draining" if host.drained and status == "active" else status
    host.free_mib = int(beat.get("free_mib", 0))
    host.total_mib = int(beat.get("total_mib", 0))
    host.vm_count = int(beat.get("vm_count", 0))
    host.rootfses = sorted(set(beat.get("rootfses", [])))
    host.buildable = sorted(set(beat.get("buildable", [])))
    host.labels = {str(k): str(v) for k, v in dict(beat.get("labels", {})).items()}
    host.last_heartbeat_at = now
    return host


async def list_hosts(session: AsyncSession, *, limit: int, offset: int) -> tuple[list[Host], int]:
    total = await session.scalar(select(func.count()).select_from(Host))
    rows = await session.scalars(select(Host).order_by(Host.created_at, Host.id).limit(limit).offset(offset))
    return list(rows.all()), int(total or 0)


async def mark_silent_hosts_dead(session: AsyncSession, now: dt.datetime, dead_after_s: float) -> list[str]:
    """Hosts whose last heartbeat is older than ``dead_after_s`` become ``dead``; returns their ids.

    One statement that touches only the silent hosts (the pass runs every second: reading every host's
    row, JSON lists and all, cost what the fleet's size did). The condition is checked again on the row
    as it is written, so a heartbeat committed meanwhile keeps its host alive (PostgreSQL re-reads a
    row an UPDATE waited for); an ORM read then write would mark such a host dead and error its
    sandboxes."""
    cutoff = now - dt.timedelta(seconds=dead_after_s)
    died = await session.scalars(
        update(Host)
        .where(Host.status != "dead", Host.last_heartbeat_at < cutoff)
        .values(status="dead")
        .returning(Host.id)
        .execution_options(synchronize_session=False)
    )
    return sorted(str(host_id) for host_id in died.all())


#: The image lists of the active hosts, each distinct pair once: a fleet's hosts mostly hold the same
#: images, so a create reads a few rows whatever the fleet's size (loading every active host through the
#: ORM cost a create 1.8 ms at 3 hosts and 5.2 ms at 200). As text: PostgreSQL's JSON has no equality.
_IMAGE_LISTS = (
    select(cast(Host.rootfses, String), cast(Host.buildable, String))
    .where(Host.status == "active")
    .distinct()
)


async def available_images(session: AsyncSession) -> set[str]:
    images: set[str] = set()
    for rootfses, buildable in (await session.execute(_IMAGE_LISTS)).all():
        for listed in (rootfses, buildable):
            images.update(str(name) for name in json.loads(listed or "[]") or [])
    return images


async def set_drained(session: AsyncSession, host_id: str, drained: bool) -> Host:
    """Drains a host (no new placements; its sandboxes keep running) or puts it back in service.

    Takes effect at once for placement; a dead host keeps the mark and returns ``draining``. It takes
    turns with placements (``scheduler.placement_lock``): a placement in flight, which locks no host
    row, commits before the drain does, and none after it can choose the host.
    """
    await scheduler.placement_lock(session)
    host = await session.get(Host, host_id, with_for_update=True)
    if host is None:
        raise errors.NotFound(f"no host {host_id!r}")
    host.drained = drained
    if host.status != "dead":
        host.status = "draining" if drained else "active"
    return host


async def overlay_peers(session: AsyncSession, host_id: str) -> dict[str, list[str]]:
    """For each private network with a live member on ``host_id``: the addresses of the other hosts
    that run its live members (from their registered URLs). The host programs its VXLAN ports from
    this, which the control plane sends back in answer to every heartbeat."""
    live = Sandbox.status.not_in(list(TERMINAL))
    local = select(NetworkMember.network_id).join(Sandbox, Sandbox.id == NetworkMember.sandbox_id)
    local = local.where(Sandbox.host_id == host_id, live)
    rows = await session.execute(
        select(NetworkMember.network_id, Host.url)
        .join(Sandbox, Sandbox.id == NetworkMember.sandbox_id)
        .join(Host, Host.id == Sandbox.host_id)
        .where(NetworkMember.network_id.in_(local), Host.id != host_id, live)
    )
    peers: dict[str, set[str]] = {}
    for network_id in (await session.scalars(local)).all():
        peers.setdefault(str(network_id), set())
    for network_id, url in rows.all():
        address = urlsplit(str(url)).hostname
        if address:
            peers.setdefault(str(network_id), set()).add(address)
    return {network_id: sorted(addresses) for network_id, addresses in peers.items()}
