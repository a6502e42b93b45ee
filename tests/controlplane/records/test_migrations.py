"""A database made by the first migration upgrades cleanly to head, keeping its accounts."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.resources import accounts
from paddock_core.db import make_engine, make_sessionmaker, transaction, upgrade

pytestmark = pytest.mark.db


async def test_first_revision_upgrades_to_head_with_data_intact(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url, "0001")
    engine = make_engine(database_url)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO users (id, name, plan_id, credits_micro, lock_version, created_at) "
                "VALUES ('usr_old', 'before', 'free', 7, 0, CURRENT_TIMESTAMP)"
            )
        )
        tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
    assert "sandboxes" not in tables
    await upgrade(MIGRATIONS, database_url)
    async with engine.connect() as conn:
        tables = await conn.run_sync(lambda c: set(c.dialect.get_table_names(c)))
        plans = (await conn.execute(text("SELECT id FROM plans ORDER BY max_disk_mib"))).scalars().all()
    assert {"users", "api_keys", "plans", "hosts", "sandboxes"} <= tables
    assert plans == ["free", "beginner", "pro", "enterprise"]
    async with transaction(make_sessionmaker(engine)) as session:
        issued = await accounts.create_key(session, "usr_old")
        principal = await accounts.authenticate(session, issued.plaintext)
    assert principal.user_id == "usr_old" and principal.plan_id == "free"
    await upgrade(MIGRATIONS, database_url)  # idempotent at head
    await engine.dispose()


async def test_new_user_gets_500_credits_on_the_ledger(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url)
    engine = make_engine(database_url)
    async with transaction(make_sessionmaker(engine)) as session:
        user = await accounts.create_user(session, plan_id="beginner", signup_credits=500)
    async with make_sessionmaker(engine)() as session:
        assert await accounts.balance_micro(session, user.id) == 500 * accounts.MICRO
        rows = (await session.execute(text("SELECT kind, amount_micro FROM credit_entries"))).all()
    assert [tuple(r) for r in rows] == [("signup", 500_000_000)]
    async with transaction(make_sessionmaker(engine)) as session:
        with pytest.raises(Exception, match="unknown plan"):
            await accounts.create_user(session, plan_id="platinum", signup_credits=500)
    await engine.dispose()
