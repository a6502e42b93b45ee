"""Reading sandboxes: the caller's own (to change it, or once it runs), one as the API shows it, by
private IP, and pages of them (§11.4); ``?wait_for=`` long polls."""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from dataclasses import dataclass

from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import joinedload
from sqlalchemy.sql.elements import ColumnElement

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import ALL, BECOMING_RUNNING, TERMINAL, TRANSITIONAL, SandboxStatus
from paddock_core import errors
from paddock_core.timeutil import as_utc

#: The statuses ``?status=`` and ``?wait_for=`` accept (the wire strings).
STATUSES = ALL
MAX_WAIT_MS = 30_000
#: A waiter re-reads at least this often: changes made by another control-plane process wake nobody here.
REREAD_S = 0.25
#: How long a command or transfer waits for a sandbox on its way to ``running``.
WAIT_FOR_RUNNING_S = 30.0


# The caller's sandbox by id, built once with the values bound per call (the running-sandbox lookup
# is on every command; pause and resume read theirs with plain statements, ``transition.py``).
_OWNED = select(Sandbox).where(Sandbox.id == bindparam("sandbox_id"), Sandbox.user_id == bindparam("user_id"))
_OWNED_FOR_UPDATE = _OWNED.with_for_update()


async def get_owned(
    session: AsyncSession, user_id: str, sandbox_id: str, *, for_update: bool = False
) -> Sandbox:
    """The caller's sandbox row in any status (destroyed ones too), to change it; 404 if not theirs."""
    query = _OWNED_FOR_UPDATE if for_update else _OWNED
    sandbox = (await session.scalars(query, {"sandbox_id": sandbox_id, "user_id": user_id})).first()
    if sandbox is None:
        raise errors.NotFound("sandbox not found")
    return sandbox


async def running_sandbox(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    """The sandbox once it is ``running``; on its way there it waits up to 30 s, others get 409."""
    cached = services.running.get(sandbox_id)
    if cached is not None and cached.user_id == user_id:
        return cached
    deadline = time.monotonic() + WAIT_FOR_RUNNING_S
    delay = 0.05
    while True:
        changed = services.status_watch.watch(sandbox_id)
        sandbox = await services.reads.first(_OWNED, {"sandbox_id": sandbox_id, "user_id": user_id})
        if sandbox is None:
            raise errors.NotFound("sandbox not found")
        if sandbox.status == SandboxStatus.RUNNING:
            services.running.put(sandbox_id, sandbox)
            return sandbox
        if sandbox.status not in BECOMING_RUNNING or time.monotonic() >= deadline:
            raise errors.InvalidState(not_running(sandbox.id, sandbox.status))
        # Woken at once by a change this process commits (or, across processes, the status
        # notification); the growing delay bounds the re-reads otherwise.
        await services.status_watch.wait(changed, delay)
        delay = min(delay * 1.5, 0.5)


def not_running(sandbox_id: str, status: str) -> str:
    """The 409's message: the contract's words (§11.5), then the status and, when paused, how to resume."""
    if status == SandboxStatus.PAUSED:
        return (
            f"sandbox is not running: it is paused; resume it with POST /v1/sandboxes/{sandbox_id}/resume"
            " (sb.resume(), paddock sandbox resume)"
        )
    return f"sandbox is not running: it is {status}"


@dataclass(frozen=True)
class Wait:
    status: str
    timeout_s: float


def wait_params(wait_for: str | None, wait_ms: str | None) -> Wait | None:
    """``?wait_for=<status>&wait_ms=<0..30000>`` (an extension of §11.4; default 10 s)."""
    if wait_for is None or wait_for == "":
        if wait_ms:
            raise errors.ValidationFailed.field("wait_ms", "needs wait_for")
        return None
    if wait_for not in STATUSES:
        raise errors.ValidationFailed.field("wait_for", f"unknown status {wait_for!r}")
    try:
        timeout_ms = 10_000 if wait_ms is None or wait_ms == "" else int(wait_ms)
    except ValueError:
        raise errors.ValidationFailed.field("wait_ms", "must be an integer") from None
    if not 0 <= timeout_ms <= MAX_WAIT_MS:
        raise errors.ValidationFailed.field("wait_ms", f"must be between 0 and {MAX_WAIT_MS}")
    return Wait(wait_for, timeout_ms / 1000)


async def get_when(
    services: Services, user_id: str, sandbox_id: str, cutoff: dt.datetime, wait: Wait | None
) -> Sandbox:
    """The sandbox; with ``wait``, once it is in ``wait.status``, in a state it will not leave on its
    own (so the caller can decide), or when the wait is over — whichever comes first."""
    deadline = time.monotonic() + (wait.timeout_s if wait else 0)
    while True:
        changed = services.status_watch.watch(sandbox_id) if wait is not None else None
        sandbox = await services.reads.first(_GET, {"sandbox_id": sandbox_id, "user_id": user_id})
        if sandbox is None or not _is_retained(sandbox, cutoff):
            raise errors.NotFound("sandbox not found")
        remaining_s = deadline - time.monotonic()
        if (
            changed is None
            or wait is None
            or sandbox.status == wait.status
            or sandbox.status not in TRANSITIONAL
        ):
            return sandbox
        if remaining_s <= 0:
            return sandbox
        await services.status_watch.wait(changed, min(remaining_s, REREAD_S))


def _retained(cutoff: dt.datetime) -> ColumnElement[bool]:
    """Destroyed rows stay readable for the retention window, then read as missing."""
    return or_(
        Sandbox.status != SandboxStatus.DESTROYED,
        Sandbox.destroyed_at.is_(None),
        Sandbox.destroyed_at >= cutoff,
    )


# Built once, with the values bound per call: building the statement cost more than running it, and
# GET is polled hard. One statement with its memberships joined: one trip to the database, not two.
# The retention window is checked on the row (``_is_retained``), so the statement's parameters stay
# the same from one poll to the next and ``PointReads`` can keep its result.
_GET = (
    select(Sandbox)
    .options(joinedload(Sandbox.memberships))
    .where(Sandbox.id == bindparam("sandbox_id"), Sandbox.user_id == bindparam("user_id"))
)


def _is_retained(sandbox: Sandbox, cutoff: dt.datetime) -> bool:
    """``_retained`` for a row in hand."""
    if sandbox.status != SandboxStatus.DESTROYED or sandbox.destroyed_at is None:
        return True
    return as_utc(sandbox.destroyed_at) >= cutoff


async def by_ip(session: AsyncSession, user_id: str, ip: str) -> Sandbox:
    try:
        address = str(ipaddress.ip_address(ip))
    except ValueError:
        raise errors.ValidationFailed.field("ip", f"{ip!r} is not an IP address") from None
    sandbox = (
        await session.scalars(
            select(Sandbox)
            .where(
                Sandbox.user_id == user_id,
                Sandbox.ip == address,
                Sandbox.status.not_in(TERMINAL),
            )
            .order_by(Sandbox.created_at.desc())
        )
    ).first()
    if sandbox is None:
        raise errors.NotFound("sandbox not found")
    return sandbox


async def page(
    session: AsyncSession,
    user_id: str,
    *,
    status: str | None,
    limit: int,
    offset: int,
    cutoff: dt.datetime,
    metadata: dict[str, str] | None = None,
) -> tuple[list[Sandbox], int]:
    """A page of the caller's sandboxes; ``metadata`` keeps those whose labels hold every pair."""
    if status is not None and status not in STATUSES:
        raise errors.ValidationFailed.field("status", f"unknown status {status!r}")
    where = [Sandbox.user_id == user_id, _retained(cutoff)]
    if status:
        where.append(Sandbox.status == status)
    for key, value in (metadata or {}).items():
        where.append(Sandbox.labels[key].as_string() == value)
    total = await session.scalar(select(func.count()).select_from(Sandbox).where(*where))
    rows = await session.scalars(
        select(Sandbox).where(*where).order_by(Sandbox.created_at, Sandbox.id).limit(limit).offset(offset)
    )
    return list(rows.all()), int(total or 0)
