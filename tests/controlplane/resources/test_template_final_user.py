"""Which ``USER`` a template's sandboxes run as (``templates.final_user``), read from its Dockerfile and
those it is built over, on SQLite and PostgreSQL: the E2B edge switches a child build back to it after
its own steps that need root (``edge/e2b/templates.dockerfile_for``; live in
tests/e2b/test_api_start_command.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_controlplane.records.models import Template
from paddock_controlplane.resources import accounts, templates
from paddock_core.db import make_engine, make_sessionmaker, transaction

T0 = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
async def sessions(cp_database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(cp_database_url)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


def _template(user_id: str, number: int, from_image: str, dockerfile: str) -> Template:
    return Template(
        id=f"tpl_01K{number:023d}",
        user_id=user_id,
        name=f"t{number}",
        base="debian:13",
        from_image=from_image,
        dockerfile=dockerfile,
        status="ready",
        created_at=T0,
    )


async def test_the_last_user_of_a_template_or_of_those_it_is_built_over(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with transaction(sessions) as session:
        user = await accounts.create_user(session, plan_id="pro", signup_credits=0)
        root = _template(user.id, 1, "debian:13", "FROM debian:13\nRUN echo hi\n")
        app = _template(user.id, 2, root.id, "FROM t1\nUSER nobody\nRUN id\nUSER app:staff\n")
        child = _template(user.id, 3, app.id, "FROM t2\nWORKDIR /srv\n")
        grandchild = _template(user.id, 4, child.id, "FROM t3\n# USER commented out\nRUN true\n")
        session.add_all([root, app, child, grandchild])
    async with sessions() as session:
        got = [await templates.final_user(session, row) for row in (root, app, child, grandchild)]
    assert got == [None, "app:staff", "app:staff", "app:staff"]
