"""Sandbox lifecycle: create, destroy, pause, resume, fork, resize (§11.3, §11.8, §11.9, §13).

Each operation writes its state change (and its webhook event) in one transaction, talks to the host
outside any transaction, then records the outcome in a second transaction. A process that dies in
between leaves a transitional status that the reconciler settles.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane import accounts, catalog, hostlink, names, scheduler, validation, webhooks
from paddock_controlplane.models import Host, NetworkMember, Plan, Sandbox
from paddock_controlplane.schemas import CreateSandboxRequest, ForkSandboxRequest
from paddock_controlplane.services import Services
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.logging import get_logger

log = get_logger("paddock.lifecycle")

DEFAULT_BANDWIDTH_QUOTA_BYTES = 5 * 1024**3
#: Statuses that will be running without a further resume; they count toward the concurrent cap.
TOWARD_RUNNING = ("creating", "running", "resuming", "forking")
TERMINAL = ("destroyed", "failed")


class HostFullError(Exception):
    """A host refused a new sandbox for lack of room (its 507); nothing of the sandbox exists there."""

    def __init__(self, host_id: str, reason: str) -> None:
        super().__init__(reason)
        self.host_id = host_id
        self.reason = reason


@dataclass(frozen=True)
class Placement:
    """What a create asked of its host, kept to place it again when a host refuses it."""

    mem_mib: int
    rootfs: str
    host_id: str | None
    node_selector: dict[str, str]


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


def _field_error(name: str, exc: ValueError) -> errors.ValidationFailed:
    if isinstance(exc, validation.EgressRuleError):
        return errors.ValidationFailed.field(f"{name}[{exc.index}]", exc.reason)
    return errors.ValidationFailed.field(name, str(exc))


def check_list(name: str, values: list[str] | None, rule: Any) -> list[Any]:
    out = []
    for index, value in enumerate(values or []):
        try:
            out.append(rule(value))
        except ValueError as exc:
            raise errors.ValidationFailed.field(f"{name}[{index}]", str(exc)) from None
    return list(dict.fromkeys(out))


def validate_envs(values: dict[str, str] | None) -> dict[str, str]:
    try:
        return validation.envs(values)
    except ValueError as exc:
        raise _field_error("envs", exc) from None


def validate_egress(values: list[str] | None, field: str = "egress") -> list[str]:
    try:
        return validation.egress_rules(values)
    except ValueError as exc:
        raise _field_error(field, exc) from None


def validate_create(req: CreateSandboxRequest, region: str) -> CreatePlan:
    shape = catalog.SHAPES_BY_ID.get(req.shape)
    if shape is None:
        raise errors.ValidationFailed.field("shape", f"unknown shape {req.shape!r}")
    name = None
    if req.name:
        try:
            name = validation.sandbox_name(req.name)
        except ValueError as exc:
            raise _field_error("name", exc) from None
    disk_mib = req.disk_mib or shape.default_disk_mib
    if disk_mib < validation.MIN_DISK_MIB:
        raise errors.ValidationFailed.field("disk_mib", f"must be 0 or at least {validation.MIN_DISK_MIB}")
    try:
        auto_pause = validation.auto_pause_seconds(req.auto_pause_after_seconds)
    except ValueError as exc:
        raise _field_error("auto_pause_after_seconds", exc) from None
    for index, disk in enumerate(req.disks or []):
        if not disk.disk_id:
            raise errors.ValidationFailed.field(f"disks[{index}].disk_id", "must not be empty")
        try:
            validation.mount_path(disk.mount_path)
            validation.sub_path(disk.sub_path)
        except ValueError as exc:
            raise _field_error(f"disks[{index}].mount_path", exc) from None
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
        egress=validate_egress(req.egress),
        envs=validate_envs(req.envs),
        ssh_pubkeys=check_list("ssh_pubkeys", req.ssh_pubkeys, validation.ssh_pubkey),
        host_id=req.host_id or None,
        node_selector=dict(req.node_selector or {}),
        ingress_enabled=bool(req.ingress_enabled),
        auto_pause_after_seconds=auto_pause,
        start_paused=bool(req.start_paused),
    )
    if req.region and req.region != region:
        raise errors.RegionMismatch(f"region {req.region!r} does not match this server's region {region!r}")
    return plan


def check_plan_limits(plan: Plan, *, vcpu: int, mem_mib: int, disk_mib: int, wants_disks: bool) -> None:
    if vcpu > plan.max_vcpu or mem_mib > plan.max_mem_mib:
        raise errors.PlanLimit(
            f"shape exceeds the {plan.name} plan's largest shape ({plan.max_vcpu} vCPU / "
            f"{plan.max_mem_mib // 1024} GB)"
        )
    if disk_mib > plan.max_disk_mib:
        raise errors.PlanLimit(
            f"disk_mib {disk_mib} exceeds the {plan.name} plan's max disk {plan.max_disk_mib}"
        )
    if wants_disks and plan.disks_concurrent == 0:
        raise errors.PlanLimit(f"the {plan.name} plan includes no disks")


async def check_quotas(
    session: AsyncSession,
    services: Services,
    plan: Plan,
    user_id: str,
    *,
    needs_slot: bool,
    new_sandbox: bool,
) -> None:
    """Concurrent and daily caps; the caller holds the user lock (§14.2)."""
    if needs_slot:
        live = await session.scalar(
            select(func.count()).where(Sandbox.user_id == user_id, Sandbox.status.in_(TOWARD_RUNNING))
        )
        if int(live or 0) >= plan.concurrent_sandboxes:
            raise errors.QuotaExceeded(f"concurrent sandbox cap reached: limit {plan.concurrent_sandboxes}")
    if new_sandbox:
        today = await session.scalar(
            select(func.count()).where(
                Sandbox.user_id == user_id, Sandbox.created_at >= accounts.day_start(services.clock())
            )
        )
        if int(today or 0) >= plan.sandboxes_per_day:
            raise errors.QuotaExceeded(f"daily sandbox cap reached: limit {plan.sandboxes_per_day} per day")


async def check_credit(session: AsyncSession, user_id: str) -> None:
    if await accounts.balance_micro(session, user_id) <= 0:
        raise errors.InsufficientCredit("no credit left on this account")


def require_credit(account: accounts.LockedUser) -> None:
    if account.credits_micro <= 0:
        raise errors.InsufficientCredit("no credit left on this account")


async def resolve_rootfs(session: AsyncSession, services: Services, requested: str) -> str:
    from paddock_controlplane import hosts

    available = await hosts.available_images(session)
    default = catalog.rootfs_view(available, services.settings.default_rootfs)["default"]
    name = requested or default
    if name in available or (not requested and name == default):
        return name
    raise errors.ValidationFailed.field("rootfs", f"unknown image {requested!r}; see GET /v1/rootfs")


def seal_envs(services: Services, envs: dict[str, str]) -> str | None:
    return services.secret_box.seal(json.dumps(envs)) if envs else None


def open_envs(services: Services, sandbox: Sandbox) -> dict[str, str]:
    if not sandbox.envs_sealed:
        return {}
    return dict(json.loads(services.secret_box.open(sandbox.envs_sealed)))


async def get_owned(
    session: AsyncSession, user_id: str, sandbox_id: str, *, for_update: bool = False
) -> Sandbox:
    query = select(Sandbox).where(Sandbox.id == sandbox_id, Sandbox.user_id == user_id)
    if for_update:
        query = query.with_for_update()
    sandbox = (await session.scalars(query)).first()
    if sandbox is None:
        raise errors.NotFound("sandbox not found")
    return sandbox


def event_data(sandbox: Sandbox, **extra: Any) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox.id,
        "user_id": sandbox.user_id,
        "name": sandbox.name,
        "shape": sandbox.shape,
        "disk_mib": sandbox.disk_mib,
        "region": sandbox.region,
        **extra,
    }


async def create(services: Services, user_id: str, req: CreateSandboxRequest) -> Sandbox:
    settings = services.settings
    spec = validate_create(req, settings.region)
    from paddock_controlplane import networks

    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        joined = await networks.resolve_refs(session, user_id, req.networks)
        if req.disks:
            # Disks are resources of their own; none can be owned before the disks API exists.
            raise errors.NotFound("disks[0].disk_id: not found", fields={"disks[0].disk_id": "not found"})
        plan = await accounts.cached_plan(session, account.plan_id)
        check_plan_limits(
            plan, vcpu=spec.shape.vcpu, mem_mib=spec.shape.mem_mib, disk_mib=spec.disk_mib, wants_disks=False
        )
        await check_quotas(
            session, services, plan, user_id, needs_slot=not spec.start_paused, new_sandbox=True
        )
        require_credit(account)
        rootfs = await resolve_rootfs(session, services, spec.rootfs)
        name = spec.name or await names.generate(session, user_id)
        if spec.name and await names.taken(session, user_id, spec.name):
            raise errors.AlreadyExists(f"a sandbox named {spec.name!r} already exists")
        placement = Placement(
            mem_mib=spec.shape.mem_mib,
            rootfs=rootfs,
            host_id=await networks.placement(session, joined, spec.host_id),
            node_selector=spec.node_selector,
        )
        host = await _pick(session, services, placement, refused=())
        sandbox = Sandbox(
            id=new_id("sb-"),
            user_id=user_id,
            name=name,
            status="creating",
            host_id=host.id,
            shape=spec.shape.id,
            rootfs=rootfs,
            vcpu=spec.shape.vcpu,
            mem_mib=spec.shape.mem_mib,
            cpu_quota_pct=spec.shape.cpu_quota_pct,
            disk_mib=spec.disk_mib,
            region=settings.region,
            egress=spec.egress,
            envs_sealed=seal_envs(services, spec.envs),
            env_keys=sorted(spec.envs),
            ssh_pubkeys=spec.ssh_pubkeys,
            node_selector=spec.node_selector,
            ingress_enabled=spec.ingress_enabled,
            bandwidth_quota_bytes=services.settings.default_bandwidth_quota_bytes,
            bandwidth_used_bytes=0,
            bandwidth_ingress_bytes=0,
            auto_pause_after_seconds=spec.auto_pause_after_seconds,
            oom_kills=0,
            created_at=services.clock(),
        )
        session.add(sandbox)
        await session.flush()
        for network in joined:
            await networks.join(session, network, sandbox.id)
    refused: dict[str, str] = {}
    while True:  # ends: every refusal excludes one more host
        try:
            return await boot(services, sandbox, start_paused=spec.start_paused)
        except HostFullError as full:
            log.info("sandbox_host_full", sandbox_id=sandbox.id, host_id=full.host_id, reason=full.reason)
            refused[full.host_id] = full.reason
            sandbox = await _place_elsewhere(services, sandbox, placement, refused)


async def _pick(
    session: AsyncSession, services: Services, placement: Placement, *, refused: Collection[str]
) -> Host:
    return await scheduler.pick_host(
        session,
        mem_mib=placement.mem_mib,
        rootfs=placement.rootfs,
        now=services.clock(),
        dead_after_s=services.settings.host_dead_after_s,
        host_id=placement.host_id,
        node_selector=placement.node_selector,
        exclude=refused,
    )


async def _place_elsewhere(
    services: Services, sandbox: Sandbox, placement: Placement, refused: dict[str, str]
) -> Sandbox:
    """Move a ``creating`` sandbox that its host refused to another host; with none left, remove it.

    A create refused for capacity answers 503, which clients re-send and which must change nothing
    (contract §6.2): so the row, its memberships and its name go, no event was emitted (``sandbox.create``
    is written only at boot) and nothing was billed (billing starts at ``running``).
    """
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox.id, with_for_update=True)
        if row is not None and row.status == "creating":
            try:
                host = await _pick(session, services, placement, refused=refused)
            except errors.Unavailable:
                host = None
            if host is not None:
                row.host_id = host.id
                return row
        # Also when destroyed meanwhile (``destroying``): it never existed, so no destroy is owed either.
        # networks.drop_memberships, written out: networks imports this module.
        await session.execute(delete(NetworkMember).where(NetworkMember.sandbox_id == sandbox.id))
        if row is not None:
            await session.delete(row)
    raise scheduler.no_capacity("; ".join(f"host {host_id}: {reason}" for host_id, reason in refused.items()))


async def boot(
    services: Services, sandbox: Sandbox, *, start_paused: bool, fork_of: Sandbox | None = None
) -> Sandbox:
    """Start ``sandbox`` on its host and record the outcome; a failure leaves it ``failed`` (500).

    A host without room for a new (not forked) sandbox raises :class:`HostFullError` and records
    nothing, so the create can go elsewhere. A fork has no elsewhere (it copies its source's disk on
    that host) and was already answered, so its child ends ``failed`` saying why.
    """
    from paddock_controlplane import networks

    link = await hostlink.for_host(services, sandbox.host_id)
    started = time.perf_counter()
    try:
        async with asyncio.timeout(services.settings.boot_timeout_s):
            memberships = await networks.boot_memberships(services, sandbox.id)
            if fork_of is None:
                try:
                    booted = await link.create(sandbox, start_paused=start_paused, networks=memberships)
                except hostlink.CapacityError as exc:
                    raise HostFullError(str(sandbox.host_id), str(exc)) from None
            else:
                booted = await link.fork(fork_of, sandbox, start_paused=start_paused, networks=memberships)
    except (hostlink.HostError, TimeoutError) as exc:
        reason = "boot deadline exceeded" if isinstance(exc, TimeoutError) else str(exc)
        if isinstance(exc, hostlink.CapacityError):
            reason = f"no capacity on host {sandbox.host_id}: {exc}"
        log.warning("sandbox_boot_failed", sandbox_id=sandbox.id, reason=reason)
        async with transaction(services.sessions) as session:
            row = await session.get(Sandbox, sandbox.id, with_for_update=True)
            if row is not None:
                row.status, row.status_reason = "failed", reason[:300]
            await networks.drop_memberships(session, sandbox.id)
        services.tasks.spawn(_forget_on_host(services, sandbox), name=f"forget {sandbox.id}")
        raise errors.ServerError(f"sandbox failed to boot: {reason}") from None
    spawn_ms = round((time.perf_counter() - started) * 1000, 3)
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox.id, with_for_update=True)
        assert row is not None
        now = services.clock()
        row.ip = booted.ip
        row.spawn_ms = spawn_ms
        await networks.activate_all(session, row.id)
        resend_egress = list(row.egress or []) != list(sandbox.egress or [])
        if row.status == "destroying":  # destroyed while booting
            return row
        if start_paused:
            row.status, row.paused_at = "paused", now
        else:
            row.status, row.running_at, row.billed_until, row.last_activity_at = "running", now, now, now
        if fork_of is None:
            await webhooks.emit(session, user_id=row.user_id, action="sandbox.create", data=event_data(row))
    if row.status == "running":  # the first exec needs no database read
        services.running.put(row.id, row)
    if resend_egress:  # PUT egress while the sandbox was booting with the earlier list
        try:
            await link.set_egress(row.id, list(row.egress or []))
        except (hostlink.HostError, hostlink.SandboxGoneError) as exc:
            log.warning("egress_resend_failed", sandbox_id=row.id, error=str(exc))
    return row


async def _forget_on_host(services: Services, sandbox: Sandbox) -> None:
    try:
        link = await hostlink.for_host(services, sandbox.host_id)
        await link.destroy(sandbox.id)
    except Exception as exc:  # best effort; the host's own reconciliation removes leftovers
        log.warning("cleanup_failed", sandbox_id=sandbox.id, error=str(exc))


async def fork(services: Services, user_id: str, source_id: str, req: ForkSandboxRequest) -> Sandbox:
    """Answer with the child in ``forking`` at once; it boots from a copy of the source's disk (§11.9)."""
    if req.bandwidth_quota_bytes is not None:
        raise errors.ValidationFailed.field("bandwidth_quota_bytes", "cannot be set on fork")
    egress = validate_egress(req.egress) if req.egress is not None else None
    envs = validate_envs(req.envs) if req.envs is not None else None
    ssh = (
        check_list("ssh_pubkeys", req.ssh_pubkeys, validation.ssh_pubkey)
        if req.ssh_pubkeys is not None
        else None
    )
    start_paused = bool(req.start_paused)
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        source = await get_owned(session, user_id, source_id, for_update=True)
        if source.status not in ("running", "paused"):
            raise errors.InvalidState(f"sandbox is {source.status}; fork needs a running or paused source")
        plan = await accounts.cached_plan(session, account.plan_id)
        await check_quotas(session, services, plan, user_id, needs_slot=not start_paused, new_sandbox=True)
        require_credit(account)
        if source.host_id is None:
            raise errors.InvalidState("sandbox has no host to fork on")
        # The child runs where its source's disk is: no other host can take it, so a full host is a 503
        # now rather than a child that fails after this answer.
        await scheduler.check_room(
            session,
            source.host_id,
            mem_mib=source.mem_mib,
            now=services.clock(),
            dead_after_s=services.settings.host_dead_after_s,
        )
        child = Sandbox(
            id=new_id("sb-"),
            user_id=user_id,
            name=await names.generate(session, user_id),
            status="forking",
            host_id=source.host_id,
            shape=source.shape,
            rootfs=source.rootfs,
            vcpu=source.vcpu,
            mem_mib=source.mem_mib,
            cpu_quota_pct=source.cpu_quota_pct,
            disk_mib=source.disk_mib,
            region=source.region,
            egress=egress if egress is not None else list(source.egress or []),
            envs_sealed=seal_envs(services, envs) if envs is not None else source.envs_sealed,
            env_keys=sorted(envs) if envs is not None else list(source.env_keys or []),
            ssh_pubkeys=ssh if ssh is not None else list(source.ssh_pubkeys or []),
            node_selector=dict(source.node_selector or {}),
            ingress_enabled=source.ingress_enabled if req.ingress_enabled is None else req.ingress_enabled,
            bandwidth_quota_bytes=services.settings.default_bandwidth_quota_bytes,
            bandwidth_used_bytes=0,
            bandwidth_ingress_bytes=0,
            forked_from=source.id,
            auto_pause_after_seconds=source.auto_pause_after_seconds,
            oom_kills=0,
            created_at=services.clock(),
        )
        session.add(child)
        await webhooks.emit(
            session, user_id=user_id, action="sandbox.fork", data=event_data(child, source_id=source.id)
        )
    services.tasks.spawn(_boot_fork(services, source, child, start_paused), name=f"boot fork {child.id}")
    return child


async def _boot_fork(services: Services, source: Sandbox, child: Sandbox, start_paused: bool) -> None:
    with contextlib.suppress(errors.PaddockError):  # recorded as failed by boot()
        await boot(services, child, start_paused=start_paused, fork_of=source)
