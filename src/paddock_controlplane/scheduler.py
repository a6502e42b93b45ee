"""Placement: pick an active host with enough free memory, honouring ``host_id`` and ``node_selector``.

Free memory is the smaller of what the host last reported and its total minus the memory of every
sandbox the database has placed there and not yet released, so two creates between heartbeats cannot
both take the last slot. Hosts are locked (FOR UPDATE on PostgreSQL) while one placement decides.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.models import Host, Sandbox
from paddock_core import errors
from paddock_core.timeutil import as_utc

#: Statuses whose sandboxes hold memory on their host (a frozen sandbox keeps its memory).
HOLDING_MEMORY = ("creating", "running", "pausing", "paused", "resuming", "forking", "destroying")


def labels_match(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Kubernetes node-selector semantics: every requested pair is among the host's labels."""
    return all(labels.get(key) == value for key, value in selector.items())


async def placed_mib(session: AsyncSession, host_id: str) -> int:
    total = await session.scalar(
        select(func.coalesce(func.sum(Sandbox.mem_mib), 0)).where(
            Sandbox.host_id == host_id, Sandbox.status.in_(HOLDING_MEMORY)
        )
    )
    return int(total or 0)


async def pick_host(
    session: AsyncSession,
    *,
    mem_mib: int,
    rootfs: str,
    now: dt.datetime,
    dead_after_s: float,
    host_id: str | None = None,
    node_selector: dict[str, str] | None = None,
) -> Host:
    query = select(Host).where(Host.status == "active").order_by(Host.id).with_for_update()
    if host_id:
        query = query.where(Host.id == host_id)
    best: tuple[int, Host] | None = None
    for host in (await session.scalars(query)).all():
        if (now - as_utc(host.last_heartbeat_at)).total_seconds() > dead_after_s:
            continue
        if node_selector and not labels_match(host.labels or {}, node_selector):
            continue
        if rootfs not in (host.rootfses or []) and rootfs not in (host.buildable or []):
            continue
        free = min(int(host.free_mib), int(host.total_mib) - await placed_mib(session, host.id))
        if free >= mem_mib and (best is None or free > best[0]):
            best = (free, host)
    if best is None:
        raise errors.Unavailable("no host with capacity")
    return best[1]
