"""Account usage: the whoami stats (§10.5)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.models import Sandbox
from paddock_controlplane.states import SandboxStatus


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
    }
