"""Private networks (§10.14, §11.10, §11.12): CRUD, membership and overlay addresses.

Each network owns an IPv4 block (a ``/24`` by default) taken from ``settings.network_pool``; a user's
live networks never overlap, so one sandbox can belong to several. A member's address is allocated
here and stored on its ``NetworkMember`` row, so it survives host-agent restarts and does not depend
on which host runs the sandbox (a later VXLAN join across hosts keeps the same plan).

Membership goes ``pending`` (row written, address allocated) → ``active`` (the host programmed the
interface). Memberships end with a detach, or when their sandbox becomes ``destroyed`` or ``failed``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import queries
from paddock_controlplane.records.models import Network, NetworkMember, Sandbox
from paddock_controlplane.records.queries import get_owned
from paddock_controlplane.records.schemas.networks import NetworkRef
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import CLOSED, TERMINAL, SandboxStatus
from paddock_controlplane.resources import accounts, webhooks
from paddock_controlplane.resources.accounts import require_credit
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.logging import get_logger
from paddock_core.timeutil import rfc3339
from paddock_hostagent.schemas import NetworkAttachBody

log = get_logger("paddock.networks")

MAX_NAME = 63


# --- views ---------------------------------------------------------------------------------------


def network_view(network: Network, *, member_count: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": network.id,
        "name": network.name,
        "created_at": rfc3339(network.created_at),
        "cidr": network.cidr,
    }
    if member_count is not None:
        out["member_count"] = member_count
    return out


def member_view(member: NetworkMember, sandbox_name: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"sandbox_id": member.sandbox_id, "status": member.status}
    if member.status == "active":
        out["ip"] = member.ip
    if sandbox_name:
        out["name"] = sandbox_name
    return out


# --- reading -------------------------------------------------------------------------------------


async def get_owned_network(
    session: AsyncSession, user_id: str, network_id: str, *, for_update: bool = False
) -> Network:
    query = select(Network).where(
        Network.id == network_id, Network.user_id == user_id, Network.deleted_at.is_(None)
    )
    if for_update:
        query = query.with_for_update()
    network = (await session.scalars(query)).first()
    if network is None:
        raise errors.NotFound("network not found")
    return network


async def member_counts(session: AsyncSession, network_ids: Sequence[str]) -> dict[str, int]:
    if not network_ids:
        return {}
    rows = await session.execute(
        select(NetworkMember.network_id, func.count())
        .join(Sandbox, Sandbox.id == NetworkMember.sandbox_id)
        .where(NetworkMember.network_id.in_(list(network_ids)), Sandbox.status.not_in(TERMINAL))
        .group_by(NetworkMember.network_id)
    )
    return {network_id: int(count) for network_id, count in rows.all()}


async def page(
    session: AsyncSession, user_id: str, *, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    where = (Network.user_id == user_id, Network.deleted_at.is_(None))
    total = await session.scalar(select(func.count()).select_from(Network).where(*where))
    rows = (
        await session.scalars(
            select(Network).where(*where).order_by(Network.created_at, Network.id).limit(limit).offset(offset)
        )
    ).all()
    counts = await member_counts(session, [row.id for row in rows])
    return [network_view(row, member_count=counts.get(row.id, 0)) for row in rows], int(total or 0)


async def detail(session: AsyncSession, user_id: str, network_id: str) -> dict[str, Any]:
    network = await get_owned_network(session, user_id, network_id)
    rows = (
        await session.execute(
            select(NetworkMember, Sandbox.name)
            .join(Sandbox, Sandbox.id == NetworkMember.sandbox_id)
            .where(NetworkMember.network_id == network.id, Sandbox.status.not_in(TERMINAL))
            .order_by(NetworkMember.created_at, NetworkMember.sandbox_id)
        )
    ).all()
    out = network_view(network, member_count=len(rows))
    out["members"] = [member_view(member, name) for member, name in rows]
    return out


# --- create and delete ---------------------------------------------------------------------------


def validate_name(name: str | None) -> str:
    value = (name or "").strip()
    if not value:
        raise errors.ValidationFailed.field("name", "must not be empty")
    if len(value) > MAX_NAME:
        raise errors.ValidationFailed.field("name", f"must be at most {MAX_NAME} characters")
    return value


async def _free_cidr(session: AsyncSession, services: Services, user_id: str) -> str:
    pool = ipaddress.IPv4Network(services.settings.network_pool)
    taken = set(
        (
            await session.scalars(
                select(Network.cidr).where(Network.user_id == user_id, Network.deleted_at.is_(None))
            )
        ).all()
    )
    for block in pool.subnets(new_prefix=services.settings.network_prefixlen):
        if str(block) not in taken:
            return str(block)
    raise errors.QuotaExceeded(f"no free address block left in {pool}")


async def create(services: Services, user_id: str, name: str | None) -> dict[str, Any]:
    value = validate_name(name)
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        if plan.networks_concurrent <= 0:
            raise errors.PlanLimit(f"the {plan.name} plan includes no networks")
        live = await session.scalar(
            select(func.count()).where(Network.user_id == user_id, Network.deleted_at.is_(None))
        )
        if int(live or 0) >= plan.networks_concurrent:
            raise errors.QuotaExceeded(f"concurrent network cap reached: limit {plan.networks_concurrent}")
        today = await session.scalar(
            select(func.count()).where(
                Network.user_id == user_id, Network.created_at >= accounts.day_start(services.clock())
            )
        )
        if int(today or 0) >= plan.networks_per_day:
            raise errors.QuotaExceeded(f"daily network cap reached: limit {plan.networks_per_day} per day")
        require_credit(account)
        network = Network(
            id=new_id("net_"),
            user_id=user_id,
            name=value,
            cidr=await _free_cidr(session, services, user_id),
            created_at=services.clock(),
        )
        session.add(network)
        await session.flush()
        await webhooks.emit(
            session,
            user_id=user_id,
            action="network.create",
            data={"network_id": network.id, "user_id": user_id, "name": network.name},
        )
    return network_view(network, member_count=0)


async def delete_network(services: Services, user_id: str, network_id: str) -> None:
    """409 ``IN_USE`` while a member is not terminal (§11.12, §15 C17); members are never detached here."""
    async with transaction(services.sessions) as session:
        network = await get_owned_network(session, user_id, network_id, for_update=True)
        if (await member_counts(session, [network.id])).get(network.id, 0):
            raise errors.InUse("network in use: detach or destroy its member sandboxes first")
        await session.execute(delete(NetworkMember).where(NetworkMember.network_id == network.id))
        network.deleted_at = services.clock()
        await webhooks.emit(
            session,
            user_id=user_id,
            action="network.delete",
            data={"network_id": network.id, "user_id": user_id, "name": network.name},
        )


# --- membership ----------------------------------------------------------------------------------


async def resolve_refs(
    session: AsyncSession, user_id: str, refs: Sequence[NetworkRef] | None
) -> list[Network]:
    """The networks named by a create request, in order, duplicates dropped; 404 naming the field."""
    out: list[Network] = []
    seen: set[str] = set()
    for index, ref in enumerate(refs or []):
        if ref.id in seen:
            continue
        seen.add(ref.id)
        try:
            out.append(await get_owned_network(session, user_id, ref.id, for_update=True))
        except errors.NotFound:
            raise errors.NotFound(
                f"networks[{index}].id: network {ref.id!r} not found",
                fields={f"networks[{index}].id": "not found"},
            ) from None
    return out


async def member_hosts(session: AsyncSession, network_ids: Sequence[str], *, besides: str = "") -> set[str]:
    """Hosts running the live members of these networks (a network does not span hosts yet)."""
    if not network_ids:
        return set()
    rows = await session.scalars(
        select(Sandbox.host_id)
        .join(NetworkMember, NetworkMember.sandbox_id == Sandbox.id)
        .where(
            NetworkMember.network_id.in_(list(network_ids)),
            Sandbox.status.not_in(TERMINAL),
            Sandbox.id != besides,
            Sandbox.host_id.is_not(None),
        )
    )
    return {host for host in rows.all() if host}


async def placement(session: AsyncSession, joined: Sequence[Network], host_id: str | None) -> str | None:
    """Where a new sandbox joining ``joined`` must run: anywhere placement picks, since networks span
    hosts (a VXLAN port per network bridge, peers sent to the hosts with their heartbeats)."""
    return host_id


async def _allocate_ip(session: AsyncSession, network: Network) -> str:
    """The lowest free host address of the network; ``.1`` is kept for a future gateway or resolver."""
    block = ipaddress.IPv4Network(network.cidr)
    taken = set(
        (await session.scalars(select(NetworkMember.ip).where(NetworkMember.network_id == network.id))).all()
    )
    reserved = str(block.network_address + 1)
    for address in block.hosts():
        text = str(address)
        if text != reserved and text not in taken:
            return text
    raise errors.QuotaExceeded(f"network {network.id} has no free address left")


async def join(session: AsyncSession, network: Network, sandbox_id: str) -> NetworkMember:
    """A ``pending`` membership with a fresh address; the caller holds ``network``'s row lock."""
    member = NetworkMember(
        network_id=network.id,
        sandbox_id=sandbox_id,
        ip=await _allocate_ip(session, network),
        status="pending",
    )
    session.add(member)
    await session.flush()
    return member


def host_spec(member: NetworkMember, network: Network) -> dict[str, Any]:
    return {
        "network_id": member.network_id,
        "ip": member.ip,
        "prefixlen": ipaddress.IPv4Network(network.cidr).prefixlen,
    }


async def host_specs(session: AsyncSession, sandbox_id: str) -> list[dict[str, Any]]:
    rows = (
        await session.execute(
            select(NetworkMember, Network)
            .join(Network, Network.id == NetworkMember.network_id)
            .where(NetworkMember.sandbox_id == sandbox_id)
            .order_by(NetworkMember.created_at)
        )
    ).all()
    return [host_spec(member, network) for member, network in rows]


def activate_all(sandbox: Sandbox) -> None:
    """The booted sandbox's memberships become active. ``sandbox`` is its session's row: its
    memberships were loaded with it (selectin) as the session's own objects, so the change is flushed
    with the transaction, and no second read of them is needed."""
    for member in sandbox.memberships:
        member.status = "active"


async def drop_memberships(session: AsyncSession, sandbox_id: str) -> None:
    """The sandbox became terminal: its memberships end (§11.8)."""
    await session.execute(delete(NetworkMember).where(NetworkMember.sandbox_id == sandbox_id))


def _event(network_id: str, sandbox: Sandbox, ip: str) -> dict[str, Any]:
    return {"network_id": network_id, "sandbox_id": sandbox.id, "user_id": sandbox.user_id, "ip": ip}


async def attach(services: Services, user_id: str, sandbox_id: str, network_id: str | None) -> None:
    """Join a running sandbox to a network (§11.10); already a member is a no-op."""
    if not network_id:
        raise errors.ValidationFailed.field("id", "must not be empty")
    async with services.sessions() as session:
        await get_owned(session, user_id, sandbox_id)
        await get_owned_network(session, user_id, network_id)
    await queries.running_sandbox(services, user_id, sandbox_id)  # waits out creating/resuming (W)
    async with transaction(services.sessions) as session:
        sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
        if sandbox.status != SandboxStatus.RUNNING:
            raise errors.InvalidState(f"sandbox is {sandbox.status}; attach needs a running sandbox")
        network = await get_owned_network(session, user_id, network_id, for_update=True)
        member = await session.get(NetworkMember, (network.id, sandbox.id))
        if member is not None and member.status == "active":
            return
        if member is None:
            member = await join(session, network, sandbox.id)
        spec = host_spec(member, network)
    link = await hostlink.for_host(services, sandbox.host_id)
    try:
        await link.attach_network(sandbox.id, **spec)
    except (hostlink.HostError, hostlink.SandboxGoneError, hostlink.TierRefusedError) as exc:
        log.warning("network_attach_failed", sandbox_id=sandbox.id, network_id=network_id, error=str(exc))
        async with transaction(services.sessions) as session:
            await session.execute(
                delete(NetworkMember).where(
                    NetworkMember.network_id == network_id,
                    NetworkMember.sandbox_id == sandbox.id,
                    NetworkMember.status == "pending",
                )
            )
        if isinstance(exc, hostlink.SandboxGoneError):
            raise errors.InvalidState("sandbox is not running") from None
        if isinstance(exc, hostlink.TierRefusedError):  # the 409 as the host said it
            raise exc from None
        raise errors.ServerError(f"attaching the network failed on the host: {exc}") from None
    async with transaction(services.sessions) as session:
        member = await session.get(NetworkMember, (network_id, sandbox.id), with_for_update=True)
        if member is None:
            return  # destroyed or detached meanwhile
        member.status = "active"
        await webhooks.emit(
            session, user_id=user_id, action="network.attach", data=_event(network_id, sandbox, member.ip)
        )


async def detach(services: Services, user_id: str, sandbox_id: str, network_id: str) -> None:
    """Leave a network (§11.10): every non-terminal state; 404 when not a member."""
    async with services.sessions() as session:
        sandbox = await get_owned(session, user_id, sandbox_id)
        if sandbox.status in CLOSED:
            raise errors.InvalidState(f"sandbox is {sandbox.status}")
        member = (
            await session.scalars(
                select(NetworkMember)
                .join(Network, Network.id == NetworkMember.network_id)
                .where(
                    NetworkMember.network_id == network_id,
                    NetworkMember.sandbox_id == sandbox.id,
                    Network.user_id == user_id,
                )
            )
        ).first()
        if member is None:
            raise errors.NotFound("sandbox is not a member of this network")
    if sandbox.status != SandboxStatus.ERROR:
        try:
            link = await hostlink.for_host(services, sandbox.host_id)
            await link.detach_network(sandbox.id, network_id)
        except hostlink.SandboxGoneError:
            pass  # nothing left on the host to cut
        except hostlink.HostError as exc:
            raise errors.ServerError(f"detaching the network failed on the host: {exc}") from None
    async with transaction(services.sessions) as session:
        member = await session.get(NetworkMember, (network_id, sandbox.id), with_for_update=True)
        if member is None:
            return  # a concurrent detach or destroy got there first
        await session.delete(member)
        await webhooks.emit(
            session, user_id=user_id, action="network.detach", data=_event(network_id, sandbox, member.ip)
        )


async def boot_memberships(services: Services, sandbox_id: str) -> list[NetworkAttachBody]:
    """The memberships joined at create, sent inside the create/fork call: the host programs them
    during the boot, so a boot is one host call."""
    async with services.sessions() as session:
        specs = await host_specs(session, sandbox_id)
    return [NetworkAttachBody.model_validate(spec) for spec in specs]
