"""Per-second compute billing (§13.3): 0.0504 USD per vCPU-hour + 0.0162 USD per GiB-hour while running.

At 100 credits per USD that is exactly 1400 micro-credits per vCPU-second and 450 per GiB-second,
so balances stay integers. Shapes with a CPU quota are billed for the fraction of a vCPU they get
(``s-0.25vcpu-512mb`` pays for 0.25 vCPU). Nothing is charged while paused.

Stored bytes (issue #34, an extension): a ready snapshot (its ``size_bytes``) and a volume (its size,
as provisioned) cost 0.10 USD per GiB-month (30 days), charged by ``storage_pass`` in whole seconds
since each row's ``billed_until`` as ``storage`` ledger entries.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.snapshots import READY as SNAPSHOT_READY
from paddock_controlplane.records.snapshots import Snapshot
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.records.volumes import DELETING as VOLUME_DELETING
from paddock_controlplane.records.volumes import READY as VOLUME_READY
from paddock_controlplane.records.volumes import Volume
from paddock_controlplane.resources import accounts
from paddock_core.timeutil import as_utc

MICRO_PER_VCPU_SECOND = 1400  # 0.0504 USD/h × 100 credits/USD × 1e6 / 3600
MICRO_PER_GIB_SECOND = 450  # 0.0162 USD/h × 100 credits/USD × 1e6 / 3600
MICRO_PER_STORED_GIB_MONTH = 10_000_000  # 0.10 USD × 100 credits/USD × 1e6
MONTH_S = 30 * 86_400
GIB = 1 << 30


def cost_micro(*, vcpu: int, cpu_quota_pct: int | None, mem_mib: int, seconds: int) -> int:
    """Micro-credits for ``seconds`` of running; exact for whole vCPUs and whole GiB."""
    cpu_hundredths = cpu_quota_pct if cpu_quota_pct is not None else vcpu * 100
    numerator = (
        cpu_hundredths * MICRO_PER_VCPU_SECOND * 1024 + mem_mib * MICRO_PER_GIB_SECOND * 100
    ) * seconds
    return numerator // (100 * 1024)


async def settle(session: AsyncSession, sandbox: Sandbox, now: dt.datetime) -> int:
    """Charge whole seconds since ``billed_until``; returns the micro-credits charged."""
    if sandbox.billed_until is None:
        sandbox.billed_until = now
        return 0
    seconds = int((as_utc(now) - as_utc(sandbox.billed_until)).total_seconds())
    if seconds <= 0:
        return 0
    charged = cost_micro(
        vcpu=sandbox.vcpu, cpu_quota_pct=sandbox.cpu_quota_pct, mem_mib=sandbox.mem_mib, seconds=seconds
    )
    sandbox.billed_until = as_utc(sandbox.billed_until) + dt.timedelta(seconds=seconds)
    if charged:
        await accounts.add_credits(session, sandbox.user_id, -charged, kind="compute", ref=sandbox.id)
    return charged


async def billing_pass(session: AsyncSession, now: dt.datetime) -> set[str]:
    """Settle every running sandbox; returns the users whose balance is now used up.

    Several control planes run this side by side on PostgreSQL. The running rows are locked first
    (``SKIP LOCKED``: a row another pass or a pause/destroy holds is settled by that transaction, and
    this pass charges it next time from the ``billed_until`` it left), so no second is charged twice;
    users are then charged in id order, so two passes never wait on each other's users. Every other
    writer takes a sandbox's row before its user's, as this pass does.
    """
    exhausted: set[str] = set()
    query = (
        select(Sandbox)
        .where(Sandbox.status == SandboxStatus.RUNNING)
        .order_by(Sandbox.user_id, Sandbox.id)
        .with_for_update(skip_locked=True)
    )
    running = (await session.scalars(query)).all()
    for sandbox in running:
        await settle(session, sandbox, now)
    for user_id in {s.user_id for s in running}:
        if await accounts.balance_micro(session, user_id) <= 0:
            exhausted.add(user_id)
    return exhausted


def storage_cost_micro(size_bytes: int, seconds: int) -> int:
    """Micro-credits for keeping ``size_bytes`` for ``seconds`` (rounded down)."""
    return size_bytes * seconds * MICRO_PER_STORED_GIB_MONTH // (GIB * MONTH_S)


def _accrue(row: Snapshot | Volume, size_bytes: int, now: dt.datetime) -> int:
    """What the row owes since it was last charged; moves its ``billed_until`` on by whole seconds."""
    since = as_utc(row.billed_until or row.created_at)
    seconds = int((as_utc(now) - since).total_seconds())
    if seconds <= 0:
        return 0
    row.billed_until = since + dt.timedelta(seconds=seconds)
    return storage_cost_micro(size_bytes, seconds)


async def storage_pass(session: AsyncSession, now: dt.datetime) -> set[str]:
    """Charges every kept snapshot and volume; returns the users whose balance is now used up.

    Users are taken in id order, each user's row locked before their snapshots' and volumes' rows (the
    order every other writer of those rows takes: create, resize and delete lock the owner first), so
    two control planes' passes, or a pass and a delete, never wait on each other in a cycle."""
    owners = set(await session.scalars(select(Snapshot.user_id).where(Snapshot.status == SNAPSHOT_READY)))
    owners |= set(
        await session.scalars(
            select(Volume.user_id).where(Volume.status.in_((VOLUME_READY, VOLUME_DELETING)))
        )
    )
    exhausted: set[str] = set()
    for user_id in sorted(owners):
        await accounts.lock_user(session, user_id)
        charged: dict[str, int] = {}
        snapshots = await session.scalars(
            select(Snapshot)
            .where(Snapshot.user_id == user_id, Snapshot.status == SNAPSHOT_READY)
            .order_by(Snapshot.id)
            .with_for_update()
        )
        for snapshot in snapshots.all():
            charged[snapshot.id] = _accrue(snapshot, int(snapshot.size_bytes or 0), now)
        volumes = await session.scalars(
            select(Volume)
            .where(Volume.user_id == user_id, Volume.status.in_((VOLUME_READY, VOLUME_DELETING)))
            .order_by(Volume.id)
            .with_for_update()
        )
        for volume in volumes.all():
            charged[volume.id] = _accrue(volume, int(volume.size_mib) << 20, now)
        for ref, amount in charged.items():
            if amount:
                await accounts.add_credits(session, user_id, -amount, kind="storage", ref=ref)
        if await accounts.balance_micro(session, user_id) <= 0:
            exhausted.add(user_id)
    return exhausted
