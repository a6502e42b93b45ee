"""Reading sandboxes: one, by private IP, and pages of them (§11.4)."""

from __future__ import annotations

import datetime as dt
import ipaddress

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.models import Sandbox
from paddock_core import errors

STATUSES = (
    "creating",
    "running",
    "pausing",
    "paused",
    "resuming",
    "forking",
    "error",
    "destroying",
    "destroyed",
    "failed",
)


def _retained(cutoff: dt.datetime) -> object:
    """Destroyed rows stay readable for the retention window, then read as missing."""
    return or_(Sandbox.status != "destroyed", Sandbox.destroyed_at.is_(None), Sandbox.destroyed_at >= cutoff)


async def get(session: AsyncSession, user_id: str, sandbox_id: str, cutoff: dt.datetime) -> Sandbox:
    sandbox = (
        await session.scalars(
            select(Sandbox).where(Sandbox.id == sandbox_id, Sandbox.user_id == user_id, _retained(cutoff))
        )
    ).first()
    if sandbox is None:
        raise errors.NotFound("sandbox not found")
    return sandbox


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
                Sandbox.status.not_in(("destroyed", "failed")),
            )
            .order_by(Sandbox.created_at.desc())
        )
    ).first()
    if sandbox is None:
        raise errors.NotFound("sandbox not found")
    return sandbox


async def page(
    session: AsyncSession, user_id: str, *, status: str | None, limit: int, offset: int, cutoff: dt.datetime
) -> tuple[list[Sandbox], int]:
    if status is not None and status not in STATUSES:
        raise errors.ValidationFailed.field("status", f"unknown status {status!r}")
    where = [Sandbox.user_id == user_id, _retained(cutoff)]
    if status:
        where.append(Sandbox.status == status)
    total = await session.scalar(select(func.count()).select_from(Sandbox).where(*where))
    rows = await session.scalars(
        select(Sandbox).where(*where).order_by(Sandbox.created_at, Sandbox.id).limit(limit).offset(offset)
    )
    return list(rows.all()), int(total or 0)
