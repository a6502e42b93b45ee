"""Account usage: the whoami stats (§10.5)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.records.models import CreditEntry, Sandbox, User
from paddock_controlplane.records.states import SandboxStatus


async def sandbox_counts(session: AsyncSession, user_id: str) -> dict[str, int]:
    rows = await session.execute(
        select(Sandbox.status, func.count())
        .where(Sandbox.user_id == user_id, Sandbox.status != SandboxStatus.DESTROYED)
        .group_by(Sandbox.status)
    )
    return {status: int(count) for status, count in rows.all()}


async def whoami(session: AsyncSession, user_id: str) -> dict[str, Any]:
    counts = await sandbox_counts(session, user_id)
    running = counts.pop(SandboxStatus.RUNNING, 0)
    paused = counts.pop(SandboxStatus.PAUSED, 0)
    other = sum(counts.values())
    return {
        "user_id": user_id,
        "stats": {"running": running, "paused": paused, "other": other, "total": running + paused + other},
        "credits": await credits(session, user_id),
    }


#: Micro-credits in a credit (``accounts.MICRO``; repeated to keep this module free of the domain).
MICRO = 1_000_000


async def credits(session: AsyncSession, user_id: str) -> dict[str, float]:
    """What is left and what was spent, in credits (an extension of §10.5): ``spent`` sums the ledger's
    charges (compute, bandwidth), billed up to the last billing pass; ``balance`` is what remains."""
    balance = await session.scalar(select(User.credits_micro).where(User.id == user_id))
    spent = await session.scalar(
        select(func.coalesce(func.sum(CreditEntry.amount_micro), 0)).where(
            CreditEntry.user_id == user_id, CreditEntry.amount_micro < 0
        )
    )
    return {"balance": int(balance or 0) / MICRO, "spent": -int(spent or 0) / MICRO}
