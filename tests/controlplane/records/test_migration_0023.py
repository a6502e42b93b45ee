"""Migration 0023 adds ``e2b_snapshot_tags`` (E2B's ``name:tag`` snapshot names): a tag written after it
reads back by name and tag, and a downgrade removes the table."""

from __future__ import annotations

import asyncio

import pytest
from alembic import command
from sqlalchemy import text

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.resources import accounts
from paddock_core.db import alembic_config, make_engine, make_sessionmaker, transaction, upgrade

pytestmark = pytest.mark.db


async def test_snapshot_tags_table_up_and_down(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url, "0022")
    engine = make_engine(database_url)
    try:
        async with transaction(make_sessionmaker(engine)) as session:
            user = await accounts.create_user(session, plan_id="pro", signup_credits=500)
        await upgrade(MIGRATIONS, database_url)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO e2b_snapshot_tags (user_id, name, tag, snapshot_id, created_at)"
                    " VALUES (:user, 'mine', 'v2', 'snap_01', CURRENT_TIMESTAMP)"
                ),
                {"user": user.id},
            )
            found = await conn.execute(
                text("SELECT snapshot_id FROM e2b_snapshot_tags WHERE name = 'mine' AND tag = 'v2'")
            )
            assert found.scalar_one() == "snap_01"
        await asyncio.to_thread(command.downgrade, alembic_config(MIGRATIONS, database_url), "0022")
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
        assert "e2b_snapshot_tags" not in tables
        await upgrade(MIGRATIONS, database_url)
    finally:
        await engine.dispose()
