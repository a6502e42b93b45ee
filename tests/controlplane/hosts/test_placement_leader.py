"""A placement whose leading host is its choice counts that host's sandboxes only (issue #36): counted in a
batch with the next hosts in line, a leader of 33 sandboxes followed by hosts of 500 cost the decision
fifteen times the rows, and the decision grew with the fleet's density."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_controlplane.hosts import scheduler
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.resources import accounts
from paddock_core.db import transaction
from tests.controlplane.hosts import rows as rows_of

pytestmark = pytest.mark.db


async def test_the_leading_host_is_counted_alone_when_it_is_the_choice(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = dt.datetime.now(dt.UTC)
    beat = now - dt.timedelta(seconds=1)
    total = 64 * 1024
    held = {"h-0": 4, **{f"h-{n}": 40 for n in range(1, 8)}}  # sandboxes of 1 GiB on each
    host_rows: list[dict[str, Any]] = []
    sandbox_rows: list[dict[str, Any]] = []
    async with transaction(sessions) as session:
        user = await accounts.create_user(session, plan_id="enterprise", signup_credits=1000)
        for host_id, count in held.items():
            host_rows.append(rows_of.host(host_id, beat, free_mib=total - count * 1024, total_mib=total))
            sandbox_rows += [
                rows_of.running_sandbox(
                    f"sbx-{host_id}-{n}", user.id, host_id, beat - dt.timedelta(seconds=30)
                )
                for n in range(count)
            ]
        await session.execute(insert(Host), host_rows)
        await session.execute(insert(Sandbox), sandbox_rows)
    counted: list[str] = []
    real_held = scheduler.held_by_host

    async def held_by_host(session: AsyncSession, host_ids: Collection[str]) -> dict[str, scheduler.Held]:
        counted.extend(host_ids)
        return await real_held(session, host_ids)

    monkeypatch.setattr(scheduler, "held_by_host", held_by_host)
    async with transaction(sessions) as session:
        host = await scheduler.pick_host(
            session, mem_mib=1024, rootfs="debian:13", now=now, dead_after_s=15.0
        )
    assert host == "h-0"
    assert set(counted) == {"h-0"}, "the hosts of 40 sandboxes behind it could not beat it"

    # Without it, the next in line among equals (the lowest id) is chosen, again counted alone.
    async with transaction(sessions) as session:
        counted.clear()
        host = await scheduler.pick_host(
            session, mem_mib=1024, rootfs="debian:13", now=now, dead_after_s=15.0, exclude=["h-0"]
        )
    assert host == "h-1"
    assert set(counted) == {"h-1"}
