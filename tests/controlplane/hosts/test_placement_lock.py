"""The placement lock (issue #36): on PostgreSQL a create's placement, a fork's room check and a drain
take turns on one advisory lock, so a placement counts each host once and locks no host row. These
show what that must keep: a host is never given more memory than it has when creates and forks race
for it, a drain holds off every later placement, and a heartbeat being written on the roomiest host
does not hold up a create that chooses it."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from paddock_controlplane.hosts import hosts, scheduler
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.resources import accounts
from paddock_core import errors
from paddock_core.db import transaction
from tests.controlplane.hosts import rows as rows_of

pytestmark = pytest.mark.db

MEM_MIB = 256
DEAD_AFTER_S = 15.0


async def seed(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
    now: dt.datetime,
    free: dict[str, int],
) -> str:
    """Hosts reporting ``free`` MiB free of that total, nothing placed yet; returns a user's id."""
    beat = now - dt.timedelta(seconds=1)
    async with transaction(sessions) as session:
        user = await accounts.create_user(session, plan_id="enterprise", signup_credits=1000)
        await session.execute(
            insert(Host), [rows_of.host(h, beat, free_mib=mib, total_mib=mib) for h, mib in free.items()]
        )
        return str(user.id)


def sandbox_on(host_id: str, user_id: str, name: str, now: dt.datetime) -> dict[str, object]:
    return rows_of.running_sandbox(name, user_id, host_id, now, mem_mib=MEM_MIB)


@pytest.mark.parametrize("db_engine", ["sqlite", "postgresql"])
async def test_creates_and_forks_racing_for_one_host_never_place_past_its_memory(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
) -> None:
    now = dt.datetime.now(dt.UTC)
    user_id = await seed(sessions, now, {"h-only": 4 * MEM_MIB})

    async def create(n: int) -> str:
        async with transaction(sessions) as session:
            chosen = await scheduler.pick_host(
                session, mem_mib=MEM_MIB, rootfs="debian:13", now=now, dead_after_s=DEAD_AFTER_S
            )
            await asyncio.sleep(0.02)  # the rest of a create's transaction, while others decide
            await session.execute(insert(Sandbox), [sandbox_on(chosen, user_id, f"sb-create-{n}", now)])
        return chosen

    async def fork(n: int) -> str:
        async with transaction(sessions) as session:
            await scheduler.check_room(session, "h-only", mem_mib=MEM_MIB, now=now, dead_after_s=DEAD_AFTER_S)
            await asyncio.sleep(0.02)
            await session.execute(insert(Sandbox), [sandbox_on("h-only", user_id, f"sb-fork-{n}", now)])
        return "h-only"

    outcomes = await asyncio.gather(
        *(attempt(n) for n in range(6) for attempt in (create, fork)), return_exceptions=True
    )
    placed = [o for o in outcomes if o == "h-only"]
    refused = [o for o in outcomes if isinstance(o, errors.Unavailable)]
    assert len(placed) == 4 and len(refused) == 8, outcomes
    async with sessions() as session:
        rows = (await session.scalars(select(Sandbox.id).where(Sandbox.host_id == "h-only"))).all()
    assert len(rows) == 4, rows


@pytest.mark.parametrize("db_engine", ["postgresql"])
async def test_a_drain_waits_for_a_placement_in_flight_and_no_later_one_chooses_the_host(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
) -> None:
    now = dt.datetime.now(dt.UTC)
    user_id = await seed(sessions, now, {"h-big": 8 * MEM_MIB, "h-small": 4 * MEM_MIB})
    async with transaction(sessions) as session:
        chosen = await scheduler.pick_host(
            session, mem_mib=MEM_MIB, rootfs="debian:13", now=now, dead_after_s=DEAD_AFTER_S
        )
        assert chosen == "h-big"

        async def drain() -> str:
            async with transaction(sessions) as drainer:
                return str((await hosts.set_drained(drainer, "h-big", True)).status)

        draining = asyncio.create_task(drain())
        await asyncio.sleep(0.5)
        assert not draining.done(), "the drain did not wait for the placement that chose the host"
        await session.execute(insert(Sandbox), [sandbox_on(chosen, user_id, "sb-in-flight", now)])
    async with asyncio.timeout(10):
        assert await draining == "draining"
    async with transaction(sessions) as session:
        after = await scheduler.pick_host(
            session, mem_mib=MEM_MIB, rootfs="debian:13", now=now, dead_after_s=DEAD_AFTER_S
        )
    assert after == "h-small"


@pytest.mark.parametrize("db_engine", ["postgresql"])
async def test_a_heartbeat_being_written_on_the_roomiest_host_does_not_hold_up_a_create_there(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
) -> None:
    now = dt.datetime.now(dt.UTC)
    await seed(sessions, now, {"h-big": 8 * MEM_MIB, "h-small": 4 * MEM_MIB})
    async with transaction(sessions) as heartbeat:
        # What a heartbeat's transaction holds on its host's row until it commits.
        await heartbeat.execute(update(Host).where(Host.id == "h-big").values(vm_count=1))
        async with transaction(sessions) as session:
            async with asyncio.timeout(5):
                chosen = await scheduler.pick_host(
                    session, mem_mib=MEM_MIB, rootfs="debian:13", now=now, dead_after_s=DEAD_AFTER_S
                )
        assert chosen == "h-big"
