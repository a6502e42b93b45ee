"""A snapshot's volumes (issue #34, docs/volumes.md): ``include_volumes`` on a snapshot.

``POST /v1/sandboxes/{id}/snapshots`` with ``"include_volumes": true`` keeps, beside the disk, the
snapshot's own copy of each local volume the sandbox holds: a volume in its host's volume store (the
fork's copy path, ``POST /internal/v1/volumes/{id}/clone``: the source's host mount frozen for it,
``FICLONE`` where the state filesystem reflinks, else a copy of its data), owned by the snapshot
(``snapshot_volumes``; no user sees, mounts or is billed for it as a volume: its bytes count in the
snapshot's ``size_bytes``), with the path and mode it was held at.

A sandbox booted from such a snapshot (``rootfs``) gets a new volume copied from each, of the user's own
(counted against the plan's volume cap: a 403 naming ``rootfs`` when over it), held at the same path
and mode; each boot gets its own copies, so they diverge. Such a snapshot boots on its host only (its
copies are not fetched by another host). A copy the host made for a snapshot that then failed is
removed by the control plane, and by the host agent at its start when the snapshot is not whole there
(``paddock_hostagent.sandboxes.volumes``); a boot whose create fails removes the volumes made for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, hosts
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.snapshots import Snapshot, SnapshotVolume
from paddock_controlplane.records.volumes import ID_PREFIX, READY, Volume
from paddock_controlplane.resources import plans, volumes, webhooks
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.logging import get_logger

log = get_logger("paddock.snapshot_volumes")

#: What a refusal on another tier says could not be done.
COPY_OPERATION = "copying a sandbox's volumes into its snapshot (include_volumes)"


def view(rows: Sequence[SnapshotVolume]) -> list[dict[str, Any]]:
    return [
        {"name": row.name, "mount_path": row.mount_path, "read_only": row.read_only, "size_mib": row.size_mib}
        for row in rows
    ]


async def of(session: AsyncSession, snapshot_ids: Sequence[str]) -> dict[str, list[SnapshotVolume]]:
    """The volume copies each snapshot keeps, by mount path."""
    if not snapshot_ids:
        return {}
    rows = (
        await session.scalars(
            select(SnapshotVolume)
            .where(SnapshotVolume.snapshot_id.in_(list(snapshot_ids)))
            .order_by(SnapshotVolume.snapshot_id, SnapshotVolume.mount_path)
        )
    ).all()
    out: dict[str, list[SnapshotVolume]] = {}
    for row in rows:
        out.setdefault(row.snapshot_id, []).append(row)
    return out


async def keeps_any(session: AsyncSession, snapshot_id: str) -> bool:
    count = await session.scalar(
        select(func.count()).select_from(SnapshotVolume).where(SnapshotVolume.snapshot_id == snapshot_id)
    )
    return bool(count)


# --- taking a snapshot -----------------------------------------------------------------------------


async def plan(session: AsyncSession, sandbox: Sandbox, snapshot_id: str) -> list[SnapshotVolume]:
    """In the snapshot's transaction (after its row): a row per volume ``sandbox`` holds, naming the
    copy to make. A 409 naming the tier off the container tier (gVisor and VMs take volumes only when a
    sandbox starts, and a VM's memory has them mounted)."""
    held = await volumes.held(session, sandbox.id)
    if not held:
        return []
    host = await session.get(Host, sandbox.host_id) if sandbox.host_id else None
    refusal = hosts.container_tier_refusal(
        host, COPY_OPERATION, "; snapshot without include_volumes, or on the container tier"
    )
    if refusal is not None:
        raise hostlink.TierRefusedError(refusal)
    rows: list[SnapshotVolume] = []
    for attachment in held:
        original = await session.get(Volume, attachment.volume_id)
        if original is None or original.status != READY:
            raise errors.InvalidState(f"include_volumes: volume {attachment.volume_id} is not ready")
        rows.append(
            SnapshotVolume(
                snapshot_id=snapshot_id,
                volume_id=new_id(ID_PREFIX),
                source_volume_id=original.id,
                name=original.name,
                mount_path=attachment.mount_path,
                read_only=attachment.read_only,
                size_mib=original.size_mib,
                used_bytes=0,
            )
        )
    session.add_all(rows)
    return rows


async def copy(
    services: Services, host_id: str, snapshot_id: str, rows: Sequence[SnapshotVolume]
) -> dict[str, int]:
    """Makes the snapshot's copies on its host, each owned by the snapshot there; returns the bytes each
    holds. A failure raises (the caller removes what was made, ``forget``)."""
    used: dict[str, int] = {}
    if not rows:
        return used
    link = await hostlink.for_host(services, host_id)
    for row in rows:
        try:
            made = await link.clone_volume(row.source_volume_id, row.volume_id, snapshot_id=snapshot_id)
        except hostlink.CapacityError as exc:
            raise errors.InsufficientStorage(
                f"include_volumes: {exc}", fields={"include_volumes": str(exc)}
            ) from None
        except hostlink.HostError as exc:
            raise errors.ServerError(
                f"include_volumes: the host could not copy {row.source_volume_id}: {exc}"
            ) from None
        used[row.volume_id] = int(made.used_bytes)
    return used


async def forget(services: Services, host_id: str, volume_ids: Sequence[str]) -> None:
    """The copies go from the host (rows already gone); one the host cannot remove now stays there,
    where nothing names it, until the agent's next start removes it (its snapshot is not there)."""
    for volume_id in volume_ids:
        try:
            link = await hostlink.for_host(services, host_id)
            await link.delete_volume(volume_id)
        except (hostlink.HostError, hostlink.TierRefusedError, errors.PaddockError) as exc:
            log.warning("snapshot_volume_copy_not_removed", volume_id=volume_id, error=str(exc))


async def drop_rows(session: AsyncSession, snapshot_id: str) -> list[str]:
    """Removes the snapshot's copy rows (before its own); returns the copies' ids."""
    ids = list(
        (
            await session.scalars(
                select(SnapshotVolume.volume_id).where(SnapshotVolume.snapshot_id == snapshot_id)
            )
        ).all()
    )
    await session.execute(delete(SnapshotVolume).where(SnapshotVolume.snapshot_id == snapshot_id))
    return ids


# --- booting from one ------------------------------------------------------------------------------


async def plan_boot(
    session: AsyncSession,
    services: Services,
    user_id: str,
    plan: Any,
    snapshot: Snapshot,
    sandbox_id: str,
    taken_paths: Sequence[str],
) -> list[tuple[str, str]]:
    """In a create's transaction (the user's row locked), for a boot from ``snapshot``: a new volume row
    (``creating``) per copy it keeps, and the sandbox's attachment to it at the copy's path and mode.
    Returns (snapshot's copy, new volume) ids. A 403 naming ``rootfs`` when they would pass the plan's
    volume cap; a 400 naming it when a path overlaps one of the create's own volumes or disks."""
    kept = (await of(session, [snapshot.id])).get(snapshot.id, [])
    if not kept:
        return []
    for row in kept:
        for other in taken_paths:
            other = other.rstrip("/") or "/"
            if (
                row.mount_path == other
                or row.mount_path.startswith(other + "/")
                or other.startswith(row.mount_path + "/")
            ):
                raise errors.ValidationFailed.field(
                    "rootfs",
                    f"the snapshot's volume at {row.mount_path} overlaps {other}, named in the create",
                )
    cap = plans.volumes_concurrent(plan.id, plan.disks_concurrent)
    count = int(
        await session.scalar(select(func.count()).select_from(Volume).where(Volume.user_id == user_id)) or 0
    )
    if count + len(kept) > cap:
        raise errors.QuotaExceeded(
            f"rootfs: the snapshot's {len(kept)} volume(s) would pass the volume cap ({count} kept, limit {cap})",
            fields={"rootfs": f"volume cap {cap} reached"},
        )
    now = services.clock()
    out: list[tuple[str, str]] = []
    for row in kept:
        copy_id = volumes.add_held_copy(
            session,
            user_id=user_id,
            sandbox_id=sandbox_id,
            name=f"{row.name[:40]}-snap",
            host_id=snapshot.host_id,
            size_mib=row.size_mib,
            mount_path=row.mount_path,
            read_only=row.read_only,
            now=now,
        )
        out.append((row.volume_id, copy_id))
    return out


async def make_for_boot(
    services: Services, user_id: str, host_id: str, copies: Sequence[tuple[str, str]]
) -> None:
    """Makes each new volume on the host (a copy of the snapshot's copy, which nothing holds), then its
    row ``ready`` with its ``volume.create``. A failure raises; ``volumes.drop_copies`` undoes."""
    link = await hostlink.for_host(services, host_id)
    for source_id, copy_id in copies:
        try:
            await link.clone_volume(source_id, copy_id)
        except hostlink.CapacityError as exc:
            raise errors.InsufficientStorage(f"rootfs: {exc}", fields={"rootfs": str(exc)}) from None
        except hostlink.HostError as exc:
            raise errors.ServerError(
                f"rootfs: the host could not copy the snapshot's volume: {exc}"
            ) from None
    async with transaction(services.sessions) as session:
        for _, copy_id in copies:
            row = await session.get(Volume, copy_id, with_for_update=True)
            if row is not None:
                row.status = READY
                await webhooks.emit(session, user_id=user_id, action="volume.create", data=volumes.event(row))
    log.info("volumes_copied_from_snapshot", host_id=host_id, copies=[copy_id for _, copy_id in copies])
