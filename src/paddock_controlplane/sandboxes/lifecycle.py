"""Sandbox lifecycle: create, destroy, pause, resume, fork, resize (§11.3, §11.8, §11.9, §13).

Each operation writes its state change (and its webhook event) in one transaction, talks to the host
outside any transaction, then records the outcome in a second transaction. A process that dies in
between leaves a transitional status that the reconciler settles.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import difflib
import functools
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, hosts, scheduler
from paddock_controlplane.records import app_ports, validation
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.schemas.sandboxes import CreateSandboxRequest, ForkSandboxRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.snapshots import ID_PREFIX as SNAPSHOT_PREFIX
from paddock_controlplane.records.snapshots import Snapshot
from paddock_controlplane.records.states import ALL, FORKABLE, TERMINAL, SandboxStatus
from paddock_controlplane.records.views import event_data
from paddock_controlplane.resources import (
    accounts,
    catalog,
    disks,
    networks,
    snapshot_volumes,
    snapshots,
    templates,
    volumes,
    webhooks,
)
from paddock_controlplane.sandboxes import destruction, envs, names, suspension
from paddock_controlplane.sandboxes.transition import locked_row, settle
from paddock_core import errors
from paddock_core.db import transaction, transaction_connection
from paddock_core.ids import new_id
from paddock_core.logging import get_logger
from paddock_core.rootfs import ROOT_IMAGES_BY_NAME

log = get_logger("paddock.lifecycle")

DEFAULT_BANDWIDTH_QUOTA_BYTES = 5 * 1024**3

#: A fork's child row (built once: building and keying a statement costs about what SQLite takes to run it).
_INSERT_SANDBOX = insert(cast(Table, Sandbox.__table__))


#: A sandbox's lifetime (``timeout_s``) is at most a day (E2B's ceiling too); what happens when it
#: passes (``on_timeout``) is ``destroy`` unless ``pause`` (frozen) or ``hibernate`` (docs/hibernation.md)
#: is asked.
MAX_TIMEOUT_S = 24 * 3600
ON_TIMEOUT = ("destroy", "pause", "hibernate")
#: What the idle auto-pause does (``on_idle``): a frozen pause (also when unset) or a hibernation.
ON_IDLE = ("pause", "hibernate")
#: Bounds on a sandbox's ``metadata`` (isolation rule 5: every input a tenant controls is bounded).
MAX_METADATA_KEYS = 64
MAX_METADATA_KEY_BYTES = 256
MAX_METADATA_VALUE_BYTES = 4096


def lifetime(
    timeout_s: int | None, on_timeout: str | None, *, field: str = "timeout_s"
) -> tuple[int | None, str | None]:
    """``(timeout_s, on_timeout)`` checked, or ``(None, None)`` for no lifetime (``timeout_s`` 0 or
    unset); a 400 names the field that breaks a rule."""
    if on_timeout is not None and on_timeout not in ON_TIMEOUT:
        raise errors.ValidationFailed.field("on_timeout", "must be destroy, pause or hibernate")
    if not timeout_s:
        if on_timeout is not None:
            raise errors.ValidationFailed.field("on_timeout", f"needs {field}")
        return None, None
    if not 1 <= timeout_s <= MAX_TIMEOUT_S:
        raise errors.ValidationFailed.field(field, f"must be between 1 and {MAX_TIMEOUT_S} seconds (0: none)")
    return timeout_s, on_timeout or "destroy"


def check_on_idle(on_idle: str | None) -> str | None:
    if on_idle is not None and on_idle not in ON_IDLE:
        raise errors.ValidationFailed.field("on_idle", "must be pause or hibernate")
    return on_idle


def hibernating_fields(on_timeout: str | None, on_idle: str | None) -> list[str]:
    """The fields of a create, timeout or PATCH that ask the sandbox's host to hibernate it."""
    asked = (("on_timeout", on_timeout), ("on_idle", on_idle))
    return [field for field, value in asked if value == "hibernate"]


def check_metadata(metadata: dict[str, str] | None, field: str = "metadata") -> dict[str, str]:
    """The metadata as given, or a 400 naming the field that breaks a bound."""
    metadata = metadata or {}
    if len(metadata) > MAX_METADATA_KEYS:
        raise errors.ValidationFailed.field(field, f"at most {MAX_METADATA_KEYS} keys")
    for key, value in metadata.items():
        if not key or len(key.encode()) > MAX_METADATA_KEY_BYTES:
            raise errors.ValidationFailed.field(field, f"keys must be 1 to {MAX_METADATA_KEY_BYTES} bytes")
        if len(value.encode()) > MAX_METADATA_VALUE_BYTES:
            raise errors.ValidationFailed.field(f"{field}.{key}", f"at most {MAX_METADATA_VALUE_BYTES} bytes")
    return dict(metadata)


def end_of(now: dt.datetime, timeout_s: int | None) -> dt.datetime | None:
    return now + dt.timedelta(seconds=timeout_s) if timeout_s else None


class HostFullError(Exception):
    """A host refused a new sandbox for lack of room (its 507), or, ``unsupported``, because its
    isolation tier does not offer what the create asked (private networks on a VM host); nothing of
    the sandbox exists there."""

    def __init__(self, host_id: str, reason: str, *, unsupported: bool = False) -> None:
        super().__init__(reason)
        self.host_id = host_id
        self.reason = reason
        self.unsupported = unsupported


@dataclass(frozen=True)
class Placement:
    """What a create asked of its host, kept to place it again when a host refuses it."""

    mem_mib: int
    rootfs: str
    host_id: str | None
    node_selector: dict[str, str]
    #: A template's image: a host without it fetches it from one that has it (holders first).
    fetchable: bool = False


@dataclass
class CreatePlan:
    """A validated, resolved create request."""

    shape: catalog.Shape
    rootfs: str
    name: str | None
    disk_mib: int
    egress: list[str]
    envs: dict[str, str]
    ssh_pubkeys: list[str]
    host_id: str | None
    node_selector: dict[str, str]
    ingress_enabled: bool
    auto_pause_after_seconds: int | None
    start_paused: bool
    timeout_s: int | None = None
    on_timeout: str | None = None
    on_idle: str | None = None
    metadata: dict[str, str] | None = None
    ingress_host_header: str | None = None
    ingress_https_ports: list[int] | None = None
    #: The request named ``disk_mib`` (otherwise the shape's default, which a snapshot's disk may raise).
    explicit_disk: bool = False


def validate_create(req: CreateSandboxRequest, region: str) -> CreatePlan:
    shape = catalog.SHAPES_BY_ID.get(req.shape)
    if shape is None:
        hint = suggestion(req.shape, catalog.SHAPES_BY_ID)
        raise errors.ValidationFailed.field("shape", f"unknown shape {req.shape!r}{hint}; see GET /v1/shapes")
    name = validation.sandbox_name(req.name) if req.name else None
    disk_mib = req.disk_mib or shape.default_disk_mib
    if disk_mib < validation.MIN_DISK_MIB:
        raise errors.ValidationFailed.field("disk_mib", f"must be 0 or at least {validation.MIN_DISK_MIB}")
    auto_pause = validation.auto_pause_seconds(req.auto_pause_after_seconds)
    timeout_s, on_timeout = lifetime(req.timeout_s, req.on_timeout)
    disks.validate_attachments(req.disks)
    for index, net in enumerate(req.networks or []):
        if not net.id:
            raise errors.ValidationFailed.field(f"networks[{index}].id", "must not be empty")
    if req.bandwidth_quota_bytes:
        raise errors.ValidationFailed.field(
            "bandwidth_quota_bytes", "cannot be set at create; use bandwidth/recharge"
        )
    if req.region and req.region not in ("eu", "us"):
        raise errors.ValidationFailed.field("region", "must be eu or us")
    plan = CreatePlan(
        shape=shape,
        rootfs=req.rootfs or "",
        name=name,
        disk_mib=disk_mib,
        egress=validation.egress_rules(req.egress),
        envs=validation.envs(req.envs),
        ssh_pubkeys=validation.ssh_pubkeys(req.ssh_pubkeys),
        host_id=req.host_id or None,
        node_selector=dict(req.node_selector or {}),
        ingress_enabled=bool(req.ingress_enabled),
        auto_pause_after_seconds=auto_pause,
        start_paused=bool(req.start_paused),
        timeout_s=timeout_s,
        on_timeout=on_timeout,
        on_idle=check_on_idle(req.on_idle),
        metadata=check_metadata(req.metadata) or None,
        ingress_host_header=app_ports.host_header(req.ingress_host_header),
        ingress_https_ports=app_ports.https_ports(req.ingress_https_ports) or None,
        explicit_disk=bool(req.disk_mib),
    )
    if req.region and req.region != region:
        raise errors.RegionMismatch(f"region {req.region!r} does not match this server's region {region!r}")
    return plan


async def resolve_rootfs(
    session: AsyncSession, services: Services, user_id: str, requested: str
) -> tuple[str, str | None]:
    """The image to boot and, for a template, the host that holds it (§11.1 order: a catalog name,
    then the caller's template by id, then by name; a template not ``ready`` is 409)."""
    available = await hosts.available_images(session)
    default = catalog.rootfs_view(available, services.settings.default_rootfs)["default"]
    name = requested or default
    if name in ROOT_IMAGES_BY_NAME and (name in available or (not requested and name == default)):
        return name, None
    template = await templates.resolve(session, user_id, requested) if requested else None
    if template is not None:
        return template.id, template.host_id
    hint = suggestion(requested, [n for n in ROOT_IMAGES_BY_NAME if n in available])
    raise errors.ValidationFailed.field("rootfs", f"unknown image {requested!r}{hint}; see GET /v1/rootfs")


async def _snapshot_of(session: AsyncSession, user_id: str, spec: CreatePlan) -> Snapshot | None:
    """The caller's snapshot ``rootfs`` names (its id, or a name no image or template has), whose disk
    the new sandbox boots from; its disk is at least the snapshot's (``disk_mib`` smaller is a 400)."""
    requested = spec.rootfs
    if not requested or requested in ROOT_IMAGES_BY_NAME:
        return None
    if not requested.startswith(SNAPSHOT_PREFIX) and await templates.find(session, user_id, requested):
        return None
    snapshot = await snapshots.resolve(session, user_id, requested)
    if snapshot is None:
        return None
    if spec.disk_mib < snapshot.disk_mib:
        if spec.explicit_disk:
            raise errors.ValidationFailed.field(
                "disk_mib", f"must be at least the snapshot's disk, {snapshot.disk_mib} MiB"
            )
        spec.disk_mib = snapshot.disk_mib
    if hosts.runtime_of(await session.get(Host, snapshot.host_id)) in hosts.VM_RUNTIMES:
        # A VM's memory is restored into the machine it was saved from: the same vCPUs and memory, so
        # the host reserves what the VM will really hold, and the bill says the same.
        source = await session.get(Sandbox, snapshot.source_sandbox_id)
        if source is not None and (source.vcpu, source.mem_mib) != (spec.shape.vcpu, spec.shape.mem_mib):
            raise errors.ValidationFailed.field(
                "shape",
                f"a VM snapshot boots with its source's vCPUs and memory: use shape {source.shape!r}",
            )
    return snapshot


def suggestion(given: str, choices: Iterable[str]) -> str:
    """``" (did you mean 's-1vcpu-1gb'?)"`` for the closest choice, or ``""``."""
    close = difflib.get_close_matches(given[:200], list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: What a create checks under its account's lock, in one trip (each trip there holds up the account's
#: next create): its two caps' counts, whether its name is taken (and a numbered one, ``names.draw``)
#: and, on PostgreSQL, the placement lock, which its placement then holds. The counts and the names are
#: read from the statement's start, before any wait for the placement lock: the account's lock, already
#: held, is what keeps them true.
_CHECKS = select(accounts.LIVE_COUNT, accounts.CREATED_SINCE, names.TAKEN, names.TAKEN_ALSO)
_CHECKS_BY_DIALECT = {"postgresql": _CHECKS.add_columns(scheduler.PLACEMENT_LOCK_COLUMN)}


@dataclass(frozen=True)
class Admitted:
    """A create's row, written (``creating``), and what its boot needs to know of the request."""

    sandbox: Sandbox
    placement: Placement
    joined: bool = False
    with_disks: bool = False
    with_volumes: bool = False
    #: Volumes a snapshot that keeps them is copied into (``snapshot_volumes.plan_boot``).
    copies: Sequence[tuple[str, str]] = ()


async def create(services: Services, user_id: str, req: CreateSandboxRequest) -> Sandbox:
    spec = validate_create(req, services.settings.region)
    admitted: Admitted | None = None
    if not (req.networks or req.disks or req.volumes):
        # With others of its account that arrive meanwhile (``_admit_group``); alone when it boots from
        # a snapshot (None).
        admitted = await services.create_groups.submit(
            user_id, spec, functools.partial(_admit_group, services)
        )
    if admitted is None:
        admitted = await _admit(services, user_id, spec, req)
    sandbox, placement = admitted.sandbox, admitted.placement
    refused: dict[str, str] = {}
    unsupported: set[str] = set()  # hosts whose tier cannot do what the create asked
    try:
        while True:  # ends: every refusal excludes one more host
            try:
                booted = await boot(
                    services,
                    sandbox,
                    start_paused=spec.start_paused,
                    joined=admitted.joined,
                    with_disks=admitted.with_disks,
                    with_volumes=admitted.with_volumes,
                )
            except HostFullError as full:
                log.info("sandbox_host_full", sandbox_id=sandbox.id, host_id=full.host_id, reason=full.reason)
                refused[full.host_id] = full.reason
                if full.unsupported:
                    unsupported.add(full.host_id)
                sandbox = await _place_elsewhere(services, sandbox, placement, refused, unsupported)
                continue
            # The disks it named are mounted once it runs, before the answer; a failed mount is reported
            # on its attachment (``mount_status``) and never fails the create. A create that named none
            # has none (a disk is attached later only to a running sandbox): no read to find out.
            if admitted.with_disks:
                await disks.mount_all(services, booted)
            if admitted.with_volumes or admitted.copies:
                await _mount_volumes(services, user_id, booted, admitted.copies)
            return booted
    except Exception:
        # None kept by a failed create.
        await volumes.drop_copies(services, str(sandbox.host_id), admitted.copies)
        raise


async def _admit(services: Services, user_id: str, spec: CreatePlan, req: CreateSandboxRequest) -> Admitted:
    """One create's admission, in a transaction of its own: what names networks, disks or volumes, or
    boots from a snapshot."""
    async with transaction(services.sessions) as session:
        # What the image is, before the account's lock: reads no other create of this account can
        # change, and each statement held under the lock holds up the account's next create (on
        # PostgreSQL; SQLite's transaction holds the whole file from its start either way).
        snapshot = await _snapshot_of(session, user_id, spec)  # may raise ``disk_mib`` to its disk's
        if snapshot is not None:
            # Booted from a clone of the snapshot: on the host that keeps it while it has room, else
            # on another, which fetches it first (``snapshots.boot_host``, ``snapshots.ensure_on_host``).
            rootfs, image_host, image = snapshot.id, None, snapshot.image
        else:
            rootfs, image_host = await resolve_rootfs(session, services, user_id, spec.rootfs)
            image = rootfs
        account = await accounts.lock_user(session, user_id)
        joined = await networks.resolve_refs(session, user_id, req.networks)
        attached = await disks.resolve_attachments(session, user_id, req.disks)
        # Local volumes (issue #34): each ready and free for the mode asked, all on one host.
        mounted = await volumes.resolve_for_create(
            session, user_id, req.volumes, [item.mount_path for item in req.disks or []]
        )
        plan = await accounts.cached_plan(session, account.plan_id)
        accounts.check_plan_limits(
            plan,
            vcpu=spec.shape.vcpu,
            mem_mib=spec.shape.mem_mib,
            disk_mib=spec.disk_mib,
            wants_disks=bool(attached),
        )
        drawn = _drawn(spec)
        live, today, taken = await _checks(session, services, user_id, drawn)
        accounts.refuse_over_caps(plan, live=None if spec.start_paused else live, today=today)
        accounts.require_credit(account)
        name = await _name(session, user_id, spec.name, drawn, taken)
        host_id = await networks.placement(session, joined, spec.host_id)
        if snapshot is not None:
            host_id = await snapshots.boot_host(
                session, services, snapshot, host_id, mem_mib=spec.shape.mem_mib
            )
        host_id = volumes.host_of(mounted, host_id)  # a sandbox using a volume runs on its host
        placement = Placement(
            mem_mib=spec.shape.mem_mib,
            rootfs=image,
            host_id=host_id,
            node_selector=spec.node_selector,
            fetchable=image_host is not None
            or (snapshot is not None and snapshots.image_fetchable(snapshot)),
        )
        chosen = await _pick(session, services, placement, refused=(), lock_held=True)
        for field in hibernating_fields(spec.on_timeout, spec.on_idle):
            suspension.require_hibernating_host(await session.get(Host, chosen), field)
        sandbox = _new_row(services, user_id, spec, name=name, host_id=chosen, rootfs=rootfs)
        session.add(sandbox)
        await session.flush()
        for network in joined:
            await networks.join(session, network, sandbox.id)
        session.add_all(disks.attach_rows(sandbox.id, attached, services.clock()))
        session.add_all(volumes.attach_rows(sandbox.id, mounted, services.clock()))
        # A snapshot that keeps volumes (include_volumes): a new volume copied from each (issue #34).
        copies = (
            await snapshot_volumes.plan_boot(
                session,
                services,
                user_id,
                plan,
                snapshot,
                sandbox.id,
                [p for _, _, p in mounted] + [item.mount_path for item in req.disks or []],
            )
            if snapshot is not None
            else []
        )
    return Admitted(
        sandbox,
        placement,
        joined=bool(joined),
        with_disks=bool(attached),
        with_volumes=bool(mounted),
        copies=copies,
    )


async def _admit_group(
    services: Services, user_id: str, specs: Sequence[CreatePlan]
) -> list[Admitted | BaseException | None]:
    """Creates of one account that arrived together (naming no network, disk or volume), admitted in
    one transaction (``paddock_core.group_commit``): its account's lock, the checks, each placement and
    the rows' insert, each once for the group. One create holds its account's lock for ~8 round trips,
    and the account's next create waits for all of them (docs/performance.md, "PostgreSQL creates").

    Each member is judged as if the others before it had committed alone: the caps count them, their
    names are taken, their memory is placed (``scheduler.Tally``). A member refused (its image, its
    plan, a cap, its name, no host for it) gets its own error and the rest go on; what fails the
    transaction fails them all. None: a member that boots from a snapshot, admitted alone (``_admit``).
    """
    outcomes: list[Admitted | BaseException | None] = [None] * len(specs)
    images: dict[int, tuple[str, str | None]] = {}
    # Each image asked once per group (a read of every host's image lists): a burst mostly asks one.
    resolved: dict[str, tuple[str, str | None]] = {}
    async with transaction(services.sessions) as session:
        for index, spec in enumerate(specs):  # before the account's lock, as ``_admit`` does
            try:
                if await _snapshot_of(session, user_id, spec) is None:
                    if spec.rootfs not in resolved:
                        resolved[spec.rootfs] = await resolve_rootfs(session, services, user_id, spec.rootfs)
                    images[index] = resolved[spec.rootfs]
            except errors.PaddockError as exc:
                outcomes[index] = exc
        if not images:
            return outcomes
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        drawn = {i: _drawn(specs[i]) for i in images}
        first, *others = images
        live, today, taken = await _checks(session, services, user_id, drawn[first])
        taken |= await names.taken_among(session, user_id, [name for i in others for name in drawn[i]])
        tally = scheduler.Tally()
        rows: list[Sandbox] = []
        for index, (rootfs, image_host) in images.items():
            spec = specs[index]
            try:
                accounts.check_plan_limits(
                    plan,
                    vcpu=spec.shape.vcpu,
                    mem_mib=spec.shape.mem_mib,
                    disk_mib=spec.disk_mib,
                    wants_disks=False,
                )
                admitted = len(rows)  # each counts toward both caps: ``creating`` is live
                accounts.refuse_over_caps(
                    plan, live=None if spec.start_paused else live + admitted, today=today + admitted
                )
                accounts.require_credit(account)
                name = await _name(session, user_id, spec.name, drawn[index], taken)
                placement = Placement(
                    mem_mib=spec.shape.mem_mib,
                    rootfs=rootfs,
                    host_id=spec.host_id,
                    node_selector=spec.node_selector,
                    fetchable=image_host is not None,
                )
                chosen = await _pick(session, services, placement, refused=(), lock_held=True, tally=tally)
                for field in hibernating_fields(spec.on_timeout, spec.on_idle):
                    suspension.require_hibernating_host(await session.get(Host, chosen), field)
            except errors.PaddockError as exc:
                outcomes[index] = exc
                continue
            tally.place(chosen, spec.shape.mem_mib)
            taken.add(name)
            row = _new_row(services, user_id, spec, name=name, host_id=chosen, rootfs=rootfs)
            rows.append(row)
            outcomes[index] = Admitted(row, placement)
        session.add_all(rows)  # one statement for the group
    return outcomes


async def _checks(
    session: AsyncSession, services: Services, user_id: str, drawn: tuple[str, str]
) -> tuple[int, int, set[str]]:
    """What a create checks under its account's lock, in one trip (``_CHECKS``): the live and today's
    counts, and which of the two names drawn are taken. On PostgreSQL it also takes the placement lock."""
    checks = _CHECKS_BY_DIALECT.get(session.get_bind().dialect.name, _CHECKS)
    params = {
        "user_id": user_id,
        "since": accounts.day_start(services.clock()),
        "name": drawn[0],
        "name_also": drawn[1],
    }
    live, today, plain_taken, numbered_taken = (await session.execute(checks, params)).one()[:4]
    taken = {name for name, is_taken in zip(drawn, (plain_taken, numbered_taken), strict=True) if is_taken}
    return int(live), int(today), taken


def _drawn(spec: CreatePlan) -> tuple[str, str]:
    """The two names a create checks: the one it asked for (twice), else two drawn (``names.draw``)."""
    return (spec.name, spec.name) if spec.name else names.draw()


async def _name(
    session: AsyncSession, user_id: str, asked: str | None, drawn: tuple[str, str], taken: Collection[str]
) -> str:
    """The name asked (409 if ``taken``), else the first of the two drawn not ``taken``, else a new one.
    ``taken`` holds what the checks found and, in a group, the names of the members before."""
    if asked:
        if asked in taken:
            raise errors.AlreadyExists(f"a sandbox named {asked!r} already exists")
        return asked
    for name in drawn:
        if name not in taken:
            return name
    return await names.generate(session, user_id, avoid=taken)


def _new_row(
    services: Services, user_id: str, spec: CreatePlan, *, name: str, host_id: str, rootfs: str
) -> Sandbox:
    """A created sandbox's row, ``creating`` on ``host_id``."""
    now = services.clock()
    return Sandbox(
        id=new_id("sb-"),
        user_id=user_id,
        name=name,
        status=SandboxStatus.CREATING,
        host_id=host_id,
        shape=spec.shape.id,
        rootfs=rootfs,
        vcpu=spec.shape.vcpu,
        mem_mib=spec.shape.mem_mib,
        cpu_quota_pct=spec.shape.cpu_quota_pct,
        disk_mib=spec.disk_mib,
        region=services.settings.region,
        egress=spec.egress,
        envs_sealed=envs.seal(services, spec.envs),
        env_keys=sorted(spec.envs),
        ssh_pubkeys=spec.ssh_pubkeys,
        node_selector=spec.node_selector,
        ingress_enabled=spec.ingress_enabled,
        ingress_host_header=spec.ingress_host_header,
        ingress_https_ports=spec.ingress_https_ports,
        bandwidth_quota_bytes=services.settings.default_bandwidth_quota_bytes,
        bandwidth_used_bytes=0,
        bandwidth_ingress_bytes=0,
        auto_pause_after_seconds=spec.auto_pause_after_seconds,
        oom_kills=0,
        created_at=now,
        timeout_s=spec.timeout_s,
        on_timeout=spec.on_timeout,
        on_idle=spec.on_idle,
        end_at=end_of(now, spec.timeout_s),
        labels=spec.metadata,
    )


async def _mount_volumes(
    services: Services, user_id: str, booted: Sandbox, copies: Sequence[tuple[str, str]] = ()
) -> None:
    """The create's volumes, mounted before the answer (``copies``: those a boot from a snapshot copies
    first). Unlike an S3 disk's, a failed mount fails the create (the sandbox is destroyed): what it
    wrote at the path would land on its own disk and be lost."""
    if booted.status in TERMINAL or booted.status == SandboxStatus.DESTROYING:
        return
    try:
        if copies:
            await snapshot_volumes.make_for_boot(services, user_id, str(booted.host_id), copies)
        await volumes.mount_all(services, booted)
    except Exception:
        log.warning("sandbox_volume_mount_failed", sandbox_id=booted.id)
        await destruction.destroy(services, user_id, booted.id, reason="volume_mount_failed")
        raise


async def _pick(
    session: AsyncSession,
    services: Services,
    placement: Placement,
    *,
    refused: Collection[str],
    lock_held: bool = False,
    tally: scheduler.Tally | None = None,
) -> str:
    return await scheduler.pick_host(
        session,
        mem_mib=placement.mem_mib,
        rootfs=placement.rootfs,
        now=services.clock(),
        dead_after_s=services.settings.host_dead_after_s,
        host_id=placement.host_id,
        node_selector=placement.node_selector,
        exclude=refused,
        fetchable=placement.fetchable,
        lock_held=lock_held,
        tally=tally,
    )


async def _place_elsewhere(
    services: Services,
    sandbox: Sandbox,
    placement: Placement,
    refused: dict[str, str],
    unsupported: Collection[str] = (),
) -> Sandbox:
    """Move a ``creating`` sandbox that its host refused to another host; with none left, remove it.

    A create refused for capacity answers 503, which clients re-send and which must change nothing
    (contract §6.2): so the row, its memberships and its name go, no event was emitted (``sandbox.create``
    is written only at boot) and nothing was billed (billing starts at ``running``).
    """
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox.id, with_for_update=True)
        if row is not None and row.status == SandboxStatus.CREATING:
            try:
                host_id: str | None = await _pick(session, services, placement, refused=refused)
            except errors.Unavailable:
                host_id = None
            if host_id is not None:
                row.host_id = host_id
                return row
        # Also when destroyed meanwhile (``destroying``): it never existed, so no destroy is owed either.
        await networks.drop_memberships(session, sandbox.id)
        await disks.drop_attachments(session, sandbox.id)
        await volumes.drop_attachments(session, sandbox.id)
        if row is not None:
            await session.delete(row)
    reasons = "; ".join(f"host {host_id}: {reason}" for host_id, reason in refused.items())
    if set(refused) <= set(unsupported):  # no room would change it: a 409, not a 503 to retry
        raise errors.InvalidState(reasons)
    raise scheduler.no_capacity(reasons)


async def boot(
    services: Services,
    sandbox: Sandbox,
    *,
    start_paused: bool,
    fork_of: Sandbox | None = None,
    joined: bool = True,
    with_disks: bool = False,
    with_volumes: bool = False,
) -> Sandbox:
    """Start ``sandbox`` on its host and record the outcome; a failure leaves it ``failed`` (500).

    ``joined=False`` says the sandbox joined no network (a create that named none, or any fork's child,
    which never joins one: §11.9; a network is attached later only to a running sandbox), so its
    memberships are not read before the host call, and the outcome, which then changes the sandbox's
    own columns only (and the webhook outbox), is recorded with plain statements
    (``settle(plain=True)``), as a pause's is.

    ``with_disks``: the create named disks; a host whose tier binds them only at the start (gVisor) is
    sent them in its create call (``disks.boot_mounts``), and ``disks.mount_all`` records the outcomes.
    ``with_volumes``: the create named volumes; such a host is sent them before its create call
    (``volumes.before_boot``).

    A host without room for the new sandbox raises :class:`HostFullError` and records nothing: a
    create goes elsewhere, a fork (which has no elsewhere: it copies its source's disk on that host)
    removes its child and answers 503.
    """
    link = await hostlink.for_host(services, sandbox.host_id)
    started = time.perf_counter()

    async def start_on_host() -> tuple[hostlink.Booted, float]:
        if fork_of is None:  # a template's image this host lacks comes first (not within the boot time)
            await templates.ensure_image(services, link, str(sandbox.host_id), sandbox.rootfs)
            await snapshots.ensure_on_host(services, link, str(sandbox.host_id), sandbox.rootfs)
        async with asyncio.timeout(boot_deadline_s(services, link)):
            memberships = await networks.boot_memberships(services, sandbox.id) if joined else []
            if fork_of is None:
                mounts = await disks.boot_mounts(services, sandbox) if with_disks else []
                if with_volumes:
                    await volumes.before_boot(services, link, sandbox)
                try:
                    booted = await link.create(
                        sandbox, start_paused=start_paused, networks=memberships, disks=mounts
                    )
                except hostlink.CapacityError as exc:
                    raise HostFullError(str(sandbox.host_id), str(exc)) from None
                except hostlink.TierRefusedError as exc:
                    raise HostFullError(str(sandbox.host_id), str(exc), unsupported=True) from None
            else:
                try:
                    booted = await link.fork(
                        fork_of, sandbox, start_paused=start_paused, networks=memberships
                    )
                except hostlink.CapacityError as exc:
                    raise HostFullError(str(sandbox.host_id), str(exc)) from None
        return booted, round((time.perf_counter() - started) * 1000, 3)

    async def started_on_host(
        session: AsyncSession, row: Sandbox, outcome: tuple[hostlink.Booted, float]
    ) -> None:
        booted, spawn_ms = outcome
        now = services.clock()
        row.ip = booted.ip
        row.spawn_ms = spawn_ms
        networks.activate_all(row)  # none when not ``joined``: a plain row's would not be written
        await forked(session, row)
        if row.status == SandboxStatus.DESTROYING:  # destroyed while booting
            return
        if start_paused:
            row.status, row.paused_at = SandboxStatus.PAUSED, now
        else:
            row.status, row.running_at = SandboxStatus.RUNNING, now
            row.billed_until, row.last_activity_at = now, now
        if fork_of is None:
            await webhooks.emit(session, user_id=row.user_id, action="sandbox.create", data=event_data(row))

    async def forked(session: AsyncSession, row: Sandbox) -> None:
        """A fork's child exists once its host has answered, whatever the answer: its ``sandbox.fork``
        is written with the outcome, in the same transaction (a transaction of its own after it was
        ~0.5 ms more before the fork's answer)."""
        if fork_of is not None:
            data = event_data(row, source_id=fork_of.id)
            await webhooks.emit(session, user_id=row.user_id, action="sandbox.fork", data=data)

    async def failed(session: AsyncSession, row: Sandbox, exc: Exception) -> None:
        await forked(session, row)
        if row.status in _DESTROYED and isinstance(exc, hostlink.SandboxGoneError):
            return  # destroyed while booting: the host refused the create its destroy overtook
        row.status, row.status_reason = SandboxStatus.FAILED, _boot_failure(sandbox, exc)[:300]
        await networks.drop_memberships(session, sandbox.id)
        await disks.drop_attachments(session, sandbox.id)

    # Whatever the row's status now (a destroy, or a dead host's ``error``, may have come meanwhile), the
    # boot's outcome is recorded. HostFullError is no outcome: it goes to create, which places elsewhere.
    outcome = await settle(
        services,
        sandbox.id,
        start_on_host,
        expect=ALL,
        on_success=started_on_host,
        on_failure=failed,
        failures=(hostlink.HostError, TimeoutError, hostlink.SandboxGoneError),
        plain=not joined,
    )
    if (
        isinstance(outcome.error, hostlink.SandboxGoneError)
        and outcome.row is not None
        and outcome.row.status in _DESTROYED
    ):
        # A destroy reached the host before this create did, and the host refused the create (it
        # remembers the id): the sandbox is being destroyed, as the caller who destroyed it asked.
        return outcome.row
    if outcome.error is not None:
        reason = _boot_failure(sandbox, outcome.error)
        log.warning("sandbox_boot_failed", sandbox_id=sandbox.id, reason=reason)
        forget = destruction.forget_on_host(services, str(sandbox.host_id), sandbox.id)
        services.tasks.spawn(forget, name=f"forget {sandbox.id}")
        raise errors.ServerError(f"sandbox failed to boot: {reason}") from None
    row = outcome.row
    assert row is not None  # only a create refused for capacity deletes its row, and it records nothing
    if row.status == SandboxStatus.DESTROYING:
        return row
    if row.status == SandboxStatus.RUNNING:  # the first exec needs no database read
        services.running.put(row.id, row)
    if list(row.egress or []) != list(sandbox.egress or []):
        # PUT egress while the sandbox was booting with the earlier list
        try:
            await link.set_egress(row.id, list(row.egress or []))
        except (hostlink.HostError, hostlink.SandboxGoneError) as exc:
            log.warning("egress_resend_failed", sandbox_id=row.id, error=str(exc))
    return row


def boot_deadline_s(services: Services, link: hostlink.HostLinkAPI) -> float:
    """How long a boot on ``link``'s host may take: a VM host's is longer (``vm_boot_timeout_s``)."""
    if link.runtime in hosts.VM_RUNTIMES:
        return services.settings.vm_boot_timeout_s
    return services.settings.boot_timeout_s


#: A row a destroy has taken (or finished) while its boot was in flight.
_DESTROYED = (SandboxStatus.DESTROYING, SandboxStatus.DESTROYED)


def _boot_failure(sandbox: Sandbox, exc: Exception) -> str:
    """Why a boot failed, as ``status_reason`` and the 500 say it."""
    if isinstance(exc, TimeoutError):
        return "boot deadline exceeded"
    if isinstance(exc, hostlink.CapacityError):
        return f"no capacity on host {sandbox.host_id}: {exc}"
    return str(exc)


async def fork(services: Services, user_id: str, source_id: str, req: ForkSandboxRequest) -> Sandbox:
    """Answer with the child in ``forking`` once its host has the fork in hand; it boots from a copy of
    the source's disk (§11.9).

    The host's fork answers only when it is done, and its refusal for room is known only then: the
    answer waits for it, so that a fork the host has no room for answers as a create does, 503 with
    ``Retry-After`` and nothing recorded (no child, no event), instead of a child that ends ``failed``.
    The boot itself runs in the background (it goes on if the client leaves) and emits ``sandbox.fork``
    once the child exists, whether it then runs or failed."""
    if req.bandwidth_quota_bytes is not None:
        raise errors.ValidationFailed.field("bandwidth_quota_bytes", "cannot be set on fork")
    egress = validation.egress_rules(req.egress) if req.egress is not None else None
    env = validation.envs(req.envs) if req.envs is not None else None
    ssh = validation.ssh_pubkeys(req.ssh_pubkeys) if req.ssh_pubkeys is not None else None
    start_paused = bool(req.start_paused)
    asked_lifetime = req.timeout_s is not None or req.on_timeout is not None
    timeout_s, on_timeout = lifetime(req.timeout_s, req.on_timeout)
    metadata = check_metadata(req.metadata) if req.metadata is not None else None
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        # Read with one plain statement, its row locked (``transition.locked_row``): the child only
        # copies its columns, and the ORM's load of the row and then of its memberships was ~1 ms.
        source = await locked_row(session, source_id)
        if source is None or source.user_id != user_id:
            raise errors.NotFound("sandbox not found")
        if source.status not in FORKABLE:
            raise errors.InvalidState(f"sandbox is {source.status}; fork needs a running or paused source")
        plan = await accounts.cached_plan(session, account.plan_id)
        # A create's one statement of checks: the caps' counts and two names drawn for the child (and
        # on PostgreSQL the placement lock, which the room check below needs), where the caps and the
        # name were a statement each.
        drawn = names.draw()
        live, today, names_taken = await _checks(session, services, user_id, drawn)
        accounts.refuse_over_caps(plan, live=None if start_paused else live, today=today)
        accounts.require_credit(account)
        if source.host_id is None:
            raise errors.InvalidState("sandbox has no host to fork on")
        await volumes.refuse_copy(session, source, "forking a sandbox")
        # The child runs where its source's disk is: no other host can take it, so a full host is a 503
        # now rather than a child that fails after this answer.
        await scheduler.check_room(
            session,
            source.host_id,
            mem_mib=source.mem_mib,
            now=services.clock(),
            dead_after_s=services.settings.host_dead_after_s,
            lock_held=True,
        )
        columns: dict[str, Any] = {
            "id": new_id("sb-"),
            "user_id": user_id,
            "name": await _name(session, user_id, None, drawn, names_taken),
            "status": SandboxStatus.FORKING,
            "host_id": source.host_id,
            "shape": source.shape,
            "rootfs": source.rootfs,
            "vcpu": source.vcpu,
            "mem_mib": source.mem_mib,
            "cpu_quota_pct": source.cpu_quota_pct,
            "disk_mib": source.disk_mib,
            "region": source.region,
            "egress": egress if egress is not None else list(source.egress or []),
            "envs_sealed": envs.seal(services, env) if env is not None else source.envs_sealed,
            "env_keys": sorted(env) if env is not None else list(source.env_keys or []),
            "ssh_pubkeys": ssh if ssh is not None else list(source.ssh_pubkeys or []),
            "node_selector": dict(source.node_selector or {}),
            "ingress_enabled": source.ingress_enabled if req.ingress_enabled is None else req.ingress_enabled,
            # Its apps are its source's: they are reached the same way.
            "ingress_host_header": source.ingress_host_header,
            "ingress_https_ports": source.ingress_https_ports,
            "bandwidth_quota_bytes": services.settings.default_bandwidth_quota_bytes,
            "bandwidth_used_bytes": 0,
            "bandwidth_ingress_bytes": 0,
            "forked_from": source.id,
            "auto_pause_after_seconds": source.auto_pause_after_seconds,
            "on_idle": source.on_idle,
            "oom_kills": 0,
            "created_at": services.clock(),
        }
        # A child has its source's lifetime from its own start unless the fork names one, and its
        # source's metadata unless the fork gives its own.
        if not asked_lifetime:
            timeout_s, on_timeout = source.timeout_s, source.on_timeout
        elif on_timeout == "hibernate":  # the child runs on its source's host
            suspension.require_hibernating_host(await session.get(Host, source.host_id), "on_timeout")
        columns["timeout_s"] = timeout_s
        columns["on_timeout"] = on_timeout
        columns["end_at"] = end_of(services.clock(), timeout_s)
        columns["labels"] = (
            metadata if metadata is not None else (dict(source.labels) if source.labels else None)
        )
        # Written with one plain INSERT, not through the session: nothing reads the new row back in this
        # transaction, and the ORM's unit of work for a row of ~30 columns cost ~0.13 ms more CPU per
        # fork (0.42 against 0.29 ms on SQLite). ``child``, which no session holds, is what the answer,
        # the event and the boot read.
        await (await transaction_connection(session)).execute(_INSERT_SANDBOX, columns)
        child = Sandbox(**columns)
        # The child inherits the source's mounts (issue #15): mounted again for it once it runs.
        inherited = await disks.inherit(session, source, child)
        # Its source's volumes only when asked: a copy of each, made before the disk's (issue #34).
        copies = (
            await volumes.plan_copies(session, services, user_id, plan, source, child.id)
            if req.include_volumes
            else []
        )
    taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    taken.add_done_callback(_retrieved)  # a client that left never reads the outcome
    services.tasks.spawn(
        _boot_fork(services, source, child, start_paused, mounts=inherited > 0, taken=taken, copies=copies),
        name=f"boot fork {child.id}",
    )
    # Shielded: a client that leaves does not stop the boot, which records its own outcome.
    await asyncio.shield(taken)
    return child


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


async def _unmake_child(services: Services, child: Sandbox, copies: Sequence[tuple[str, str]]) -> None:
    """A fork that made nothing on its host: the child, what it inherited and its volumes' copies go."""
    async with transaction(services.sessions) as session:
        await disks.drop_attachments(session, child.id)
        row = await session.get(Sandbox, child.id, with_for_update=True)
        if row is not None:  # also when destroyed meanwhile: it never existed
            await session.delete(row)
    await volumes.drop_copies(services, str(child.host_id), copies)


async def _boot_fork(
    services: Services,
    source: Sandbox,
    child: Sandbox,
    start_paused: bool,
    *,
    mounts: bool,
    taken: asyncio.Future[None],
    copies: Sequence[tuple[str, str]] = (),
) -> None:
    """Boots the child; ``taken`` ends when the host has answered: with the 503 of a refusal for room
    (the child and what it inherited are removed), else with nothing (the child exists, running or
    ``failed``, and its ``sandbox.fork`` is written). ``copies``: the source's volumes and the child's
    copies of them (``include_volumes``), made before the boot and mounted before the answer."""
    if copies:
        try:
            await volumes.make_copies(services, child.user_id, str(child.host_id), copies)
        except asyncio.CancelledError:
            taken.cancel()
            raise
        except Exception as exc:  # nothing was made for the child on its host: it never existed
            await _unmake_child(services, child, copies)
            taken.set_exception(exc)
            return
    try:
        booted = await boot(services, child, start_paused=start_paused, fork_of=source, joined=False)
    except HostFullError as full:
        log.info("sandbox_host_full", sandbox_id=child.id, host_id=full.host_id, reason=full.reason)
        await _unmake_child(services, child, copies)
        taken.set_exception(scheduler.no_capacity(f"host {full.host_id}: {full.reason}"))
        return
    except hostlink.TierRefusedError as refused:
        # The host's tier does not fork this (a VM holding a volume, say): nothing was made there, so
        # the fork is the 409 naming the tier and the child never existed, as for no room above.
        await _unmake_child(services, child, copies)
        taken.set_exception(refused)
        return
    except errors.PaddockError:  # recorded as failed by boot()
        booted = None
    except asyncio.CancelledError:
        taken.cancel()
        raise
    except Exception as exc:
        taken.set_exception(exc)
        raise
    if booted is not None and copies:
        try:  # before the answer, as a create's: a child without them would write onto its own disk
            await _mount_volumes(services, child.user_id, booted)
        except Exception as exc:
            taken.set_exception(exc)
            return
    taken.set_result(None)  # its ``sandbox.fork`` was written with the outcome (``boot``)
    # A child that inherited no disk has none to mount: no read to find out (as create does).
    if booted is not None and mounts:
        await disks.mount_all(services, booted)


def metadata_filter(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """``metadata.k=v`` query parameters as ``{k: v}`` (list's filter), bounded like metadata itself."""
    wanted = {key[len("metadata.") :]: value for key, value in pairs if key.startswith("metadata.")}
    return check_metadata(wanted, "metadata")


async def set_timeout(
    services: Services, user_id: str, sandbox_id: str, timeout_s: int | None, on_timeout: str | None
) -> Sandbox:
    """Gives a live sandbox a new lifetime from now (extend or shorten), or none with 0/``null``;
    ``on_timeout`` stays as it was unless given."""
    async with transaction(services.sessions) as session:
        sandbox = await session.get(Sandbox, sandbox_id, with_for_update=True)
        if sandbox is None or sandbox.user_id != user_id:
            raise errors.NotFound("sandbox not found")
        if sandbox.status in TERMINAL or sandbox.status == SandboxStatus.DESTROYING:
            raise errors.InvalidState(f"sandbox is {sandbox.status}; a lifetime needs a live sandbox")
        timeout_s, on_timeout = lifetime(timeout_s, on_timeout or (sandbox.on_timeout if timeout_s else None))
        if on_timeout == "hibernate" and sandbox.on_timeout != "hibernate":
            suspension.require_hibernating_host(await session.get(Host, sandbox.host_id), "on_timeout")
        sandbox.timeout_s = timeout_s
        sandbox.on_timeout = on_timeout
        sandbox.end_at = end_of(services.clock(), timeout_s)
    return sandbox


async def expire_pass(session: AsyncSession, services: Services) -> None:
    """Reconciler pass: a sandbox whose ``end_at`` has passed is destroyed, or paused when its
    ``on_timeout`` is ``pause``, or hibernated when it is ``hibernate`` (a frozen pause where its host
    turns the hibernation down; its ``end_at`` is then cleared), and ``sandbox.timeout`` is emitted.
    The time is in the database, so a control plane that restarts enforces it on its first round."""
    now = services.clock()
    rows = (
        await session.scalars(
            select(Sandbox)
            .where(Sandbox.end_at.is_not(None), Sandbox.end_at <= now)
            .order_by(Sandbox.end_at)
            .limit(EXPIRY_BATCH)
            .with_for_update(skip_locked=True)
        )
    ).all()
    for sandbox in rows:
        if sandbox.status in (SandboxStatus.CREATING, SandboxStatus.RESUMING, SandboxStatus.FORKING):
            continue  # acted on once it has settled
        if sandbox.status in TERMINAL or sandbox.status == SandboxStatus.DESTROYING:
            sandbox.end_at = None
            continue
        pause = sandbox.on_timeout in ("pause", "hibernate")
        if pause and sandbox.status != SandboxStatus.RUNNING:
            sandbox.end_at = None  # paused already (or pausing): its clock stops
            continue
        sandbox.end_at = None
        await webhooks.emit(
            session,
            user_id=sandbox.user_id,
            action="sandbox.timeout",
            data=event_data(sandbox, timeout_s=sandbox.timeout_s, on_timeout=sandbox.on_timeout or "destroy"),
        )
        log.info("sandbox_timed_out", sandbox_id=sandbox.id, on_timeout=sandbox.on_timeout)
        if sandbox.on_timeout == "hibernate":
            suspension.hibernate_later(services, sandbox, reason="timeout", expect=SandboxStatus.RUNNING)
        elif pause:
            suspension.pause_later(services, sandbox, "timeout")
        else:
            destruction.destroy_later(services, sandbox, reason="timeout", label=None)


#: Sandboxes the expiry pass acts on per round (the rest wait for the next round).
EXPIRY_BATCH = 50
