"""Migration 0024 adds ``e2b_template_tags`` (E2B's template tags): a tag written after it reads back by
name and tag, a second row under the same ``name:tag`` is refused, and a downgrade removes the table."""

from __future__ import annotations

import asyncio

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.resources import accounts
from paddock_core.db import alembic_config, make_engine, make_sessionmaker, transaction, upgrade

pytestmark = pytest.mark.db

INSERT = text(
    "INSERT INTO e2b_template_tags (user_id, name, tag, build_id, created_at)"
    " VALUES (:user, 'mine', 'stable', :build, CURRENT_TIMESTAMP)"
)


async def test_template_tags_table_up_and_down(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url, "0023")
    engine = make_engine(database_url)
    try:
        async with transaction(make_sessionmaker(engine)) as session:
            user = await accounts.create_user(session, plan_id="pro", signup_credits=500)
        await upgrade(MIGRATIONS, database_url)
        async with engine.begin() as conn:
            await conn.execute(INSERT, {"user": user.id, "build": "b-1"})
            found = await conn.execute(
                text("SELECT build_id FROM e2b_template_tags WHERE name = 'mine' AND tag = 'stable'")
            )
            assert found.scalar_one() == "b-1"
        with pytest.raises(IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(INSERT, {"user": user.id, "build": "b-2"})
        await asyncio.to_thread(command.downgrade, alembic_config(MIGRATIONS, database_url), "0023")
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
        assert "e2b_template_tags" not in tables
        await upgrade(MIGRATIONS, database_url)
    finally:
        await engine.dispose()
