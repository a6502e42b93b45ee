"""The one way a sandbox's state change is recorded around a call to its host.

Every change follows the same three steps: (1) a short transaction records the transitional status
(``pausing``, ``resuming``, ``destroying``; ``creating``/``forking`` when the row is written) after the
caller's own checks; (2) the host is called outside any transaction, so no lock is held across the
network; (3) :func:`settle` records the outcome in a second transaction, together with its webhook
event (``webhooks.emit`` writes the outbox row in that same transaction) — but only if the row is still
in a status the caller expects, since a destroy may have overtaken a pause, say. A process that dies
between (1) and (3) leaves the transitional status, which the reconciler settles.

Step (1) differs per operation (which locks, which checks, which statuses are a no-op), so it stays
with the operation; :func:`claim` is its one-statement form, for a change that only needs the status.
(2) and (3) are here.

Pause and resume run these steps on every call, so they are written as plain statements rather than
through the ORM's unit of work (``settle(..., plain=True)``): step (3) reads the row and its memberships
in one locked statement and writes back only the columns the outcome changed (a third of the ORM's
cost per statement here). The caches and waiters the ORM's flush hooks (``hotcache``) would have told
are told here (:func:`changing`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from sqlalchemy import Row, Table, Update, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.attributes import instance_state, manager_of_class, set_committed_value

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.hotcache import drop_sandbox
from paddock_controlplane.records.models import NetworkMember, Sandbox
from paddock_controlplane.records.services import Services
from paddock_core import errors
from paddock_core.db import transaction, transaction_connection

T = TypeVar("T")

_SANDBOXES = cast(Table, Sandbox.__table__)
_MEMBERS = cast(Table, NetworkMember.__table__)
#: The sandbox's columns by attribute name (the same as the column names).
_COLUMNS: tuple[str, ...] = tuple(column.key for column in _SANDBOXES.columns)
_COLUMN_SET = frozenset(_COLUMNS)

# Built once, with the values bound per call.
#: Step (1) in one statement: the caller's sandbox moves from one status to another if it is in the
#: first; RETURNING what the host call needs.
_CLAIM = (
    update(_SANDBOXES)
    .where(
        _SANDBOXES.c.id == bindparam("b_sandbox_id"),
        _SANDBOXES.c.user_id == bindparam("b_user_id"),
        _SANDBOXES.c.status == bindparam("from_status"),
    )
    .values(status=bindparam("to_status"))
    .returning(_SANDBOXES.c.host_id, _SANDBOXES.c.disk_mib)
)
#: The status of the caller's sandbox (and what the host call needs), its row locked.
_OWNED = (
    select(_SANDBOXES.c.status, _SANDBOXES.c.host_id, _SANDBOXES.c.disk_mib)
    .where(_SANDBOXES.c.id == bindparam("sandbox_id"), _SANDBOXES.c.user_id == bindparam("user_id"))
    .with_for_update()
)
#: Step (3)'s read: the row and its memberships (one result row each, none without), the sandbox's row
#: locked. PostgreSQL cannot lock the nullable side of an outer join, so only ``sandboxes`` is named.
_LOCKED_ROW = (
    select(
        _SANDBOXES,
        _MEMBERS.c.network_id.label("member_network_id"),
        _MEMBERS.c.ip.label("member_ip"),
        _MEMBERS.c.status.label("member_status"),
    )
    .outerjoin(_MEMBERS, _MEMBERS.c.sandbox_id == _SANDBOXES.c.id)
    .where(_SANDBOXES.c.id == bindparam("sandbox_id"))
    .order_by(_MEMBERS.c.created_at)
    .with_for_update(of=_SANDBOXES)
)


@dataclass(frozen=True)
class Owned:
    """What step (1) reads of the caller's sandbox: its status and what the host call needs."""

    status: str
    host_id: str | None
    disk_mib: int


async def owned(session: AsyncSession, user_id: str, sandbox_id: str) -> Owned:
    """The caller's sandbox (any status), its row locked until the transaction ends; 404 if not theirs."""
    params = {"sandbox_id": sandbox_id, "user_id": user_id}
    row = (await (await transaction_connection(session)).execute(_OWNED, params)).first()
    if row is None:
        raise errors.NotFound("sandbox not found")
    return Owned(status=row.status, host_id=row.host_id, disk_mib=int(row.disk_mib))


def require_status(current: Owned, expect: str, verb: str) -> None:
    if current.status != expect:
        raise errors.InvalidState(f"sandbox is {current.status}; only a {expect} sandbox can be {verb}")


async def claim(
    session: AsyncSession, user_id: str, sandbox_id: str, *, expect: str, to: str, verb: str
) -> Owned:
    """Step (1) when only the status decides: the caller's sandbox goes from ``expect`` to ``to``, in one
    statement when it is in ``expect``. Otherwise 404 when it is not theirs, or 409 ``sandbox is
    <status>; only a <expect> sandbox can be <verb>`` (:func:`require_status`)."""
    # (An UPDATE's parameters may not be named like its columns.)
    params = {"b_sandbox_id": sandbox_id, "b_user_id": user_id, "from_status": expect, "to_status": to}
    connection = await transaction_connection(session)
    while True:
        row = (await connection.execute(_CLAIM, params)).first()
        if row is not None:
            _changed(session, sandbox_id)
            return Owned(status=to, host_id=row.host_id, disk_mib=int(row.disk_mib))
        # Not in ``expect`` (or not theirs): say why. Should it have come back to ``expect`` between
        # the two statements (PostgreSQL; SQLite holds the write lock), its row is locked now, so the
        # claim cannot miss again.
        require_status(await owned(session, user_id, sandbox_id), expect, verb)


async def locked_row(session: AsyncSession, sandbox_id: str) -> Sandbox | None:
    """The sandbox with its memberships, its row locked until the transaction ends; ``None`` if gone.

    The object belongs to no session: change it, then :func:`write_back` what changed."""
    rows = (
        await (await transaction_connection(session)).execute(_LOCKED_ROW, {"sandbox_id": sandbox_id})
    ).all()
    return _sandbox(rows) if rows else None


def _sandbox(rows: Sequence[Row[Any]]) -> Sandbox:
    first = rows[0]._mapping
    sandbox = _loaded(Sandbox, {key: first[key] for key in _COLUMNS})
    members = [
        _loaded(
            NetworkMember,
            {
                "network_id": row.member_network_id,
                "sandbox_id": sandbox.id,
                "ip": row.member_ip,
                "status": row.member_status,
            },
        )
        for row in rows
        if row.member_network_id is not None
    ]
    set_committed_value(sandbox, "memberships", members)
    return sandbox


_M = TypeVar("_M", Sandbox, NetworkMember)


def _loaded(model: type[_M], values: dict[str, Any]) -> _M:
    """An instance holding ``values`` as its loaded state, as the ORM's loader fills one: the mapped
    constructor records each keyword as a change (events, history), which was most of building the
    row here. Changes made afterwards are tracked as usual."""
    if not model.__mapper__.configured:  # setting attributes needs the mapping complete
        configure_mappers()
    instance: _M = manager_of_class(model).new_instance()
    instance.__dict__.update(values)
    return instance


async def write_back(session: AsyncSession, sandbox: Sandbox) -> None:
    """One UPDATE of the columns set since :func:`locked_row` read them to a value other than the one
    read (nothing when none was). The instance's own change tracking says which were set, and what
    they held before, so no copy of the row is taken or compared."""
    state = instance_state(sandbox)
    current = state.dict
    values = {
        "v_" + key: current[key]
        for key, old in state.committed_state.items()
        if key in _COLUMN_SET and current[key] != old
    }
    if values:
        values["b_sandbox_id"] = sandbox.id
        await (await transaction_connection(session)).execute(_update_of(frozenset(values)), values)
        _changed(session, sandbox.id)


@functools.cache
def _update_of(names: frozenset[str]) -> Update:
    """The UPDATE of the columns named ``v_<column>`` (one per set of columns an outcome changes, built
    once: building and keying a statement costs as much as running it)."""
    columns: dict[str, Any] = {name[2:]: bindparam(name) for name in names if name.startswith("v_")}
    return update(_SANDBOXES).where(_SANDBOXES.c.id == bindparam("b_sandbox_id")).values(columns)


def _changed(session: AsyncSession, sandbox_id: str) -> None:
    """The row leaves the hot caches at once, as an ORM flush of it would do (its waiters are woken by
    :func:`changing` once the change commits)."""
    drop_sandbox(session.info, sandbox_id)


@asynccontextmanager
async def changing(services: Services, sandbox_id: str) -> AsyncIterator[AsyncSession]:
    """A transaction that changes the sandbox's row with :func:`claim` or :func:`write_back`; once it
    commits, this process's waiters on the sandbox are woken (as ``hotcache.wake_watchers`` does after
    an ORM flush). Other processes hear of it from the status trigger's NOTIFY."""
    async with transaction(services.sessions) as session:
        yield session
    services.status_watch.changed(sandbox_id)


@dataclass(frozen=True)
class Settled(Generic[T]):
    """What step (3) found and did."""

    #: The row after the outcome was recorded; ``None`` if it no longer exists, or if a failure was
    #: not to be recorded (``on_failure`` left out).
    row: Sandbox | None
    #: Whether the outcome was written (the row was still in one of the expected statuses).
    recorded: bool
    #: The host's failure, or ``None`` when the call succeeded.
    error: Exception | None


async def settle(
    services: Services,
    sandbox_id: str,
    call: Callable[[], Awaitable[T]],
    *,
    expect: Collection[str],
    on_success: Callable[[AsyncSession, Sandbox, T], Awaitable[None]],
    on_failure: Callable[[AsyncSession, Sandbox, Exception], Awaitable[None]] | None = None,
    failures: tuple[type[Exception], ...] = (hostlink.HostError,),
    plain: bool = False,
) -> Settled[T]:
    """Call the host, then record the outcome if the row is still in ``expect``.

    The callbacks change the row they are given (and may write more in the session: billing, the
    webhook outbox). ``failures`` are the exceptions that are an outcome to record (anything else
    propagates and records nothing). Without ``on_failure`` a failure is left as it is: the row stays in
    its transitional status for the reconciler to retry.

    By default the row is the session's own (loaded with its memberships, flushed at commit), so an
    outcome may change related rows too and the answer shows them. With ``plain`` it is read by
    :func:`locked_row` and only the columns the callbacks changed are written back (:func:`write_back`):
    for outcomes that change the sandbox's own columns only (pause, resume), at a third of the cost.
    """
    try:
        value = await call()
    except failures as exc:
        if on_failure is None:
            return Settled(row=None, recorded=False, error=exc)
        failure = exc

        async def failed(session: AsyncSession, row: Sandbox) -> None:
            await on_failure(session, row, failure)

        row, recorded = await _record(services, sandbox_id, expect, failed, plain=plain)
        return Settled(row=row, recorded=recorded, error=exc)

    async def succeeded(session: AsyncSession, row: Sandbox) -> None:
        await on_success(session, row, value)

    row, recorded = await _record(services, sandbox_id, expect, succeeded, plain=plain)
    return Settled(row=row, recorded=recorded, error=None)


async def _record(
    services: Services,
    sandbox_id: str,
    expect: Collection[str],
    outcome: Callable[[AsyncSession, Sandbox], Awaitable[None]],
    *,
    plain: bool,
) -> tuple[Sandbox | None, bool]:
    if not plain:
        async with transaction(services.sessions) as session:
            row = await session.get(Sandbox, sandbox_id, with_for_update=True)
            recorded = row is not None and row.status in expect
            if row is not None and recorded:
                await outcome(session, row)
        return row, recorded
    async with changing(services, sandbox_id) as session:
        row = await locked_row(session, sandbox_id)
        recorded = row is not None and row.status in expect
        if row is not None and recorded:
            await outcome(session, row)
            await write_back(session, row)
    return row, recorded
