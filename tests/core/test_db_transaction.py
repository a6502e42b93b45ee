"""``db.transaction`` on SQLite: what it commits stays, what fails is rolled back, and its connection goes
back to the pool however the block ends (committed, failed, or cancelled while waiting for the lock)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from paddock_core import db


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = db.make_engine(f"sqlite+aiosqlite:///{tmp_path / 'tx.db'}")
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE things (id INTEGER PRIMARY KEY)"))
    yield engine
    await engine.dispose()


async def count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM things"))).scalar_one())


async def test_a_transaction_commits_or_rolls_back_and_gives_its_connection_back(engine: AsyncEngine) -> None:
    sessions = db.make_sessionmaker(engine)
    async with db.transaction(sessions) as session:
        connection = await db.transaction_connection(session)
        assert connection is await db.transaction_connection(session)  # the transaction's own
        await connection.execute(text("INSERT INTO things (id) VALUES (1)"))
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        async with db.transaction(sessions) as session:
            await (await db.transaction_connection(session)).execute(
                text("INSERT INTO things (id) VALUES (2)")
            )
            raise ValueError("the caller's check failed")
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert await count(engine) == 1
    # Outside the transaction the session's own connection is used.
    async with sessions() as session, session.begin():
        assert await db.transaction_connection(session) is await session.connection()


async def test_a_transaction_cancelled_while_waiting_for_the_lock_gives_its_connection_back(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "tx.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
    try:
        sessions = db.make_sessionmaker(engine)

        async def write() -> None:
            async with db.transaction(sessions) as session:
                await (await db.transaction_connection(session)).execute(
                    text("INSERT INTO things (id) VALUES (3)")
                )

        task = asyncio.create_task(write())
        await asyncio.sleep(0.05)  # retrying BEGIN IMMEDIATE
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert await count(engine) == 0
