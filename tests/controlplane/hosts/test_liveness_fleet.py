"""The liveness pass in a large fleet (issue #36): one statement marks only the silent hosts dead, instead
of reading every host's row every second; and a heartbeat committed while the pass runs keeps its host
alive (read then written, the host was marked dead with a fresh heartbeat, erroring its sandboxes)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import async_sessionmaker

from paddock_controlplane.hosts import hosts
from paddock_controlplane.records.models import Host
from paddock_core.db import transaction
from tests.controlplane.hosts import rows as rows_of

pytestmark = pytest.mark.db

DEAD_AFTER_S = 15.0


def host_row(host_id: str, status: str, beat: dt.datetime) -> dict[str, Any]:
    return rows_of.host(host_id, beat, free_mib=1024, total_mib=1024, status=status)


async def statuses(sessions: async_sessionmaker) -> dict[str, str]:  # type: ignore[type-arg]
    async with sessions() as session:
        return {str(i): str(s) for i, s in (await session.execute(select(Host.id, Host.status))).all()}


async def test_only_silent_hosts_are_marked_dead(sessions: async_sessionmaker) -> None:  # type: ignore[type-arg]
    now = dt.datetime.now(dt.UTC)
    fresh, silent = now - dt.timedelta(seconds=2), now - dt.timedelta(seconds=DEAD_AFTER_S + 5)
    async with transaction(sessions) as session:
        await session.execute(
            insert(Host),
            [host_row(f"fresh-{n}", "active", fresh) for n in range(3)]
            + [host_row("silent-a", "active", silent), host_row("silent-d", "draining", silent)]
            + [host_row("gone", "dead", silent)],
        )
    async with transaction(sessions) as session:
        died = await hosts.mark_silent_hosts_dead(session, now, DEAD_AFTER_S)
    assert died == ["silent-a", "silent-d"], "a host already dead is not reported again"
    assert await statuses(sessions) == {
        "fresh-0": "active",
        "fresh-1": "active",
        "fresh-2": "active",
        "silent-a": "dead",
        "silent-d": "dead",
        "gone": "dead",
    }
    async with transaction(sessions) as session:
        assert await hosts.mark_silent_hosts_dead(session, now, DEAD_AFTER_S) == []


async def test_a_heartbeat_committed_during_the_pass_keeps_its_host_alive(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
    db_engine: str,
) -> None:
    if db_engine != "postgresql":
        pytest.skip("SQLite's writers take turns on the whole file: a pass cannot overlap a heartbeat")
    now = dt.datetime.now(dt.UTC)
    async with transaction(sessions) as session:
        await session.execute(insert(Host), [host_row("late", "active", now - dt.timedelta(seconds=60))])
    beat = {"id": "late", "url": "http://127.0.0.1:9/late", "free_mib": 1024, "total_mib": 1024}
    async with transaction(sessions) as heartbeat:
        await hosts.record_heartbeat(heartbeat, beat, now)
        await heartbeat.flush()  # the host's row is written and locked until this beat commits

        async def liveness() -> list[str]:
            async with transaction(sessions) as session:
                return await hosts.mark_silent_hosts_dead(session, now, DEAD_AFTER_S)

        judged = asyncio.create_task(liveness())
        for _ in range(100):  # until the pass waits for the beat's lock
            async with sessions() as watcher:  # a new transaction: pg_stat_activity is read once in one
                waiting = await watcher.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting, "the pass never waited on the heartbeat's row"
    assert await asyncio.wait_for(judged, 10) == []
    assert (await statuses(sessions))["late"] == "active"
