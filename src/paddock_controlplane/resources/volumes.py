"""Local persistent volumes (issue #34, docs/volumes.md): CRUD, resize, and their attachments.

A volume is an XFS filesystem in a file on the host that made it (``paddock_hostagent``'s
``drivers/storage/volumes.py``); it outlives every sandbox it is mounted into, and a sandbox that uses
it runs on that host. One sandbox may hold it read-write, or any number read-only, never both: the
check runs under the user's row lock (``accounts.lock_user``), so two attaches cannot both pass it.

Choices: an attachment whose sandbox is destroyed or failed no longer holds the volume (destroy needs
no step of its own: the host drops its mounts with the sandbox); a volume with a live attachment cannot
be deleted (409 naming the sandboxes); a fork and a snapshot take volumes along only when asked
(``include_volumes``: the fork's child gets a copy of each, ``plan_copies``/``make_copies``; a snapshot
keeps its own, ``resources/snapshot_volumes.py``); a volume only grows. Every tier keeps volumes:
the container tier (crun, runc) mounts them at create or live; gVisor binds them, and the VM tier gives
them as drives, only at a sandbox's start, so a create sends them to such a host before the create call
(``before_boot``) and a live attach there is a 409 naming the tier.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, hosts
from paddock_controlplane.records import queries
from paddock_controlplane.records.models import Host, Sandbox, SandboxDisk
from paddock_controlplane.records.schemas.volumes import (
    VolumeAttachment,
    VolumeCreateRequest,
    VolumeResizeRequest,
)
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import TERMINAL, SandboxStatus
from paddock_controlplane.records.volumes import CREATING, DELETING, ID_PREFIX, READY, Volume
from paddock_controlplane.records.volumes import VolumeAttachment as AttachmentRow
from paddock_controlplane.resources import accounts, plans, webhooks
from paddock_core import errors, s3config
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.logging import get_logger
from paddock_core.timeutil import as_utc, rfc3339
from paddock_hostagent.schemas import VolumeMountBody

log = get_logger("paddock.volumes")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
#: The least a volume holds (XFS itself refuses under 300 MiB).
MIN_SIZE_MIB = 512
#: What a refusal on another tier says could not be done (hosts.container_tier_refusal).
OPERATION = "mounting a local volume"
LIVE_OPERATION = "mounting a local volume into a running sandbox"
#: The runtimes that take a volume only at a sandbox's start (gVisor's binds, a VM's drives): told
#: before the create call.
BOUND_AT_START = ("runsc", "qemu")
ATTACHABLE = (SandboxStatus.RUNNING, SandboxStatus.PAUSED)


# --- views ---------------------------------------------------------------------------------------


def volume_view(row: Volume, holders: Sequence[AttachmentRow] = ()) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "status": row.status,
        "size_mib": row.size_mib,
        "host_id": row.host_id,
        "created_at": rfc3339(row.created_at),
        "attachments": [
            {"sandbox_id": a.sandbox_id, "mount_path": a.mount_path, "read_only": a.read_only}
            for a in holders
        ],
    }


# --- validation ----------------------------------------------------------------------------------


def _event(row: Volume) -> dict[str, Any]:
    """A volume's webhook data: what names it and what it holds (docs/webhooks.md)."""
    return {"volume_id": row.id, "name": row.name, "size_mib": row.size_mib, "host_id": row.host_id}


def check_name(name: str | None) -> str:
    if not name:
        raise errors.ValidationFailed.field("name", "required")
    if not NAME.match(name):
        raise errors.ValidationFailed.field("name", "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    if name.startswith(ID_PREFIX):
        raise errors.ValidationFailed.field("name", "must not start with 'vol_' (ids do)")
    return name


def check_size(size_mib: int | None, max_mib: int, plan_name: str, *, current: int = 0) -> int:
    if size_mib is None:
        raise errors.ValidationFailed.field("size_mib", "required")
    if size_mib < MIN_SIZE_MIB:
        raise errors.ValidationFailed.field("size_mib", f"must be at least {MIN_SIZE_MIB}")
    if current and size_mib <= current:
        raise errors.ValidationFailed.field(
            "size_mib", f"must be larger than the volume's {current} MiB (a volume only grows)"
        )
    if size_mib > max_mib:
        raise errors.PlanLimit(
            f"size_mib: {size_mib} MiB is more than the {plan_name} plan allows ({max_mib} MiB)",
            fields={"size_mib": f"at most {max_mib}"},
        )
    return size_mib


def check_mount_path(value: str | None, field: str) -> str:
    try:
        return s3config.mount_path(value or "")
    except ValueError as exc:
        raise errors.ValidationFailed.field(field, str(exc)) from None


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def tier_refusal(host: Host | None) -> str | None:
    """Why ``host`` keeps no volumes (its tier), or None."""
    return hosts.container_tier_refusal(
        host, OPERATION, "; the container, gVisor and VM tiers keep volumes", also=BOUND_AT_START
    )


def live_refusal(host: Host | None) -> str | None:
    """Why a running sandbox on ``host`` takes no volume (its tier), or None."""
    return tier_refusal(host) or hosts.container_tier_refusal(
        host,
        LIVE_OPERATION,
        "; gVisor and VM sandboxes take volumes only when they start: name the volume in the create",
    )


# --- reading -------------------------------------------------------------------------------------


async def _find(session: AsyncSession, user_id: str, ref: str, *, for_update: bool = False) -> Volume | None:
    """The user's volume with this id or, failing that, this name."""
    query = (
        select(Volume)
        .where(Volume.user_id == user_id, or_(Volume.id == ref, Volume.name == ref))
        .order_by((Volume.id == ref).desc())
        .limit(1)
    )
    if for_update:
        query = query.with_for_update()
    return (await session.scalars(query)).first()


async def get_owned(session: AsyncSession, user_id: str, ref: str, *, for_update: bool = False) -> Volume:
    row = await _find(session, user_id, ref, for_update=for_update)
    if row is None:
        raise errors.NotFound("volume not found")
    return row


async def holders(session: AsyncSession, volume_ids: Sequence[str]) -> dict[str, list[AttachmentRow]]:
    """The live attachments of each volume (their sandbox not destroyed or failed)."""
    if not volume_ids:
        return {}
    rows = (
        await session.scalars(
            select(AttachmentRow)
            .join(Sandbox, Sandbox.id == AttachmentRow.sandbox_id)
            .where(AttachmentRow.volume_id.in_(list(volume_ids)), Sandbox.status.not_in(TERMINAL))
            .order_by(AttachmentRow.created_at, AttachmentRow.sandbox_id)
        )
    ).all()
    out: dict[str, list[AttachmentRow]] = {}
    for row in rows:
        out.setdefault(row.volume_id, []).append(row)
    return out


async def detail(session: AsyncSession, user_id: str, ref: str) -> dict[str, Any]:
    row = await get_owned(session, user_id, ref)
    return volume_view(row, (await holders(session, [row.id])).get(row.id, []))


async def page(
    session: AsyncSession, user_id: str, *, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    total = await session.scalar(select(func.count()).select_from(Volume).where(Volume.user_id == user_id))
    rows = (
        await session.scalars(
            select(Volume)
            .where(Volume.user_id == user_id)
            .order_by(Volume.created_at, Volume.id)
            .limit(limit)
            .offset(offset)
        )
    ).all()
    held = await holders(session, [row.id for row in rows])
    return [volume_view(row, held.get(row.id, [])) for row in rows], int(total or 0)


# --- create, resize, delete ----------------------------------------------------------------------


async def _pick_host(session: AsyncSession, services: Services, host_id: str | None) -> Host:
    """The host to keep a new volume on: the one named, else the active container-tier host with the
    most free memory (a volume's sandboxes run there)."""
    now = services.clock()
    dead_after_s = services.settings.host_dead_after_s

    def alive(host: Host) -> bool:
        return (
            host.status == "active"
            and not host.drained
            and (now - as_utc(host.last_heartbeat_at)).total_seconds() <= dead_after_s
        )

    if host_id:
        host = await session.get(Host, host_id)
        if host is None:
            raise errors.ValidationFailed.field("host_id", f"no host {host_id!r}; see GET /v1/hosts")
        refusal = tier_refusal(host)
        if refusal is not None:
            raise hostlink.TierRefusedError(refusal)
        if not alive(host):
            raise errors.Unavailable(f"host {host_id} is not active", retry_after_s=5)
        return host
    active = [host for host in (await session.scalars(select(Host).order_by(Host.id))).all() if alive(host)]
    if not active:
        raise errors.Unavailable("no active host", retry_after_s=5)
    keeping = [host for host in active if tier_refusal(host) is None]
    if not keeping:
        raise hostlink.TierRefusedError(str(tier_refusal(active[0])))
    return max(keeping, key=lambda host: host.free_mib)


async def create(services: Services, user_id: str, req: VolumeCreateRequest) -> dict[str, Any]:
    name = check_name(req.name)
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        size_mib = check_size(req.size_mib, plan.max_disk_mib, plan.name)
        cap = plans.volumes_concurrent(plan.id, plan.disks_concurrent)
        if cap <= 0:
            raise errors.PlanLimit(f"the {plan.name} plan includes no volumes")
        kept = await session.scalar(select(func.count()).select_from(Volume).where(Volume.user_id == user_id))
        if int(kept or 0) >= cap:
            raise errors.QuotaExceeded(f"volume cap reached: limit {cap}")
        if await _find(session, user_id, name) is not None:
            raise errors.AlreadyExists(
                f"name: a volume named {name!r} already exists", fields={"name": "taken"}
            )
        accounts.require_credit(account)
        host = await _pick_host(session, services, req.host_id)
        row = Volume(
            id=new_id(ID_PREFIX),
            user_id=user_id,
            name=name,
            status=CREATING,
            host_id=host.id,
            size_mib=size_mib,
            created_at=services.clock(),
        )
        session.add(row)
    try:
        link = await hostlink.for_host(services, row.host_id)
        await link.create_volume(row.id, size_mib)
    except Exception as exc:
        async with transaction(services.sessions) as session:
            await session.execute(delete(Volume).where(Volume.id == row.id))
        if isinstance(exc, hostlink.CapacityError):
            raise errors.InsufficientStorage(f"size_mib: {exc}", fields={"size_mib": str(exc)}) from None
        if isinstance(exc, hostlink.HostError):
            log.warning("volume_create_failed", volume_id=row.id, host_id=row.host_id, error=str(exc))
            raise errors.ServerError(f"the host could not make the volume: {exc}") from None
        raise
    async with transaction(services.sessions) as session:
        stored = await session.get(Volume, row.id, with_for_update=True)
        if stored is None:  # pragma: no cover - nothing deletes a volume still being made
            raise errors.NotFound("volume not found")
        stored.status = READY
        view = volume_view(stored)
        await webhooks.emit(session, user_id=user_id, action="volume.create", data=_event(stored))
    log.info("volume_created", volume_id=row.id, host_id=row.host_id, size_mib=size_mib)
    return view


async def resize(services: Services, user_id: str, ref: str, req: VolumeResizeRequest) -> dict[str, Any]:
    """Grows the volume (online when a sandbox holds it); smaller or equal is a 400."""
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        row = await get_owned(session, user_id, ref, for_update=True)
        if row.status != READY:
            raise errors.InvalidState(f"volume is {row.status}; resize needs a ready volume")
        size_mib = check_size(req.size_mib, plan.max_disk_mib, plan.name, current=row.size_mib)
        volume_id, host_id = row.id, row.host_id
        held = (await holders(session, [row.id])).get(row.id, [])
        if held and hosts.runtime_of(await session.get(Host, host_id)) in hosts.VM_RUNTIMES:
            raise hostlink.TierRefusedError(
                f"growing a volume a VM holds is not supported on the vm isolation tier: {held[0].sandbox_id}"
                " has it mounted in its own kernel, and the host grows it only while no VM holds it"
            )
    link = await hostlink.for_host(services, host_id)
    try:
        await link.resize_volume(volume_id, size_mib)
    except hostlink.CapacityError as exc:
        raise errors.InsufficientStorage(f"size_mib: {exc}", fields={"size_mib": str(exc)}) from None
    except hostlink.HostError as exc:
        raise errors.ServerError(f"the host could not grow the volume: {exc}") from None
    async with transaction(services.sessions) as session:
        row = await get_owned(session, user_id, volume_id, for_update=True)
        row.size_mib = max(row.size_mib, size_mib)
        held = (await holders(session, [row.id])).get(row.id, [])
        view = volume_view(row, held)
        await webhooks.emit(session, user_id=user_id, action="volume.resize", data=_event(row))
    log.info("volume_resized", volume_id=volume_id, size_mib=size_mib)
    return view


async def delete_volume(services: Services, user_id: str, ref: str) -> None:
    """409 while a live sandbox holds it (naming them); then its file goes from its host, then its row."""
    async with transaction(services.sessions) as session:
        await accounts.lock_user(session, user_id)
        row = await get_owned(session, user_id, ref, for_update=True)
        if row.status == CREATING:
            raise errors.InvalidState("volume is being made; delete it once it is ready")
        held = (await holders(session, [row.id])).get(row.id, [])
        if held:
            names = ", ".join(a.sandbox_id for a in held)
            raise errors.InUse(f"volume {row.name} is attached to {names}: detach it or destroy them first")
        row.status = DELETING
        volume_id, host_id = row.id, row.host_id
    try:
        link = await hostlink.for_host(services, host_id)
        await link.delete_volume(volume_id)
    except (hostlink.HostError, hostlink.TierRefusedError) as exc:
        async with transaction(services.sessions) as session:
            row = await get_owned(session, user_id, volume_id, for_update=True)
            row.status = READY
        raise errors.Unavailable(
            f"the volume's host could not remove it now: {exc}", retry_after_s=5
        ) from None
    async with transaction(services.sessions) as session:
        gone = await session.get(Volume, volume_id)
        await session.execute(delete(AttachmentRow).where(AttachmentRow.volume_id == volume_id))
        await session.execute(delete(Volume).where(Volume.id == volume_id))
        if gone is not None:
            await webhooks.emit(session, user_id=user_id, action="volume.delete", data=_event(gone))
    log.info("volume_deleted", volume_id=volume_id, host_id=host_id)


# --- attachments ---------------------------------------------------------------------------------


async def _check_free(
    session: AsyncSession, volume: Volume, *, read_only: bool, sandbox_id: str | None, field: str
) -> None:
    """One writer, or any number of readers: 409 naming the sandbox that holds it otherwise."""
    held = [a for a in (await holders(session, [volume.id])).get(volume.id, []) if a.sandbox_id != sandbox_id]
    writer = next((a for a in held if not a.read_only), None)
    if writer is not None:
        raise errors.InUse(
            f"{field}: volume {volume.name} is attached read-write to sandbox {writer.sandbox_id}",
            fields={field: f"attached read-write to {writer.sandbox_id}"},
        )
    if held and not read_only:
        raise errors.InUse(
            f"{field}: volume {volume.name} is attached read-only to sandbox {held[0].sandbox_id};"
            " a read-write attach needs it attached nowhere",
            fields={field: f"attached to {held[0].sandbox_id}"},
        )


async def _owned_ready(session: AsyncSession, user_id: str, ref: str, field: str) -> Volume:
    row = await _find(session, user_id, ref)
    if row is None:
        raise errors.NotFound(f"{field}: volume {ref!r} not found", fields={field: "not found"})
    if row.status != READY:
        raise errors.InvalidState(f"{field}: volume {row.name} is {row.status}, not ready")
    return row


async def resolve_for_create(
    session: AsyncSession,
    user_id: str,
    items: Sequence[VolumeAttachment] | None,
    disk_paths: Sequence[str] = (),
) -> list[tuple[VolumeAttachment, Volume, str]]:
    """A create's volumes, checked (fields named ``volumes[i].…``): each exists, is ready and free for
    the mode asked, named once, at a path no other volume or disk of the create overlaps, and all of
    them on one host. Returns (item, volume, normal path)."""
    out: list[tuple[VolumeAttachment, Volume, str]] = []
    paths = [path.rstrip("/") or "/" for path in disk_paths]
    for index, item in enumerate(items or []):
        where = f"volumes[{index}]."
        if not item.volume_id:
            raise errors.ValidationFailed.field(f"{where}volume_id", "must not be empty")
        path = check_mount_path(item.mount_path, f"{where}mount_path")
        for other in paths:
            if _overlaps(path, other):
                raise errors.ValidationFailed.field(f"{where}mount_path", f"overlaps {other}")
        volume = await _owned_ready(session, user_id, item.volume_id, f"{where}volume_id")
        if any(volume.id == seen.id for _, seen, _ in out):
            raise errors.ValidationFailed.field(f"{where}volume_id", "names a volume already in the list")
        await _check_free(
            session, volume, read_only=bool(item.read_only), sandbox_id=None, field=f"{where}volume_id"
        )
        paths.append(path)
        out.append((item, volume, path))
    holding = {volume.host_id for _, volume, _ in out}
    if len(holding) > 1:
        raise errors.InvalidState(
            "volumes: the volumes named are kept on different hosts ("
            + ", ".join(f"{volume.name} on {volume.host_id}" for _, volume, _ in out)
            + "); a sandbox runs on one"
        )
    return out


def host_of(resolved: Sequence[tuple[VolumeAttachment, Volume, str]], wanted: str | None) -> str | None:
    """Where a sandbox using these volumes must run (None: anywhere); 409 when ``wanted`` (its
    ``host_id``, a snapshot's or its networks' host) is another host."""
    if not resolved:
        return wanted
    _, volume, _ = resolved[0]
    if wanted is not None and wanted != volume.host_id:
        raise errors.InvalidState(
            f"volumes: volume {volume.name} is kept on host {volume.host_id}, and this sandbox would run"
            f" on {wanted}; a sandbox using a volume runs on the volume's host"
        )
    return volume.host_id


def attach_rows(
    sandbox_id: str, resolved: Sequence[tuple[VolumeAttachment, Volume, str]], now: dt.datetime
) -> list[AttachmentRow]:
    return [
        AttachmentRow(
            sandbox_id=sandbox_id,
            volume_id=volume.id,
            mount_path=path,
            read_only=bool(item.read_only),
            created_at=now,
        )
        for item, volume, path in resolved
    ]


async def drop_attachments(session: AsyncSession, sandbox_id: str) -> None:
    await session.execute(delete(AttachmentRow).where(AttachmentRow.sandbox_id == sandbox_id))


async def _held(session: AsyncSession, sandbox_id: str) -> Sequence[AttachmentRow]:
    """The volumes ``sandbox_id`` holds, by mount path (the order they are mounted and copied in)."""
    return (
        await session.scalars(
            select(AttachmentRow)
            .where(AttachmentRow.sandbox_id == sandbox_id)
            .order_by(AttachmentRow.mount_path)
        )
    ).all()


async def mount_all(services: Services, sandbox: Sandbox) -> None:
    """After a create's boot: each volume it named is mounted before the answer. A mount that fails
    raises (the caller undoes the sandbox): a sandbox without the volume it asked for would write its
    data onto its own disk and lose it."""
    async with services.sessions() as session:
        rows = await _held(session, sandbox.id)
    link = await hostlink.for_host(services, sandbox.host_id)
    for index, row in enumerate(rows):
        body = VolumeMountBody(volume_id=row.volume_id, mount_path=row.mount_path, read_only=row.read_only)
        await _mount_on_host(link, sandbox.id, body, f"volumes[{index}].mount_path")


async def before_boot(services: Services, link: hostlink.HostLink, sandbox: Sandbox) -> None:
    """Before a create's call to a host that takes volumes only at a sandbox's start (gVisor, VMs): each
    volume it named is attached to the sandbox's id there, so the host binds it into the new container
    (or gives it to the new VM as a drive).
    Other hosts mount them once it runs (``mount_all``). A refusal is the host's error (the boot fails)."""
    async with services.sessions() as session:
        host = await session.get(Host, sandbox.host_id) if sandbox.host_id else None
        if hosts.runtime_of(host) not in BOUND_AT_START:
            return
        rows = await _held(session, sandbox.id)
    for row in rows:
        body = VolumeMountBody(volume_id=row.volume_id, mount_path=row.mount_path, read_only=row.read_only)
        await link.attach_volume(sandbox.id, body)


async def refuse_copy(session: AsyncSession, sandbox: Sandbox, operation: str) -> None:
    """A 409 naming the tier when ``operation`` (a fork, a snapshot) would copy a VM that holds a volume:
    its memory has the volume mounted, so a copy would be a second writer of it."""
    host = await session.get(Host, sandbox.host_id) if sandbox.host_id else None
    if hosts.runtime_of(host) not in hosts.VM_RUNTIMES:
        return
    held = await session.scalar(
        select(func.count()).select_from(AttachmentRow).where(AttachmentRow.sandbox_id == sandbox.id)
    )
    if held:
        raise hostlink.TierRefusedError(
            f"{operation} that holds a volume is not supported on the vm isolation tier: its memory has"
            " the volume mounted (a copy would be a second writer); destroy it to free the volume"
        )


# --- a fork's copies (include_volumes) ------------------------------------------------------------

#: What a refusal on another tier says could not be done.
COPY_OPERATION = "copying a sandbox's volumes into its fork (include_volumes)"


async def plan_copies(
    session: AsyncSession, services: Services, user_id: str, plan: Any, source: Sandbox, child_id: str
) -> list[tuple[str, str]]:
    """A fork's ``include_volumes``, in the fork's transaction (the user's row locked): for each
    volume ``source`` holds, a new volume row (``creating``, the source's size, named after it) and the
    child's attachment to it at the same path and mode. Returns (source volume, copy) ids. A 409 naming
    the tier off the container tier (gVisor and VMs take volumes only when they start); a 403 when the
    copies would pass the plan's volume cap."""
    held = await _held(session, source.id)
    if not held:
        return []
    host = await session.get(Host, source.host_id) if source.host_id else None
    refusal = hosts.container_tier_refusal(
        host, COPY_OPERATION, "; fork without include_volumes, or on the container tier"
    )
    if refusal is not None:
        raise hostlink.TierRefusedError(refusal)
    cap = plans.volumes_concurrent(plan.id, plan.disks_concurrent)
    kept = int(
        await session.scalar(select(func.count()).select_from(Volume).where(Volume.user_id == user_id)) or 0
    )
    if kept + len(held) > cap:
        raise errors.QuotaExceeded(
            f"include_volumes: copies of the source's {len(held)} volume(s) would pass the volume cap"
            f" ({kept} kept, limit {cap})",
            fields={"include_volumes": f"volume cap {cap} reached"},
        )
    now = services.clock()
    out: list[tuple[str, str]] = []
    for attachment in held:
        original = await session.get(Volume, attachment.volume_id)
        if original is None or original.status != READY:
            raise errors.InvalidState(f"include_volumes: volume {attachment.volume_id} is not ready")
        copy_id = add_held_copy(
            session,
            user_id=user_id,
            sandbox_id=child_id,
            name=f"{original.name[:40]}-fork",
            host_id=original.host_id,
            size_mib=original.size_mib,
            mount_path=attachment.mount_path,
            read_only=attachment.read_only,
            now=now,
        )
        out.append((original.id, copy_id))
    return out


def add_held_copy(
    session: AsyncSession,
    *,
    user_id: str,
    sandbox_id: str,
    name: str,
    host_id: str | None,
    size_mib: int,
    mount_path: str,
    read_only: bool,
    now: dt.datetime,
) -> str:
    """The rows of a new volume copy (``creating``, named ``<name>-<12 id characters>``) held by
    ``sandbox_id`` at ``mount_path``: a fork's copy of its source's volume, or a snapshot boot's copy
    of the snapshot's (``snapshot_volumes.py``). Returns its id; the host makes it afterwards."""
    copy_id = new_id(ID_PREFIX)
    session.add(
        Volume(
            id=copy_id,
            user_id=user_id,
            name=f"{name}-{copy_id[-12:]}",
            status=CREATING,
            host_id=host_id,
            size_mib=size_mib,
            created_at=now,
        )
    )
    session.add(
        AttachmentRow(
            sandbox_id=sandbox_id,
            volume_id=copy_id,
            mount_path=mount_path,
            read_only=read_only,
            created_at=now,
        )
    )
    return copy_id


async def make_copies(
    services: Services, user_id: str, host_id: str, copies: Sequence[tuple[str, str]]
) -> None:
    """Makes each copy on the host (a clone of the source's image, its host mount frozen for it), then
    its row ``ready`` with its ``volume.create``. A failure raises; ``drop_copies`` undoes."""
    link = await hostlink.for_host(services, host_id)
    for source_id, copy_id in copies:
        try:
            await link.clone_volume(source_id, copy_id)
        except hostlink.CapacityError as exc:
            raise errors.InsufficientStorage(
                f"include_volumes: {exc}", fields={"include_volumes": str(exc)}
            ) from None
        except hostlink.HostError as exc:
            raise errors.ServerError(f"include_volumes: the host could not copy {source_id}: {exc}") from None
    async with transaction(services.sessions) as session:
        for _, copy_id in copies:
            row = await session.get(Volume, copy_id, with_for_update=True)
            if row is not None:
                row.status = READY
                await webhooks.emit(session, user_id=user_id, action="volume.create", data=_event(row))
    log.info("volumes_copied_for_fork", host_id=host_id, copies=[copy_id for _, copy_id in copies])


async def drop_copies(services: Services, host_id: str, copies: Sequence[tuple[str, str]]) -> None:
    """A fork that made no child: its copies go from the host, then their rows. A copy its host could
    not remove now stays, ``ready`` and held by nobody, for its owner to delete."""
    if not copies:
        return
    ids = [copy_id for _, copy_id in copies]
    kept: list[str] = []
    for copy_id in ids:
        try:
            link = await hostlink.for_host(services, host_id)
            await link.delete_volume(copy_id)
        except (hostlink.HostError, hostlink.TierRefusedError, errors.PaddockError) as exc:
            log.warning("volume_copy_not_removed", volume_id=copy_id, error=str(exc))
            kept.append(copy_id)
    async with transaction(services.sessions) as session:
        await session.execute(delete(AttachmentRow).where(AttachmentRow.volume_id.in_(ids)))
        await session.execute(delete(Volume).where(Volume.id.in_([i for i in ids if i not in kept])))
        for copy_id in kept:
            row = await session.get(Volume, copy_id, with_for_update=True)
            if row is not None:
                row.status = READY


# --- a snapshot's copies (include_volumes: resources/snapshot_volumes.py) -------------------------


async def held(session: AsyncSession, sandbox_id: str) -> Sequence[AttachmentRow]:
    """The volumes ``sandbox_id`` holds, by mount path: what a snapshot's ``include_volumes`` copies."""
    return await _held(session, sandbox_id)


def event(row: Volume) -> dict[str, Any]:
    """A volume's webhook data (a new volume a boot from a snapshot copied announces it)."""
    return _event(row)


async def _mount_on_host(link: hostlink.HostLink, sandbox_id: str, body: VolumeMountBody, field: str) -> None:
    try:
        await link.attach_volume(sandbox_id, body)
    except errors.ValidationFailed as exc:  # the host's refusal of the path (a link in the sandbox …)
        reason = next(iter(exc.fields.values()), str(exc)) if exc.fields else str(exc)
        raise errors.ValidationFailed.field(field, reason) from None
    except hostlink.SandboxGoneError:
        raise errors.InvalidState("sandbox is no longer running on its host") from None
    except hostlink.HostError as exc:
        raise errors.ServerError(f"mounting volume {body.volume_id} failed: {exc}") from None


async def attach(services: Services, user_id: str, sandbox_id: str, item: VolumeAttachment) -> dict[str, Any]:
    """Mounts a volume into a running or paused sandbox; answers once it is mounted."""
    if not item.volume_id:
        raise errors.ValidationFailed.field("volume_id", "must not be empty")
    path = check_mount_path(item.mount_path, "mount_path")
    read_only = bool(item.read_only)
    async with services.sessions() as session:
        status = (await queries.get_owned(session, user_id, sandbox_id)).status
    if status != SandboxStatus.PAUSED:
        await queries.running_sandbox(services, user_id, sandbox_id)  # waits out creating/resuming
    async with transaction(services.sessions) as session:
        await accounts.lock_user(session, user_id)
        sandbox = await queries.get_owned(session, user_id, sandbox_id, for_update=True)
        if sandbox.status not in ATTACHABLE:
            raise errors.InvalidState(
                f"sandbox is {sandbox.status}; attach needs a running or paused sandbox"
            )
        refusal = live_refusal(await session.get(Host, sandbox.host_id) if sandbox.host_id else None)
        if refusal is not None:
            raise hostlink.TierRefusedError(refusal)
        volume = await _owned_ready(session, user_id, item.volume_id, "volume_id")
        if volume.host_id != sandbox.host_id:
            raise errors.InvalidState(
                f"volume {volume.name} is kept on host {volume.host_id}, and sandbox {sandbox.id} runs on"
                f" {sandbox.host_id}: a sandbox using a volume runs on the volume's host"
            )
        present = (
            await session.scalars(select(AttachmentRow).where(AttachmentRow.sandbox_id == sandbox.id))
        ).all()
        if any(a.volume_id == volume.id for a in present):
            raise errors.AlreadyExists(f"volume {volume.name} is already attached to this sandbox")
        disk_paths = (
            await session.scalars(select(SandboxDisk.mount_path).where(SandboxDisk.sandbox_id == sandbox.id))
        ).all()
        for other in [a.mount_path for a in present] + list(disk_paths):
            if _overlaps(path, other):
                raise errors.ValidationFailed.field("mount_path", f"overlaps {other}, already mounted")
        await _check_free(session, volume, read_only=read_only, sandbox_id=sandbox.id, field="volume_id")
        session.add(
            AttachmentRow(
                sandbox_id=sandbox.id,
                volume_id=volume.id,
                mount_path=path,
                read_only=read_only,
                created_at=services.clock(),
            )
        )
        host_id, volume_id = str(sandbox.host_id), volume.id
    try:
        link = await hostlink.for_host(services, host_id)
        await _mount_on_host(
            link,
            sandbox_id,
            VolumeMountBody(volume_id=volume_id, mount_path=path, read_only=read_only),
            "mount_path",
        )
    except Exception:
        async with transaction(services.sessions) as session:
            await session.execute(
                delete(AttachmentRow).where(
                    AttachmentRow.sandbox_id == sandbox_id, AttachmentRow.volume_id == volume_id
                )
            )
        raise
    attached = {"id": sandbox_id, "volume_id": volume_id, "mount_path": path, "read_only": read_only}
    async with transaction(services.sessions) as session:
        await webhooks.emit(
            session,
            user_id=user_id,
            action="volume.attach",
            data={
                "volume_id": volume_id,
                "sandbox_id": sandbox_id,
                "mount_path": path,
                "read_only": read_only,
            },
        )
    log.info("volume_attached", volume_id=volume_id, sandbox_id=sandbox_id, read_only=read_only)
    return attached


async def detach(services: Services, user_id: str, sandbox_id: str, ref: str) -> None:
    """Unmounts the volume from the sandbox (when it still runs there), then forgets the attachment."""
    async with services.sessions() as session:
        sandbox = await queries.get_owned(session, user_id, sandbox_id)
        volume = await get_owned(session, user_id, ref)
        row = await session.get(AttachmentRow, (sandbox.id, volume.id))
        if row is None:
            raise errors.NotFound(f"volume {volume.name} is not attached to this sandbox")
        status, host_id, volume_id = sandbox.status, sandbox.host_id, volume.id
    if status not in TERMINAL and host_id is not None:
        link = await hostlink.for_host(services, host_id)
        try:
            await link.detach_volume(sandbox.id, volume_id)
        except hostlink.SandboxGoneError:
            pass  # gone from its host: nothing holds the volume there any more
        except hostlink.HostError as exc:
            raise errors.ServerError(f"unmounting volume {volume_id} failed: {exc}") from None
    async with transaction(services.sessions) as session:
        await session.execute(
            delete(AttachmentRow).where(
                AttachmentRow.sandbox_id == sandbox.id, AttachmentRow.volume_id == volume_id
            )
        )
        await webhooks.emit(
            session,
            user_id=user_id,
            action="volume.detach",
            data={"volume_id": volume_id, "sandbox_id": sandbox.id},
        )
    log.info("volume_detached", volume_id=volume_id, sandbox_id=sandbox.id)
