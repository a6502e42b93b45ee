"""Users, API keys and credits.

API keys are random (``pdk_`` + 32 random bytes), shown once at creation and stored only as a
SHA-256 hash: a high-entropy key needs no slow hash, and lookups stay one indexed read.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from paddock_controlplane.records.models import ApiKey, CreditEntry, Plan, Sandbox, User
from paddock_controlplane.records.principals import Principal
from paddock_controlplane.records.states import TOWARD_RUNNING
from paddock_core import errors
from paddock_core.crypto import random_token, sha256_hex
from paddock_core.ids import new_id
from paddock_core.timeutil import start_of_utc_day, utcnow

MICRO = 1_000_000
KEY_PREFIX = "pdk_"


@dataclass(frozen=True)
class IssuedKey:
    id: str
    user_id: str
    plaintext: str


async def get_plan(session: AsyncSession, plan_id: str) -> Plan:
    plan = await session.get(Plan, plan_id)
    if plan is None:
        known = ", ".join((await session.scalars(select(Plan.id))).all())
        raise errors.ValidationFailed.field("plan", f"unknown plan {plan_id!r}; one of {known}")
    return plan


async def create_user(
    session: AsyncSession, *, plan_id: str, signup_credits: int, name: str | None = None
) -> User:
    await get_plan(session, plan_id)
    user = User(id=new_id("usr_"), name=name, plan_id=plan_id, credits_micro=0, lock_version=0)
    session.add(user)
    await session.flush()
    await add_credits(session, user.id, signup_credits * MICRO, kind="signup")
    return user


async def set_plan(session: AsyncSession, user_id: str, plan_id: str) -> User:
    await get_plan(session, plan_id)
    user = await require_user(session, user_id)
    user.plan_id = plan_id
    return user


async def require_user(session: AsyncSession, user_id: str) -> User:
    user = await session.get(User, user_id)
    if user is None:
        raise errors.NotFound(f"user {user_id} not found")
    return user


async def create_key(session: AsyncSession, user_id: str) -> IssuedKey:
    await require_user(session, user_id)
    plaintext = random_token(KEY_PREFIX, 32)
    key = ApiKey(id=new_id("key_"), user_id=user_id, prefix=plaintext[:10], key_hash=sha256_hex(plaintext))
    session.add(key)
    await session.flush()
    return IssuedKey(id=key.id, user_id=user_id, plaintext=plaintext)


async def revoke_key(session: AsyncSession, key_id: str) -> ApiKey:
    key = await session.get(ApiKey, key_id)
    if key is None:
        raise errors.NotFound(f"key {key_id} not found")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    return key


async def list_keys(session: AsyncSession, user_id: str | None = None) -> list[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if user_id:
        query = query.where(ApiKey.user_id == user_id)
    return list((await session.scalars(query)).all())


async def authenticate(session: AsyncSession, presented: str | None) -> Principal:
    if not presented or not presented.startswith(KEY_PREFIX):
        raise errors.Unauthorized()
    row = (
        await session.execute(
            select(ApiKey.id, ApiKey.user_id, ApiKey.revoked_at, User.plan_id)
            .join(User, User.id == ApiKey.user_id)
            .where(ApiKey.key_hash == sha256_hex(presented))
        )
    ).first()
    if row is None or row.revoked_at is not None:
        raise errors.Unauthorized()
    return Principal(user_id=row.user_id, plan_id=row.plan_id, key_id=row.id)


@dataclass(frozen=True)
class LockedUser:
    """What a quota check needs about the caller, read by the same statement that locks the row."""

    plan_id: str
    credits_micro: int


# The per-request account statements, built once and on the table rather than the mapped class: an ORM
# ``update(User)`` also re-synchronises the session's User objects on every call, which cost more than
# the statement itself (~0.7 ms against ~0.25 ms on SQLite, in every create, resume and billed pause).
# Nothing holds a User object across these, so there is nothing to synchronise.
_USERS = cast(Table, User.__table__)
_CREDIT_ENTRIES = cast(Table, CreditEntry.__table__)
_LOCK_USER = (
    update(_USERS)
    .where(_USERS.c.id == bindparam("user_id"))
    .values(lock_version=_USERS.c.lock_version + 1)
    .returning(_USERS.c.plan_id, _USERS.c.credits_micro)
)
_ADD_CREDITS = (
    update(_USERS)
    .where(_USERS.c.id == bindparam("user_id"))
    .values(credits_micro=_USERS.c.credits_micro + bindparam("amount_micro"))
)
#: The ledger line of a balance change (its id and time from the columns' defaults).
_RECORD_CREDIT = insert(_CREDIT_ENTRIES)
_LIVE_COUNT = select(func.count()).where(
    Sandbox.user_id == bindparam("user_id"), Sandbox.status.in_(TOWARD_RUNNING)
)
_CREATED_SINCE = select(func.count()).where(
    Sandbox.user_id == bindparam("user_id"), Sandbox.created_at >= bindparam("since")
)
#: The two caps' counts as columns (parameters ``user_id`` and ``since``), for a create or fork that
#: reads them in the statement of everything else it checks under the user lock (``lifecycle._CHECKS``).
LIVE_COUNT = _LIVE_COUNT.scalar_subquery()
CREATED_SINCE = _CREATED_SINCE.scalar_subquery()


async def lock_user(session: AsyncSession, user_id: str) -> LockedUser:
    """Serialise quota checks per user on both engines; returns the user's plan and balance.

    A write as the transaction's first statement takes PostgreSQL's row lock and SQLite's database
    write lock, so two concurrent creates cannot both read the same count and both pass. RETURNING
    (PostgreSQL, SQLite >= 3.35) saves the reads that used to follow.
    """
    row = (await session.execute(_LOCK_USER, {"user_id": user_id})).first()
    if row is None:
        raise errors.NotFound(f"user {user_id} not found")
    return LockedUser(plan_id=str(row.plan_id), credits_micro=int(row.credits_micro))


_PLAN_TTL_S = 5.0
_plans: dict[tuple[str, str], tuple[float, Plan]] = {}


async def cached_plan(session: AsyncSession, plan_id: str) -> Plan:
    """A plan's limits, re-read at most every few seconds: plans are data that changes rarely."""
    bind = session.bind  # an engine, or a connection (tests bind sessions to one)
    url = "" if bind is None else str(bind.url if isinstance(bind, AsyncEngine) else bind.engine.url)
    key = (url, plan_id)
    hit = _plans.get(key)
    if hit is not None and time.monotonic() - hit[0] < _PLAN_TTL_S:
        return hit[1]
    loaded = await get_plan(session, plan_id)
    # A transient copy: it belongs to no session, so no rollback or commit can expire its attributes.
    plan = Plan(**{column.key: getattr(loaded, column.key) for column in Plan.__table__.columns})
    _plans[key] = (time.monotonic(), plan)
    return plan


async def add_credits(
    session: AsyncSession, user_id: str, amount_micro: int, *, kind: str, ref: str | None = None
) -> None:
    # Two plain statements: an ORM object for the ledger line, flushed at commit, cost each charged
    # pause or resume ~0.35 ms more of CPU than one that charged nothing.
    entry = {"user_id": user_id, "amount_micro": amount_micro, "kind": kind, "ref": ref}
    await session.execute(_RECORD_CREDIT, entry)
    await session.execute(_ADD_CREDITS, {"user_id": user_id, "amount_micro": amount_micro})


async def balance_micro(session: AsyncSession, user_id: str) -> int:
    value = await session.scalar(select(User.credits_micro).where(User.id == user_id))
    if value is None:
        raise errors.NotFound("user not found")
    return int(value)


async def check_credit(session: AsyncSession, user_id: str) -> None:
    if await balance_micro(session, user_id) <= 0:
        raise errors.InsufficientCredit("no credit left on this account")


def require_credit(account: LockedUser) -> None:
    """The balance read when the user's row was locked must be positive."""
    if account.credits_micro <= 0:
        raise errors.InsufficientCredit("no credit left on this account")


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


async def check_slot(session: AsyncSession, plan: Plan, user_id: str) -> None:
    """The concurrent sandbox cap, for a paused sandbox about to run again; the caller holds the user
    lock (§14.2). A create or a fork counts both caps in its one statement of checks."""
    live = await session.scalar(_LIVE_COUNT, {"user_id": user_id})
    refuse_over_caps(plan, live=int(live or 0), today=None)


def refuse_over_caps(plan: Plan, *, live: int | None, today: int | None) -> None:
    """The caps' refusals, from counts read under the user lock; ``None``: that cap does not apply."""
    if live is not None and live >= plan.concurrent_sandboxes:
        raise errors.QuotaExceeded(f"concurrent sandbox cap reached: limit {plan.concurrent_sandboxes}")
    if today is not None and today >= plan.sandboxes_per_day:
        raise errors.QuotaExceeded(f"daily sandbox cap reached: limit {plan.sandboxes_per_day} per day")


def day_start(now: dt.datetime | None = None) -> dt.datetime:
    """Per-day caps count creations since 00:00 UTC of the current day (§14.2)."""
    return start_of_utc_day(now or utcnow())
