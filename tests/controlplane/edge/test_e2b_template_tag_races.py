"""Two requests moving the same E2B template tag at once (``edge/e2b/templates._point``) both succeed,
on SQLite and PostgreSQL, and the tag ends on one of their builds: a tag is one upsert, where a delete
then an insert made the later request a duplicate key (a 500)."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from paddock_controlplane.edge.e2b.templates import E2bTemplateTag, _point
from paddock_controlplane.resources import accounts
from paddock_core.db import transaction
from tests.controlplane.conftest import Clocked


async def test_two_requests_moving_one_tag_at_once_both_succeed(clocked: Clocked) -> None:
    services = clocked.services
    async with transaction(services.sessions) as session:
        user = await accounts.create_user(session, plan_id="pro", signup_credits=0)
    now = services.clock()
    async with transaction(services.sessions) as session:
        await _point(session, user.id, "web", ["v1", "stable"], "build-a", now)

    async def move(build_id: str) -> None:
        async with transaction(services.sessions) as session:
            await _point(session, user.id, "web", ["stable"], build_id, now)
            await asyncio.sleep(0.05)  # both transactions hold their write at once (PostgreSQL)

    await asyncio.gather(move("build-b"), move("build-c"))
    async with services.sessions() as session:
        rows = {row.tag: row.build_id for row in await session.scalars(select(E2bTemplateTag))}
    assert rows["v1"] == "build-a"
    assert rows["stable"] in ("build-b", "build-c")
    assert len(rows) == 2
