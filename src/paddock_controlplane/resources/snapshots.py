"""Snapshots (issue #34): a copy of a sandbox's disk that outlives it and boots new sandboxes.

``POST /v1/sandboxes/{id}/snapshots`` (optional ``name``) copies the disk of a running or paused sandbox
on its host, the way a fork does (the sandbox is frozen for the copy, its filesystem synced, its disk
image cloned on the host's disk store: the copy shares every block, so it costs the same at any size).
The snapshot is kept on that host: ``POST /v1/sandboxes`` with ``rootfs`` = its id or name boots a new
sandbox from a clone of it, any number of times, on that host while it has room (``boot_host``: no copy
to make); otherwise, or when the create names another host, on another host, which first fetches the
snapshot's disk from the one that keeps it (``ensure_on_host``; the agent-to-agent transfer templates'
images use, ``paddock_hostagent.image_transfer``) and keeps that copy until the snapshot is deleted.
Destroying the source leaves the snapshot as it is, and deleting a snapshot leaves the sandboxes booted
from it as they are (their disks share blocks with it; the store counts them).

Caps like templates: how many snapshots an account keeps at once depends on its plan
(``plans.snapshots_concurrent``). Every tier takes snapshots: containers and gVisor (its sentry's
cached writes synced first) their disk, the VM tier its disk and memory (a sandbox booted from one
carries on its processes, with its source's vCPUs and memory). A VM snapshot, which holds memory
too, is not fetched: its boots stay on its host.

With ``include_volumes`` a snapshot also keeps its own copy of each local volume the sandbox holds,
made on its host just before the disk's (``snapshot_volumes``); a sandbox booted from it gets new
volumes copied from those, and such a snapshot boots on its host only.

A row is written ``creating`` before the host is asked (the cap and the name are held under the
caller's row lock), made ``ready`` when the host answers, and removed if the host fails; on the host a
snapshot is written under a temporary name and renamed into place only when whole. A row whose process
died in between (killed, a machine lost) is settled by the reconciler once no live process could still
be copying it (``settle_orphaned``): ``ready`` if its host holds it whole, else removed with whatever
the host has of it, as a failed create.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, hosts, scheduler
from paddock_controlplane.records import queries
from paddock_controlplane.records.models import Host
from paddock_controlplane.records.schemas.snapshots import SnapshotCreateRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.snapshots import CREATING, ID_PREFIX, READY, Snapshot, SnapshotVolume
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.resources import accounts, plans, snapshot_volumes, templates, webhooks
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.logging import get_logger
from paddock_core.timeutil import as_utc, rfc3339
from paddock_hostagent import schemas as hostschemas

log = get_logger("paddock.snapshots")

#: How long a ``dead`` host stays silent before an orphaned snapshot on it is given up
#: (``settle_orphaned``): long past a restart or a reboot, which come back within minutes.
SNAPSHOT_HOST_GONE_S = 3600.0

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def snapshot_view(row: Snapshot, kept: Sequence[SnapshotVolume] = ()) -> dict[str, Any]:
    """A snapshot as the API shows it; ``volumes``: the copies of volumes it keeps (``include_volumes``)."""
    return {
        "id": row.id,
        "name": row.name,
        "status": row.status,
        "source_sandbox_id": row.source_sandbox_id,
        "host_id": row.host_id,
        "rootfs": row.image,
        "disk_mib": row.disk_mib,
        "size_bytes": row.size_bytes,
        "created_at": rfc3339(row.created_at),
        "volumes": snapshot_volumes.view(kept),
    }


def check_name(name: str | None) -> str | None:
    if name is None:
        return None
    if not NAME.match(name):
        raise errors.ValidationFailed.field("name", "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    if name.startswith(ID_PREFIX) or name.startswith("sb-") or name.startswith("tpl_"):
        raise errors.ValidationFailed.field("name", "must not start with 'snap_', 'sb-' or 'tpl_' (ids)")
    return name


def _tier_refusal(host: Host | None) -> str | None:
    """Why the sandbox's host cannot snapshot it (its tier), or None."""
    return hosts.container_tier_refusal(
        host,
        "snapshotting a sandbox's disk",
        "; the container (crun, runc), gVisor and VM tiers take snapshots",
        also=(*hosts.VM_RUNTIMES, "runsc"),
    )


async def create(
    services: Services, user_id: str, sandbox_id: str, req: SnapshotCreateRequest
) -> dict[str, Any]:
    name = check_name(req.name)
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        sandbox = await queries.get_owned(session, user_id, sandbox_id)
        if sandbox.status not in (SandboxStatus.RUNNING, SandboxStatus.PAUSED):
            raise errors.InvalidState(
                f"sandbox is {sandbox.status}; a snapshot needs a running or paused sandbox"
            )
        if sandbox.host_id is None:
            raise errors.InvalidState("sandbox has no host to snapshot on")
        refusal = _tier_refusal(await session.get(Host, sandbox.host_id))
        if refusal is not None:
            raise hostlink.TierRefusedError(refusal)
        cap = plans.snapshots_concurrent(plan.id, plan.templates_concurrent)
        if cap <= 0:
            raise errors.PlanLimit(f"the {plan.name} plan includes no snapshots")
        kept = await session.scalar(select(func.count()).where(Snapshot.user_id == user_id))
        if int(kept or 0) >= cap:
            raise errors.QuotaExceeded(f"snapshot cap reached: limit {cap}")
        if name is not None and await _find(session, user_id, name) is not None:
            raise errors.AlreadyExists(f"name: a snapshot named {name!r} already exists")
        accounts.require_credit(account)
        row = Snapshot(
            id=new_id(ID_PREFIX),
            user_id=user_id,
            name=name,
            status=CREATING,
            host_id=str(sandbox.host_id),
            source_sandbox_id=sandbox.id,
            image=sandbox.rootfs,
            disk_mib=sandbox.disk_mib,
            size_bytes=0,
            created_at=services.clock(),
        )
        session.add(row)
        # Its own copy of each volume the sandbox holds, only when asked (a 409 off the container tier).
        copying = await snapshot_volumes.plan(session, sandbox, row.id) if req.include_volumes else []
    try:
        # The volumes first, then the disk, as a fork's copies (each consistent in itself).
        used = await snapshot_volumes.copy(services, row.host_id, row.id, copying)
        link = await hostlink.for_host(services, row.host_id)
        made = await link.snapshot(sandbox_id, row.id)
    except Exception as exc:
        async with transaction(services.sessions) as session:
            await snapshot_volumes.drop_rows(session, row.id)
            await session.execute(delete(Snapshot).where(Snapshot.id == row.id))
        await snapshot_volumes.forget(services, row.host_id, [copy.volume_id for copy in copying])
        if isinstance(exc, hostlink.SandboxGoneError):
            raise errors.InvalidState("sandbox is no longer running on its host") from None
        if isinstance(exc, hostlink.HostError):
            log.warning("snapshot_failed", sandbox_id=sandbox_id, snapshot_id=row.id, error=str(exc))
            raise errors.ServerError(f"snapshot failed: {exc}") from None
        raise
    async with transaction(services.sessions) as session:
        stored = await session.get(Snapshot, row.id, with_for_update=True)
        if stored is None:  # deleted while its copy was made: the copy goes too
            await _forget_on_host(services, row.host_id, row.id)
            await snapshot_volumes.forget(services, row.host_id, list(used))
            raise errors.NotFound("snapshot not found")
        copies = (await snapshot_volumes.of(session, [row.id])).get(row.id, [])
        # Already ``ready`` only if the reconciler took this process for dead and found the copy whole
        # (``settle_orphaned``): recorded once, with its one event.
        if stored.status == CREATING:
            await _record_ready(session, stored, copies, made.size_bytes, made.image, used, sandbox_id)
        view = snapshot_view(stored, copies)
    log.info("snapshot_created", snapshot_id=row.id, sandbox_id=sandbox_id, snapshot_ms=made.snapshot_ms)
    return view


async def _find(
    session: AsyncSession, user_id: str, ref: str, *, for_update: bool = False
) -> Snapshot | None:
    """The user's snapshot with this id or, failing that, this name."""
    query = (
        select(Snapshot)
        .where(Snapshot.user_id == user_id, or_(Snapshot.id == ref, Snapshot.name == ref))
        .order_by((Snapshot.id == ref).desc())
        .limit(1)
    )
    if for_update:
        query = query.with_for_update()
    return (await session.scalars(query)).first()


async def get_owned(session: AsyncSession, user_id: str, ref: str) -> Snapshot:
    row = await _find(session, user_id, ref)
    if row is None:
        raise errors.NotFound("snapshot not found")
    return row


async def detail(session: AsyncSession, user_id: str, ref: str) -> dict[str, Any]:
    row = await get_owned(session, user_id, ref)
    return snapshot_view(row, (await snapshot_volumes.of(session, [row.id])).get(row.id, []))


async def page(
    session: AsyncSession, user_id: str, *, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    total = await session.scalar(
        select(func.count()).select_from(Snapshot).where(Snapshot.user_id == user_id)
    )
    rows = (
        await session.scalars(
            select(Snapshot)
            .where(Snapshot.user_id == user_id)
            .order_by(Snapshot.created_at, Snapshot.id)
            .limit(limit)
            .offset(offset)
        )
    ).all()
    kept = await snapshot_volumes.of(session, [row.id for row in rows])
    return [snapshot_view(row, kept.get(row.id, [])) for row in rows], int(total or 0)


async def delete_snapshot(services: Services, user_id: str, ref: str) -> None:
    """Removes the row (a snapshot being made is a 409), then the copy on its host; the sandboxes booted
    from it keep their disks."""
    async with transaction(services.sessions) as session:
        row = await _find(session, user_id, ref, for_update=True)
        if row is None:
            raise errors.NotFound("snapshot not found")
        if row.status == CREATING:
            # One whose copy was cut short (its control plane stopped) is settled by the reconciler.
            raise errors.InvalidState("snapshot is being made; delete it once it is ready")
        snapshot_id, host_id = row.id, row.host_id
        copies = await snapshot_volumes.drop_rows(session, snapshot_id)
        await session.delete(row)
        await webhooks.emit(
            session,
            user_id=user_id,
            action="snapshot.delete",
            data={"snapshot_id": snapshot_id, "name": row.name},
        )
    await _forget_on_host(services, host_id, snapshot_id)
    await snapshot_volumes.forget(services, host_id, copies)  # its volumes' copies, on its host only
    # Copies fetched by other hosts (``ensure_on_host``) are not recorded: every other active host is
    # asked (a host without one answers that it had none).
    async with services.sessions() as session:
        others = (await session.scalars(select(Host.id).where(Host.status == "active"))).all()
    for other in others:
        if other != host_id:
            await _forget_on_host(services, str(other), snapshot_id)


async def settle_orphaned(services: Services, snapshot_id: str) -> str | None:
    """For the reconciler: a ``creating`` row that no live process can still record (its process died
    between writing it and recording the host's answer). Its host is asked whether it holds the snapshot
    whole, its disk and each volume copy it was to keep:

    - whole: the row is ``ready`` with its size, as the create would have recorded it, with its
      ``snapshot.create`` event (billed from now, not from while it was left ``creating``);
    - not whole: the host is asked to remove what it has of it (the snapshot, its volume copies), then
      the row and its copies' rows go, as a failed create's do (no event: a failed create emits none).

    A host that does not answer raises :class:`hostlink.HostError` and nothing changes (asked again
    later), unless it is gone: removed from the fleet, or ``dead`` and silent for
    ``SNAPSHOT_HOST_GONE_S``. Then the row and its copies' rows go without asking it, so a snapshot
    never stays ``creating`` for good, holding a place under the plan's cap (what such a host still
    keeps of it is not asked for again).

    Returns ``"ready"`` or ``"removed"``, or None when the row was no longer ``creating`` (the create's
    own process, or another control plane, recorded it first: the row is locked and read again before
    anything is written, so one outcome and one event are recorded)."""
    async with services.sessions() as session:
        row = await session.get(Snapshot, snapshot_id)
        if row is None or row.status != CREATING:
            return None
        host_id = row.host_id
        copy_ids = [
            copy.volume_id
            for copy in (await snapshot_volumes.of(session, [snapshot_id])).get(snapshot_id, [])
        ]
        host = await session.get(Host, host_id)
        gone = host is None or (
            host.status == "dead"
            and (services.clock() - as_utc(host.last_heartbeat_at)).total_seconds() >= SNAPSHOT_HOST_GONE_S
        )
    if gone:
        return await _drop_creating(services, snapshot_id, host_id, "its host is gone")
    link = await hostlink.for_host(services, host_id)
    held = await link.held_snapshot(snapshot_id)
    used: dict[str, int] = {}
    for volume_id in copy_ids if held is not None else []:
        # The copies are made before the disk's, so a whole disk means each was made; one gone since
        # leaves a snapshot that cannot boot as it was taken.
        volume = await link.held_volume(volume_id)
        if volume is None:
            held = None
            break
        used[volume_id] = int(volume.used_bytes)
    if held is None:
        await link.delete_snapshot(snapshot_id)
        for volume_id in copy_ids:
            await link.delete_volume(volume_id)
        return await _drop_creating(services, snapshot_id, host_id, "its host does not hold it whole")
    async with transaction(services.sessions) as session:
        stored = await session.get(Snapshot, snapshot_id, with_for_update=True)
        if stored is None or stored.status != CREATING:
            return None
        copies = (await snapshot_volumes.of(session, [snapshot_id])).get(snapshot_id, [])
        stored.billed_until = services.clock()
        await _record_ready(
            session, stored, copies, held.size_bytes, held.image, used, stored.source_sandbox_id
        )
    log.warning("orphaned_snapshot_ready", snapshot_id=snapshot_id, host_id=host_id)
    return "ready"


async def _drop_creating(services: Services, snapshot_id: str, host_id: str, why: str) -> str | None:
    """The row of an orphaned ``creating`` snapshot and its copies' rows go, as a failed create's do
    (no event), if it is still ``creating`` under its lock."""
    async with transaction(services.sessions) as session:
        stored = await session.get(Snapshot, snapshot_id, with_for_update=True)
        if stored is None or stored.status != CREATING:
            return None
        await snapshot_volumes.drop_rows(session, snapshot_id)
        await session.delete(stored)
    log.warning("orphaned_snapshot_removed", snapshot_id=snapshot_id, host_id=host_id, reason=why)
    return "removed"


async def _record_ready(
    session: AsyncSession,
    stored: Snapshot,
    copies: Sequence[SnapshotVolume],
    disk_bytes: int,
    image: str,
    used: Mapping[str, int],
    sandbox_id: str | None,
) -> None:
    """The host holds the snapshot whole: its row ``ready``, its volume copies' sizes, with its
    ``snapshot.create`` (the create's process, or the reconciler's for one whose process died)."""
    for copy in copies:
        copy.used_bytes = used.get(copy.volume_id, 0)
    # Its stored bytes: the disk's and its volumes' copies' (what it is billed for).
    stored.status, stored.size_bytes = READY, disk_bytes + sum(used.values())
    stored.image = image  # the image under the disk (a sandbox booted from it names it)
    await webhooks.emit(
        session,
        user_id=stored.user_id,
        action="snapshot.create",
        data={"snapshot_id": stored.id, "name": stored.name, "sandbox_id": sandbox_id},
    )


async def _forget_on_host(services: Services, host_id: str, snapshot_id: str) -> None:
    try:
        link = await hostlink.for_host(services, host_id)
        await link.delete_snapshot(snapshot_id)
    except (hostlink.HostError, hostlink.SandboxGoneError, errors.PaddockError) as exc:
        # The row is gone, so nothing boots it again; its copy stays on the host until removed there.
        log.warning(
            "snapshot_delete_on_host_failed", snapshot_id=snapshot_id, host_id=host_id, error=str(exc)
        )


async def resolve(session: AsyncSession, user_id: str, ref: str) -> Snapshot | None:
    """For ``POST /v1/sandboxes``: the user's snapshot named by ``rootfs`` (409 unless ready)."""
    row = await _find(session, user_id, ref)
    if row is not None and row.status != READY:
        raise errors.InvalidState(f"snapshot {ref!r} is {row.status}, not ready")
    return row


def _pinned(host: Host | None) -> bool:
    """A VM host's snapshots hold memory and never leave it."""
    return hosts.runtime_of(host) in hosts.VM_RUNTIMES


def image_fetchable(snapshot: Snapshot) -> bool:
    """Whether a host without the image under the snapshot can fetch it (a template's, as any)."""
    return snapshot.image.startswith("tpl_")


async def boot_host(
    session: AsyncSession,
    services: Services,
    snapshot: Snapshot,
    requested: str | None,
    *,
    mem_mib: int,
) -> str | None:
    """Where a boot from ``snapshot`` goes: the host the create asked for (by ``host_id`` or a private
    network), which fetches the snapshot if it does not keep it; else the host that keeps it while it
    is active with room for ``mem_mib`` (no copy to make); else None, any host the scheduler picks,
    which fetches it. A VM snapshot, and one that keeps volumes, boots on its host only (409 naming both
    if another is asked)."""
    pinned = _pinned(await session.get(Host, snapshot.host_id))
    if pinned or await snapshot_volumes.keeps_any(session, snapshot.id):
        if requested is not None and requested != snapshot.host_id:
            what = "holds memory" if pinned else "keeps volumes"
            raise errors.InvalidState(
                f"snapshot {snapshot.id} {what} and is kept on host {snapshot.host_id}, not on {requested}"
            )
        return snapshot.host_id
    if requested is not None:
        return requested
    try:
        await scheduler.pick_host(
            session,
            mem_mib=mem_mib,
            rootfs=snapshot.image,
            now=services.clock(),
            dead_after_s=services.settings.host_dead_after_s,
            host_id=snapshot.host_id,
            fetchable=True,
        )
    except errors.Unavailable as exc:
        log.info("snapshot_holder_full", snapshot_id=snapshot.id, host_id=snapshot.host_id, reason=str(exc))
        return None
    return snapshot.host_id


async def ensure_on_host(services: Services, link: hostlink.HostLink, host_id: str, rootfs: str) -> None:
    """Before a boot from a snapshot on a host that does not keep it, that host fetches the image under
    it (a template's, ``templates.ensure_image``) and then the snapshot's disk from the host that keeps
    it, bounded by the snapshot's recorded size; one it fetched before answers at once."""
    if not rootfs.startswith(ID_PREFIX):
        return
    async with services.sessions() as session:
        row = await session.get(Snapshot, rootfs)
        source = await session.get(Host, row.host_id) if row is not None else None
    if row is None or source is None or source.id == host_id:
        return
    await templates.ensure_image(services, link, host_id, row.image)
    await link.fetch_image(
        row.id, source.url, hostschemas.fetch_limit(row.size_bytes or (row.disk_mib << 20))
    )
    log.info("snapshot_fetched", snapshot_id=row.id, host_id=host_id, source_host_id=source.id)
