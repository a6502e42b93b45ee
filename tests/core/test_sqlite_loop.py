"""SQLite on the event loop (``paddock_core.sqlite_loop``) and the point reads kept until a commit
(``db.PointReads``): a writer waiting for the lock never stalls the loop, the wait ends when the holder
commits (or with the old busy timeout's error), and a kept read is never stale."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import Integer, String, bindparam, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from paddock_core import db, sqlite_loop


class Base(DeclarativeBase):
    pass


class Thing(Base):
    __tablename__ = "things"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = db.make_engine(f"sqlite+aiosqlite:///{tmp_path / 'loop.db'}")
    assert engine.dialect.driver == "paddock_loop"  # the URL's driver name is replaced
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield engine
    await engine.dispose()


class Ticker:
    """Counts how often the loop ran it and the longest gap between runs: a blocked loop shows."""

    def __init__(self) -> None:
        self.ticks = 0
        self.longest_gap_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Ticker:
        async def run() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.002)
                now = time.monotonic()
                self.longest_gap_s = max(self.longest_gap_s, now - last)
                self.ticks, last = self.ticks + 1, now

        self._task = asyncio.create_task(run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_a_writer_waits_for_the_lock_without_blocking_the_loop(engine: AsyncEngine) -> None:
    sessions = db.make_sessionmaker(engine)
    holder_has_lock = asyncio.Event()

    async def holder() -> None:
        async with db.transaction(sessions) as session:
            session.add(Thing(id=1, name="first"))
            await session.flush()
            holder_has_lock.set()
            await asyncio.sleep(0.3)  # holds SQLite's write lock across a real suspension

    async def waiter() -> float:
        await holder_has_lock.wait()
        started = time.monotonic()
        async with db.transaction(sessions) as session:  # BEGIN IMMEDIATE: finds the lock taken
            session.add(Thing(id=2, name="second"))
        return time.monotonic() - started

    async with Ticker() as ticker:
        _, waited_s = await asyncio.gather(holder(), waiter())
    assert waited_s >= 0.2, "the second writer did not wait for the first"
    # A synchronous wait for the lock would have frozen the loop for the whole 0.3 s (or forever:
    # the holder needs the loop to commit).
    assert ticker.longest_gap_s < 0.15, ticker.longest_gap_s
    async with sessions() as session:
        assert sorted(t.name for t in (await session.scalars(select(Thing))).all()) == ["first", "second"]


async def test_a_lock_held_too_long_ends_in_the_busy_error(
    engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_loop, "BUSY_WAIT_S", 0.3)
    other = sqlite3.connect(tmp_path / "loop.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer that never lets go
    try:
        sessions = db.make_sessionmaker(engine)
        started = time.monotonic()
        async with Ticker() as ticker:
            # SQLAlchemy's error, as for any statement (the BEGIN is issued on the driver's cursor).
            with pytest.raises(OperationalError, match="database is locked"):
                async with db.transaction(sessions) as session:
                    session.add(Thing(id=3, name="never"))
        assert 0.3 <= time.monotonic() - started < 5
        assert ticker.ticks > 20 and ticker.longest_gap_s < 0.15
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_a_stale_snapshot_is_not_retried(engine: AsyncEngine, tmp_path: Path) -> None:
    """A deferred transaction that read before another commit cannot write: SQLite says so at once
    (SQLITE_BUSY_SNAPSHOT), and waiting would not help."""
    async with engine.connect() as conn:
        await conn.execute(select(Thing))  # the engine begins a deferred transaction: a snapshot
        writer = sqlite3.connect(tmp_path / "loop.db", isolation_level=None)
        writer.execute("INSERT INTO things (id, name) VALUES (4, 'meanwhile')")
        writer.close()
        started = time.monotonic()
        with pytest.raises(Exception, match="database is locked"):
            await conn.execute(text("INSERT INTO things (id, name) VALUES (5, 'late')"))
        assert time.monotonic() - started < 0.2
        await conn.rollback()


async def test_a_kept_point_read_is_replaced_after_any_commit(engine: AsyncEngine, tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'loop.db'}"
    sessions = db.make_sessionmaker(engine)
    reads = db.PointReads(url, sessions)
    by_id = select(Thing).where(Thing.id == bindparam("thing_id"))
    try:
        assert await reads.first(by_id, {"thing_id": 6}) is None
        async with db.transaction(sessions) as session:  # this process's engine
            session.add(Thing(id=6, name="v1"))
        first = await reads.first(by_id, {"thing_id": 6})
        assert first is not None and first.name == "v1"
        assert await reads.first(by_id, {"thing_id": 6}) is first  # kept: nothing was committed
        outside = sqlite3.connect(tmp_path / "loop.db", isolation_level=None)  # another process
        outside.execute("UPDATE things SET name = 'v2' WHERE id = 6")
        outside.close()
        second = await reads.first(by_id, {"thing_id": 6})
        assert second is not None and second.name == "v2"
    finally:
        reads.dispose()
