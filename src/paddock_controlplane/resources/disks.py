"""S3 disks (§10.13, §11.10, §11.11): CRUD, attachments, and the mounts the hosts make.

A disk is a bucket a user registers once; its credentials are sealed with the server key (as webhook
secrets are), sent only to the host agent that mounts it, and never shown or logged. An attachment
(``SandboxDisk``) is one disk at one path of one sandbox: ``pending`` when written, then ``mounted`` or
``error`` with the host's reason. A failed mount never fails its sandbox.

Choices: a disk is not deleted while any live sandbox holds it (409 ``IN_USE``; destroying a sandbox
removes its attachments); a fork inherits its source's attachments, mounted afresh for the child (issue
#15 asks for it; it departs from the contract's §11.9 default and breaks no client); the bucket is not
checked at registration (the mount says what is wrong, with the S3 error).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import queries
from paddock_controlplane.records.models import Disk, Host, Sandbox, SandboxDisk
from paddock_controlplane.records.queries import get_owned
from paddock_controlplane.records.schemas.disks import (
    DiskAttachment,
    DiskConfigBody,
    DiskCreateRequest,
    DiskCredentialsBody,
    DiskPatchRequest,
)
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import TERMINAL, SandboxStatus
from paddock_controlplane.resources import accounts, webhooks
from paddock_core import errors, s3config
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.logging import get_logger
from paddock_core.timeutil import rfc3339
from paddock_hostagent.schemas import DiskMountBody

log = get_logger("paddock.disks")

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
DETACHABLE = (SandboxStatus.RUNNING, SandboxStatus.PAUSED)
#: A mount still ``pending`` this long after its attachment was written lost its driver (a control
#: plane that stopped mid-mount): the reconciler asks the host again. Longer than any bounded mount.
PENDING_STALE_S = 120.0
#: Mounts this process re-drives now, so a reconciler round does not start one twice.
_redriving: set[tuple[str, str]] = set()


# --- views ---------------------------------------------------------------------------------------


def disk_view(disk: Disk) -> dict[str, Any]:
    return {
        "id": disk.id,
        "name": disk.name,
        "kind": disk.kind,
        "config": dict(disk.config),
        "created_at": rfc3339(disk.created_at),
    }


def attachment_view(attachment: SandboxDisk, disk: Disk) -> dict[str, Any]:
    out: dict[str, Any] = {
        "disk_id": disk.id,
        "name": disk.name,
        "kind": disk.kind,
        "config": dict(disk.config),
        "mount_path": attachment.mount_path,
        "mount_status": attachment.mount_status,
    }
    if attachment.sub_path:
        out["sub_path"] = attachment.sub_path
    if attachment.mount_error:
        out["mount_error"] = attachment.mount_error
    return out


# --- validation ----------------------------------------------------------------------------------


def _config(config: DiskConfigBody | None) -> dict[str, Any]:
    """The disk's settings, parsed and re-serialised (``paddock_core.s3config``): s3fs gets its options
    as one comma-separated string, so no value may carry a comma or anything else s3fs would read."""
    if config is None:
        raise errors.ValidationFailed.field("config", "required: {bucket, endpoint, region, use_path_style}")
    if not config.bucket:
        raise errors.ValidationFailed.field("config.bucket", "must not be empty")
    out: dict[str, Any] = {
        "bucket": _parsed("config.bucket", s3config.bucket, config.bucket),
        "endpoint": _parsed("config.endpoint", s3config.endpoint, config.endpoint or ""),
    }
    if config.region:
        out["region"] = _parsed("config.region", s3config.region, config.region)
    out["use_path_style"] = bool(config.use_path_style)
    return out


def _parsed(field: str, parse: Callable[[str], Any], value: str) -> Any:
    try:
        return parse(value)
    except ValueError as exc:
        raise errors.ValidationFailed.field(field, str(exc)) from None


def _credentials(credentials: DiskCredentialsBody | None) -> dict[str, str]:
    if credentials is None:
        raise errors.ValidationFailed.field("credentials", "required: {access_key, secret_key}")
    for field in ("access_key", "secret_key"):
        value = getattr(credentials, field)
        if not value:
            raise errors.ValidationFailed.field(f"credentials.{field}", "must not be empty")
        if len(value) > 1024 or any(ch in value for ch in ":\n\r\0"):
            # ':' and newlines would break s3fs's passwd file line (access:secret).
            raise errors.ValidationFailed.field(
                f"credentials.{field}", "contains a character s3fs cannot take"
            )
    return {"access_key": str(credentials.access_key), "secret_key": str(credentials.secret_key)}


async def check_endpoint(services: Services, endpoint: str, field: str) -> None:
    """The endpoint must resolve to public addresses only, unless the operator allows private ones:
    s3fs runs on the host's network, where a private address would reach the host's own services."""
    try:
        await webhooks.check_target(endpoint, allow_private=services.settings.disk_allow_private_endpoints)
    except webhooks.TargetRefused as exc:
        reason = webhooks.refusal(exc, "PADDOCK_CP_DISK_ALLOW_PRIVATE_ENDPOINTS")
        raise errors.ValidationFailed.field(field, reason) from None


def _seal(services: Services, credentials: dict[str, str]) -> str:
    return services.secret_box.seal(json.dumps(credentials))


def _open(services: Services, disk: Disk) -> dict[str, str]:
    return dict(json.loads(services.secret_box.open(disk.credentials_sealed)))


def validate_attachments(attachments: Sequence[DiskAttachment] | None, prefix: str = "disks") -> None:
    """The DiskAttachment rules (§10.13), and mount paths that neither repeat nor nest (400)."""
    seen: list[str] = []
    for index, item in enumerate(attachments or []):
        where = f"{prefix}[{index}]." if prefix else ""
        check_attachment(item, where)
        path = normal_path(item.mount_path)
        for other in seen:
            if overlaps(path, other):
                raise errors.ValidationFailed.field(f"{where}mount_path", f"overlaps {other}")
        seen.append(path)


def check_attachment(item: DiskAttachment, where: str = "") -> None:
    """A disk id, a clean absolute mount path that is not ``/`` and not under /proc, /dev or /sys (a
    detach there would unmount the sandbox's own procfs or devtmpfs), and a relative sub-folder."""
    if not item.disk_id:
        raise errors.ValidationFailed.field(f"{where}disk_id", "must not be empty")
    _parsed(f"{where}mount_path", s3config.mount_path, item.mount_path or "")
    _parsed(f"{where}sub_path", s3config.sub_path, item.sub_path or "")


def normal_path(path: str) -> str:
    return path.rstrip("/") or "/"


def overlaps(a: str, b: str) -> bool:
    """One path is the other, or lies inside it: a mount would hide or be hidden by the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


# --- reading -------------------------------------------------------------------------------------


async def get_owned_disk(session: AsyncSession, user_id: str, ref: str, *, for_update: bool = False) -> Disk:
    """The caller's live disk by exact id, else by name (§11.11); 404 otherwise."""
    for column in (Disk.id, Disk.name):
        query = select(Disk).where(column == ref, Disk.user_id == user_id, Disk.deleted_at.is_(None))
        if for_update:
            query = query.with_for_update()
        disk = (await session.scalars(query)).first()
        if disk is not None:
            return disk
    raise errors.NotFound("disk not found")


async def page(
    session: AsyncSession, user_id: str, *, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    where = (Disk.user_id == user_id, Disk.deleted_at.is_(None))
    total = await session.scalar(select(func.count()).select_from(Disk).where(*where))
    rows = (
        await session.scalars(
            select(Disk).where(*where).order_by(Disk.created_at, Disk.id).limit(limit).offset(offset)
        )
    ).all()
    return [disk_view(row) for row in rows], int(total or 0)


async def detail(session: AsyncSession, user_id: str, ref: str) -> dict[str, Any]:
    return disk_view(await get_owned_disk(session, user_id, ref))


async def sandbox_page(
    session: AsyncSession, user_id: str, sandbox_id: str, *, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    sandbox = await get_owned(session, user_id, sandbox_id)
    where = (SandboxDisk.sandbox_id == sandbox.id,)
    total = await session.scalar(select(func.count()).select_from(SandboxDisk).where(*where))
    rows = (
        await session.execute(
            select(SandboxDisk, Disk)
            .join(Disk, Disk.id == SandboxDisk.disk_id)
            .where(*where)
            .order_by(SandboxDisk.created_at, SandboxDisk.mount_path)
            .limit(limit)
            .offset(offset)
        )
    ).all()
    return [attachment_view(attachment, disk) for attachment, disk in rows], int(total or 0)


async def live_attachments(session: AsyncSession, disk_id: str) -> int:
    count = await session.scalar(
        select(func.count())
        .select_from(SandboxDisk)
        .join(Sandbox, Sandbox.id == SandboxDisk.sandbox_id)
        .where(SandboxDisk.disk_id == disk_id, Sandbox.status.not_in(TERMINAL))
    )
    return int(count or 0)


# --- create, rotate, delete ----------------------------------------------------------------------


async def create(services: Services, user_id: str, body: DiskCreateRequest) -> dict[str, Any]:
    name = body.name or ""
    if not NAME.fullmatch(name):
        raise errors.ValidationFailed.field("name", "must match ^[a-z0-9][a-z0-9-]{0,62}$")
    if body.kind != "s3":
        raise errors.ValidationFailed.field("kind", "must be s3")
    config = _config(body.config)
    credentials = _credentials(body.credentials)
    await check_endpoint(services, config["endpoint"], "config.endpoint")
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        if plan.disks_concurrent <= 0:
            raise errors.PlanLimit(f"the {plan.name} plan includes no disks")
        live = await session.scalar(
            select(func.count()).where(Disk.user_id == user_id, Disk.deleted_at.is_(None))
        )
        if int(live or 0) >= plan.disks_concurrent:
            raise errors.QuotaExceeded(f"concurrent disk cap reached: limit {plan.disks_concurrent}")
        today = await session.scalar(
            select(func.count()).where(
                Disk.user_id == user_id, Disk.created_at >= accounts.day_start(services.clock())
            )
        )
        if int(today or 0) >= plan.disks_per_day:
            raise errors.QuotaExceeded(f"daily disk cap reached: limit {plan.disks_per_day} per day")
        accounts.require_credit(account)
        taken = await session.scalar(
            select(func.count()).where(Disk.user_id == user_id, Disk.name == name, Disk.deleted_at.is_(None))
        )
        if taken:
            raise errors.AlreadyExists(f"a disk named {name!r} already exists")
        disk = Disk(
            id=new_id("disk_"),
            user_id=user_id,
            name=name,
            kind="s3",
            config=config,
            credentials_sealed=_seal(services, credentials),
            created_at=services.clock(),
        )
        session.add(disk)
        await session.flush()
        await webhooks.emit(
            session,
            user_id=user_id,
            action="disk.create",
            data={"disk_id": disk.id, "user_id": user_id, "name": name},
        )
    return disk_view(disk)


async def rotate(services: Services, user_id: str, ref: str, body: DiskPatchRequest) -> dict[str, Any]:
    """PATCH: new credentials, used by every later mount (§11.11); mounts already made keep theirs."""
    credentials = _credentials(body.credentials)
    async with transaction(services.sessions) as session:
        disk = await get_owned_disk(session, user_id, ref, for_update=True)
        disk.credentials_sealed = _seal(services, credentials)
    return disk_view(disk)


async def delete_disk(services: Services, user_id: str, ref: str) -> None:
    """409 ``IN_USE`` while a sandbox that is not destroyed holds it; the bucket is not touched."""
    async with transaction(services.sessions) as session:
        disk = await get_owned_disk(session, user_id, ref, for_update=True)
        if await live_attachments(session, disk.id):
            raise errors.InUse("disk in use: detach it or destroy the sandboxes that hold it first")
        await session.execute(delete(SandboxDisk).where(SandboxDisk.disk_id == disk.id))
        disk.deleted_at = services.clock()
        await webhooks.emit(
            session,
            user_id=user_id,
            action="disk.delete",
            data={"disk_id": disk.id, "user_id": user_id, "name": disk.name},
        )


# --- attachments ---------------------------------------------------------------------------------


async def resolve_attachments(
    session: AsyncSession, user_id: str, attachments: Sequence[DiskAttachment] | None
) -> list[tuple[DiskAttachment, Disk]]:
    """The disks a create names (ids or names), each with its attachment; 404 naming the field."""
    out: list[tuple[DiskAttachment, Disk]] = []
    for index, item in enumerate(attachments or []):
        try:
            out.append((item, await get_owned_disk(session, user_id, item.disk_id)))
        except errors.NotFound:
            field = f"disks[{index}].disk_id"
            raise errors.NotFound(
                f"{field}: disk {item.disk_id!r} not found", fields={field: "not found"}
            ) from None
    return out


def attach_rows(
    sandbox_id: str, resolved: Sequence[tuple[DiskAttachment, Disk]], now: Any
) -> list[SandboxDisk]:
    return [
        SandboxDisk(
            sandbox_id=sandbox_id,
            mount_path=normal_path(item.mount_path),
            disk_id=disk.id,
            sub_path=s3config.sub_path(item.sub_path),
            mount_status="pending",
            created_at=now,
        )
        for item, disk in resolved
    ]


def _event(attachment: SandboxDisk, sandbox: Sandbox) -> dict[str, Any]:
    return {
        "disk_id": attachment.disk_id,
        "sandbox_id": sandbox.id,
        "user_id": sandbox.user_id,
        "mount_path": attachment.mount_path,
    }


async def attach(services: Services, user_id: str, sandbox_id: str, item: DiskAttachment) -> dict[str, Any]:
    """Attach a disk to a running sandbox (§11.10): answers ``pending``; the mount goes on in the
    background and ends ``mounted`` or ``error``."""
    check_attachment(item)
    async with services.sessions() as session:
        await get_owned(session, user_id, sandbox_id)
        try:
            await get_owned_disk(session, user_id, item.disk_id)
        except errors.NotFound:
            raise errors.NotFound(
                f"disk_id: disk {item.disk_id!r} not found", fields={"disk_id": "not found"}
            ) from None
    await queries.running_sandbox(services, user_id, sandbox_id)  # waits out creating/resuming
    path = normal_path(item.mount_path)
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if sandbox.status != SandboxStatus.RUNNING:
            raise errors.InvalidState(f"sandbox is {sandbox.status}; attach needs a running sandbox")
        await hostlink.check_tier(session, sandbox.host_id, hostlink.S3_DISKS)  # mounted after the answer
        if await _isolation(session, sandbox.host_id) == "gvisor":
            raise hostlink.TierRefusedError(GVISOR_LIVE)
        disk = await get_owned_disk(session, user_id, item.disk_id)
        present = (
            await session.scalars(select(SandboxDisk.mount_path).where(SandboxDisk.sandbox_id == sandbox.id))
        ).all()
        if path in present:
            raise errors.AlreadyExists(f"mount_path {path} is already in use on this sandbox")
        for other in present:
            if overlaps(path, other):
                raise errors.ValidationFailed.field("mount_path", f"overlaps {other}, already mounted")
        (attachment,) = attach_rows(sandbox.id, [(item, disk)], services.clock())
        session.add(attachment)
        await session.flush()
        await webhooks.emit(session, user_id=user_id, action="disk.attach", data=_event(attachment, sandbox))
    services.tasks.spawn(mount(services, sandbox.id, path), name=f"mount {sandbox.id} {path}")
    return {"id": sandbox.id, "ok": True, "disk_id": disk.id, "mount_path": path, "mount_status": "pending"}


async def mount(services: Services, sandbox_id: str, mount_path: str) -> str:
    """Ask the sandbox's host to mount a ``pending`` attachment; record and return its outcome."""
    async with services.sessions() as session:
        row = (
            await session.execute(
                select(SandboxDisk, Disk, Sandbox)
                .join(Disk, Disk.id == SandboxDisk.disk_id)
                .join(Sandbox, Sandbox.id == SandboxDisk.sandbox_id)
                .where(SandboxDisk.sandbox_id == sandbox_id, SandboxDisk.mount_path == mount_path)
            )
        ).first()
    if row is None:
        return "gone"
    attachment, disk, sandbox = row
    credentials = _open(services, disk)
    body = await _mount_body(services, attachment, disk, credentials)
    if isinstance(body, str):
        return await _record(services, sandbox_id, mount_path, disk.id, "error", body)
    status, error = "error", None
    try:
        link = await hostlink.for_host(services, sandbox.host_id)
        outcome = await link.attach_disk(sandbox.id, body)
        status, error = outcome.status, outcome.error
    except hostlink.SandboxGoneError:
        error = "the sandbox is no longer on its host"
    except (hostlink.HostError, errors.PaddockError) as exc:
        error = f"the host could not mount the disk: {exc}"
    if error:
        error = error.replace(credentials["secret_key"], "***").replace(credentials["access_key"], "***")[
            :500
        ]
    recorded = await _record(services, sandbox_id, mount_path, disk.id, status, error)
    if recorded == "gone" and status == "mounted":
        # Detached while the host was mounting (the detach found nothing to unmount yet): undo it.
        try:
            await (await hostlink.for_host(services, sandbox.host_id)).detach_disk(sandbox_id, mount_path)
        except (hostlink.HostError, hostlink.SandboxGoneError) as exc:
            log.warning("disk_undo_failed", sandbox_id=sandbox_id, mount_path=mount_path, error=str(exc))
    return recorded


async def _mount_body(
    services: Services, attachment: SandboxDisk, disk: Disk, credentials: dict[str, str]
) -> DiskMountBody | str:
    """What the host is sent to mount ``attachment``; the reason when the disk is refused."""
    try:  # again at mount time: a disk registered before today's rules may hold a bad field, and a
        # name may resolve elsewhere now than at registration
        config = _config(DiskConfigBody.model_validate(disk.config))
        _parsed("mount_path", s3config.mount_path, attachment.mount_path)
        await check_endpoint(services, config["endpoint"], "config.endpoint")
    except errors.ValidationFailed as exc:
        return f"disk refused: {exc}"
    return DiskMountBody(
        disk_id=disk.id,
        mount_path=attachment.mount_path,
        sub_path=attachment.sub_path,
        bucket=config["bucket"],
        endpoint=config["endpoint"],
        region=config.get("region"),
        use_path_style=bool(disk.config.get("use_path_style")),
        access_key=credentials["access_key"],
        secret_key=credentials["secret_key"],
    )


#: gVisor's refusal of a live attach (its host's 409 says the same).
GVISOR_LIVE = (
    "mounting an S3 disk into a running sandbox is not supported on the gvisor isolation tier: gVisor "
    "binds host directories only when the sandbox starts; name the disk in the sandbox's create"
)


async def _isolation(session: AsyncSession, host_id: str | None) -> str | None:
    host = await session.get(Host, host_id) if host_id else None
    return (host.labels or {}).get("paddock.io/isolation") if host is not None else None


async def boot_mounts(services: Services, sandbox: Sandbox) -> list[DiskMountBody]:
    """The disks a create named, with their credentials, for its host's create call when the host's
    tier binds disks only at the sandbox's start (gVisor; empty elsewhere: they are mounted once it
    runs). ``mount_all`` then records each outcome the host reached at the boot. A disk refused here is
    left out, and refused again by ``mount`` with its reason."""
    async with services.sessions() as session:
        if await _isolation(session, sandbox.host_id) != "gvisor":
            return []
        rows = (
            await session.execute(
                select(SandboxDisk, Disk)
                .join(Disk, Disk.id == SandboxDisk.disk_id)
                .where(SandboxDisk.sandbox_id == sandbox.id, SandboxDisk.mount_status == "pending")
            )
        ).all()
    bodies = []
    for attachment, disk in rows:
        body = await _mount_body(services, attachment, disk, _open(services, disk))
        if not isinstance(body, str):
            bodies.append(body)
    return bodies


async def _record(
    services: Services, sandbox_id: str, mount_path: str, disk_id: str, status: str, error: str | None
) -> str:
    """Write a mount's outcome on its attachment; ``gone`` when it was detached or destroyed meanwhile."""
    async with transaction(services.sessions) as session:
        current = await session.get(SandboxDisk, (sandbox_id, mount_path), with_for_update=True)
        if current is None or current.disk_id != disk_id:
            return "gone"
        current.mount_status, current.mount_error = status, error
    log.info("disk_mount_settled", sandbox_id=sandbox_id, disk_id=disk_id, mount_status=status)
    return status


async def mount_all(services: Services, sandbox: Sandbox) -> None:
    """The attachments a create named, mounted once the sandbox booted, together (each one bounded by
    its host); a mount that fails is recorded on its attachment and the sandbox goes on."""
    async with services.sessions() as session:
        paths = (
            await session.scalars(
                select(SandboxDisk.mount_path).where(
                    SandboxDisk.sandbox_id == sandbox.id, SandboxDisk.mount_status == "pending"
                )
            )
        ).all()
    if paths:
        await asyncio.gather(*(mount(services, sandbox.id, path) for path in paths))


async def detach(
    services: Services, user_id: str, sandbox_id: str, disk_id: str, mount_path: str | None
) -> None:
    """Detach by ``disk_<ulid>`` and mount path (§11.10); running or paused; the bucket is untouched."""
    if not mount_path:
        raise errors.ValidationFailed.field("mount_path", "required: the path the disk is mounted at")
    path = _parsed("mount_path", s3config.mount_path, mount_path)
    async with services.sessions() as session:
        sandbox = await get_owned(session, user_id, sandbox_id)
        attachment = await session.get(SandboxDisk, (sandbox.id, path))
        if attachment is None or attachment.disk_id != disk_id:
            raise errors.NotFound("no such disk is attached at this mount_path")
        if sandbox.status not in DETACHABLE:
            raise errors.InvalidState(
                f"sandbox is {sandbox.status}; detach needs a running or paused sandbox"
            )
    try:
        link = await hostlink.for_host(services, sandbox.host_id)
        await link.detach_disk(sandbox.id, path)
    except hostlink.SandboxGoneError:
        pass  # nothing left on the host to unmount
    except hostlink.HostError as exc:
        raise errors.ServerError(f"detaching the disk failed on the host: {exc}") from None
    async with transaction(services.sessions) as session:
        current = await session.get(SandboxDisk, (sandbox.id, path), with_for_update=True)
        if current is None:
            return  # a concurrent detach or destroy got there first
        await session.delete(current)
        await webhooks.emit(session, user_id=user_id, action="disk.detach", data=_event(current, sandbox))


async def settle_pending(session: AsyncSession, services: Services) -> None:
    """Reconciler pass: attachments left ``pending`` by a process that stopped are mounted again (the
    host's attach is idempotent for the same disk and path)."""
    cutoff = services.clock() - dt.timedelta(seconds=PENDING_STALE_S)
    rows = (
        await session.execute(
            select(SandboxDisk.sandbox_id, SandboxDisk.mount_path)
            .join(Sandbox, Sandbox.id == SandboxDisk.sandbox_id)
            .where(
                SandboxDisk.mount_status == "pending",
                SandboxDisk.created_at < cutoff,
                Sandbox.status.in_(DETACHABLE),
            )
        )
    ).all()
    for sandbox_id, mount_path in rows:
        key = (sandbox_id, mount_path)
        if key in _redriving:
            continue
        _redriving.add(key)
        services.tasks.spawn(
            _redrive(services, sandbox_id, mount_path), name=f"remount {sandbox_id} {mount_path}"
        )


async def _redrive(services: Services, sandbox_id: str, mount_path: str) -> None:
    try:
        log.info("disk_mount_redriven", sandbox_id=sandbox_id, mount_path=mount_path)
        await mount(services, sandbox_id, mount_path)
    finally:
        _redriving.discard((sandbox_id, mount_path))


#: The attachments a fork's child inherits. Built once: every fork asks it, mostly of a source with
#: none, and building and keying the statement per call was half its CPU (0.11 against 0.06 ms).
_INHERITED = select(SandboxDisk).where(
    SandboxDisk.sandbox_id == bindparam("source_id"), SandboxDisk.mount_status != "error"
)


async def inherit(session: AsyncSession, source: Sandbox, child: Sandbox) -> int:
    """A fork's child gets its source's attachments as ``pending`` rows (the caller holds both rows);
    a mount the source could not make is not repeated. Returns how many it got."""
    rows = (await session.scalars(_INHERITED, {"source_id": source.id})).all()
    for row in rows:
        copy = SandboxDisk(
            sandbox_id=child.id,
            mount_path=row.mount_path,
            disk_id=row.disk_id,
            sub_path=row.sub_path,
            mount_status="pending",
            created_at=child.created_at,
        )
        session.add(copy)
        await webhooks.emit(session, user_id=child.user_id, action="disk.attach", data=_event(copy, child))
    return len(rows)


async def drop_attachments(session: AsyncSession, sandbox_id: str) -> None:
    """The sandbox became terminal (or never existed): its attachments end (§11.8); its host unmounts
    them when it removes the sandbox."""
    await session.execute(delete(SandboxDisk).where(SandboxDisk.sandbox_id == sandbox_id))
