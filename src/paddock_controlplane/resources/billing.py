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
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_controlplane.records.models import CreditEntry, Sandbox, User
from paddock_controlplane.records.snapshots import READY as SNAPSHOT_READY
from paddock_controlplane.records.snapshots import Snapshot
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.records.volumes import DELETING as VOLUME_DELETING
from paddock_controlplane.records.volumes import READY as VOLUME_READY
from paddock_controlplane.records.volumes import Volume
from paddock_controlplane.resources import accounts
from paddock_core.db import transaction
from paddock_core.timeutil import as_utc, utcnow

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


#: Running sandboxes settled per transaction by the compute pass: each batch holds its rows and their
#: owners' rows only for its own few milliseconds, so a create, pause or resume never waits on a pass.
BATCH_ROWS = 1000

_SANDBOXES = cast(Table, Sandbox.__table__)
_USERS = cast(Table, User.__table__)
#: A batch of running sandboxes, by id after the last batch, the rows locked; one another transaction
#: holds (a pause, a destroy, another control plane's pass) is skipped, and settled by that transaction
#: or charged next time from the ``billed_until`` it leaves.
_DUE = (
    select(
        Sandbox.id,
        Sandbox.user_id,
        Sandbox.vcpu,
        Sandbox.cpu_quota_pct,
        Sandbox.mem_mib,
        Sandbox.billed_until,
    )
    .where(Sandbox.status == SandboxStatus.RUNNING, Sandbox.id > bindparam("after"))
    .order_by(Sandbox.id)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
_BILLED_UNTIL = (
    update(_SANDBOXES).where(_SANDBOXES.c.id == bindparam("b_id")).values(billed_until=bindparam("b_until"))
)
_CHARGE = (
    update(_USERS)
    .where(_USERS.c.id == bindparam("b_user"))
    .values(credits_micro=_USERS.c.credits_micro - bindparam("b_amount"))
)
_LEDGER = insert(cast(Table, CreditEntry.__table__))
#: The same two writes on PostgreSQL, each one statement over arrays: as many UPDATEs as rows (asyncpg's
#: executemany) took 55-70 ms a batch of 1,000, most of a pass.
_BILLED_UNTIL_PG = text(
    "UPDATE sandboxes SET billed_until = moved.until"
    " FROM unnest(CAST(:ids AS VARCHAR[]), CAST(:untils AS TIMESTAMPTZ[])) AS moved(id, until)"
    " WHERE sandboxes.id = moved.id"
)
_LEDGER_PG = text(
    "INSERT INTO credit_entries (user_id, amount_micro, kind, ref, created_at)"
    " SELECT line.user_id, line.amount_micro, 'compute', line.ref, :at"
    " FROM unnest(CAST(:users AS VARCHAR[]), CAST(:amounts AS BIGINT[]), CAST(:refs AS VARCHAR[]))"
    " AS line(user_id, amount_micro, ref)"
)
_EMPTIED = select(User.id).where(User.id.in_(bindparam("users", expanding=True)), User.credits_micro <= 0)


@dataclass
class Batch:
    """What one batch of the compute pass did: the last sandbox id read (None: nothing was left), whether
    the batch was full (more may follow), and the owners read whose balance is now used up."""

    last_id: str | None
    full: bool
    exhausted: set[str]


async def settle_batch(session: AsyncSession, now: dt.datetime, *, after: str, limit: int) -> Batch:
    """Settles up to ``limit`` running sandboxes with ids after ``after``, as :func:`settle` would one by
    one, in five statements: the rows locked and read, their ``billed_until`` moved on, one ledger line
    per sandbox charged (``compute``, named after it), and each owner's balance lowered by the batch's
    sum, owners in id order; then which of the batch's owners have nothing left."""
    rows = (await session.execute(_DUE, {"after": after, "limit": limit})).all()
    if not rows:
        return Batch(None, False, set())
    moved: list[dict[str, Any]] = []
    lines: list[dict[str, Any]] = []
    owed: dict[str, int] = {}
    for row in rows:
        if row.billed_until is None:
            moved.append({"b_id": row.id, "b_until": now})
            continue
        since = as_utc(row.billed_until)
        seconds = int((as_utc(now) - since).total_seconds())
        if seconds <= 0:
            continue
        moved.append({"b_id": row.id, "b_until": since + dt.timedelta(seconds=seconds)})
        charged = cost_micro(
            vcpu=row.vcpu, cpu_quota_pct=row.cpu_quota_pct, mem_mib=row.mem_mib, seconds=seconds
        )
        if charged:
            lines.append({"user_id": row.user_id, "amount_micro": -charged, "kind": "compute", "ref": row.id})
            owed[row.user_id] = owed.get(row.user_id, 0) + charged
    postgresql = session.get_bind().dialect.name == "postgresql"
    if moved and postgresql:
        ids, untils = [m["b_id"] for m in moved], [m["b_until"] for m in moved]
        await session.execute(_BILLED_UNTIL_PG, {"ids": ids, "untils": untils})
    elif moved:
        await session.execute(_BILLED_UNTIL, moved)
    if lines and postgresql:
        users, amounts, refs = ([line[key] for line in lines] for key in ("user_id", "amount_micro", "ref"))
        await session.execute(_LEDGER_PG, {"users": users, "amounts": amounts, "refs": refs, "at": utcnow()})
    elif lines:
        await session.execute(_LEDGER, lines)
    if lines:
        await session.execute(_CHARGE, [{"b_user": user, "b_amount": owed[user]} for user in sorted(owed)])
    owners = sorted({str(row.user_id) for row in rows})
    exhausted = set((await session.scalars(_EMPTIED, {"users": owners})).all())
    return Batch(str(rows[-1].id), len(rows) >= limit, exhausted)


async def billing_pass(
    sessions: async_sessionmaker[AsyncSession], now: dt.datetime, *, batch_rows: int | None = None
) -> set[str]:
    """Settle every running sandbox up to ``now``, a batch per transaction (:func:`settle_batch`);
    returns the users whose balance is now used up.

    Several control planes run this side by side on PostgreSQL. A batch locks its rows first (``SKIP
    LOCKED``), so no second is charged twice: a row another pass or a pause/destroy holds is settled by
    that transaction, and this pass or the next charges it from the ``billed_until`` it left. Owners are
    charged in id order within a batch, after its sandboxes' rows, the order every other writer takes
    (a sandbox's row before its user's), so passes and pauses never wait on each other in a cycle; and
    a batch commits in milliseconds, so a create never waits on a pass (before, one transaction held
    every owner's row for the whole pass: over 30 s at 100,000 sandboxes).
    """
    limit = batch_rows or BATCH_ROWS
    exhausted: set[str] = set()
    after = ""
    while True:
        async with transaction(sessions) as session:
            batch = await settle_batch(session, now, after=after, limit=limit)
        exhausted |= batch.exhausted
        if batch.last_id is None or not batch.full:
            return exhausted
        after = batch.last_id


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
