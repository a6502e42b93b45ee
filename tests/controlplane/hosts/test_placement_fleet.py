"""Placement in a large fleet (issue #36, bench/fleet_sim.py): the scheduler counts the memory held on a
few leading hosts, not on every host, yet picks what counting every host would pick; and a placement
is not held up by a lock on a host it does not choose (a heartbeat or a drain being written there)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Collection

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_controlplane.hosts import scheduler
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.resources import accounts
from paddock_core.db import transaction
from tests.controlplane.hosts import rows as rows_of

pytestmark = pytest.mark.db

MEM_MIB = 256
DEAD_AFTER_S = 15.0


async def seed_fleet(sessions: async_sessionmaker, now: dt.datetime, hosts: int) -> dict[str, int]:  # type: ignore[type-arg]
    """``hosts`` hosts, each reporting a different free memory, with sandboxes on them: some placed
    before their host's last report, some after it (counted against the report). Returns each host's
    free memory as the scheduler's two views make it."""
    beat = now - dt.timedelta(seconds=1)
    free: dict[str, int] = {}
    async with transaction(sessions) as session:
        user = await accounts.create_user(session, plan_id="enterprise", signup_credits=1000)
        host_rows, sandbox_rows = [], []
        for index in range(hosts):
            host_id = f"h-{index:03d}"
            total, reported = 64 * 1024, 8 * 1024 + (index * 7919) % 40 * 512
            host_rows.append(
                rows_of.host(
                    host_id, beat, free_mib=reported, total_mib=total, url=f"http://10.0.{index}.1:8081"
                )
            )
            before, after = index % 5, (index * 3) % 4  # sandboxes placed before / since the report
            for n in range(before + after):
                created = beat - dt.timedelta(seconds=30) if n < before else now
                sandbox_rows.append(
                    rows_of.running_sandbox(f"sbx-{index:03d}-{n}", user.id, host_id, created)
                )
            free[host_id] = min(reported - after * 1024, total - (before + after) * 1024)
        await session.execute(insert(Host), host_rows)
        await session.execute(insert(Sandbox), sandbox_rows)
    return free


async def test_a_placement_among_many_hosts_counts_few_and_picks_the_roomiest(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = dt.datetime.now(dt.UTC)
    free = await seed_fleet(sessions, now, hosts=60)
    counted: list[str] = []
    real_held = scheduler.held_by_host

    async def held_by_host(session: AsyncSession, host_ids: Collection[str]) -> dict[str, scheduler.Held]:
        counted.extend(host_ids)
        return await real_held(session, host_ids)

    monkeypatch.setattr(scheduler, "held_by_host", held_by_host)
    placed: list[str] = []
    for _ in range(6):  # each placement lowers its host's free memory: the next goes elsewhere
        async with transaction(sessions) as session:
            counted.clear()
            host = await scheduler.pick_host(
                session, mem_mib=MEM_MIB, rootfs="debian:13", now=now, dead_after_s=DEAD_AFTER_S
            )
            roomiest = max(free.values())
            assert free[host] == roomiest, (host, free[host], roomiest)
            assert host == min(h for h, f in free.items() if f == roomiest)  # the lowest id among equals
            # A few batches of the leading hosts, of 60.
            assert len(set(counted)) <= 3 * scheduler.HELD_BATCH, sorted(set(counted))
            await session.execute(
                insert(Sandbox).values(
                    id=f"placed-{len(placed)}",
                    user_id=(await session.scalar(select(Sandbox.user_id).limit(1))),
                    name=f"placed-{len(placed)}",
                    status="running",
                    host_id=host,
                    shape="s-4vcpu-8gb",
                    rootfs="debian:13",
                    vcpu=4,
                    mem_mib=8192,
                    disk_mib=2048,
                    region="eu",
                    egress=[],
                    env_keys=[],
                    ssh_pubkeys=[],
                    node_selector={},
                    created_at=now,
                )
            )
            free[host] -= 8192
            placed.append(host)
    assert len(set(placed)) == len(placed)


async def test_a_placement_is_not_held_up_by_a_lock_on_another_host(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
    db_engine: str,
) -> None:
    if db_engine != "postgresql":
        pytest.skip("SQLite has no row locks: its writers take turns on the whole file")
    now = dt.datetime.now(dt.UTC)
    free = await seed_fleet(sessions, now, hosts=5)
    roomiest = min(h for h, f in free.items() if f == max(free.values()))
    other = next(h for h in sorted(free) if h != roomiest)
    async with transaction(sessions) as holder:
        # What a heartbeat's transaction holds on its host's row until it commits.
        await holder.execute(select(Host).where(Host.id == other).with_for_update())
        async with transaction(sessions) as session:
            async with asyncio.timeout(5):
                host = await scheduler.pick_host(
                    session, mem_mib=MEM_MIB, rootfs="debian:13", now=now, dead_after_s=DEAD_AFTER_S
                )
        assert host == roomiest
