"""Migration 0021 widens ``sandboxes.on_timeout`` for ``hibernate`` and adds ``sandboxes.on_idle``: a row
written at 0020 keeps its lifetime, a lifetime that hibernates fits (PostgreSQL refused nine characters in
the old ``VARCHAR(8)``), and a downgrade turns it into the frozen pause it falls back to."""

from __future__ import annotations

import asyncio

import pytest
from alembic import command
from sqlalchemy import text

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.resources import accounts
from paddock_core.db import alembic_config, make_engine, make_sessionmaker, transaction, upgrade
from tests.e2b.test_migration_0014 import _insert_sandboxes

pytestmark = pytest.mark.db


async def test_on_timeout_takes_hibernate_and_on_idle_is_kept(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url, "0020")
    engine = make_engine(database_url)
    try:
        async with transaction(make_sessionmaker(engine)) as session:
            user = await accounts.create_user(session, plan_id="pro", signup_credits=500)
        await _insert_sandboxes(engine, [("sb-old", user.id, {"timeout_s": 60, "on_timeout": "pause"})])
        await upgrade(MIGRATIONS, database_url)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE sandboxes SET on_timeout = 'hibernate', on_idle = 'hibernate' WHERE id = 'sb-old'"
                )
            )
            row = (await conn.execute(text("SELECT timeout_s, on_timeout, on_idle FROM sandboxes"))).one()
        assert tuple(row) == (60, "hibernate", "hibernate")

        await asyncio.to_thread(command.downgrade, alembic_config(MIGRATIONS, database_url), "0020")
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in c.dialect.get_columns(c, "sandboxes")}
            )
            assert (await conn.execute(text("SELECT on_timeout FROM sandboxes"))).scalar_one() == "pause"
        assert "on_idle" not in columns
        await upgrade(MIGRATIONS, database_url)
    finally:
        await engine.dispose()
