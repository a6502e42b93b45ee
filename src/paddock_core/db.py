"""Database plumbing: async engines for SQLite and PostgreSQL, sessions, Alembic upgrades.

A URL switches engines; no other code changes. Each service owns its own metadata and its own
migration tree, applied on start with :func:`upgrade_to_head`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from paddock_core import statefiles


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def ensure_sqlite_dir(url: str) -> None:
    """The SQLite file's directory (0700 when made here) and the file itself, 0600 before SQLite first
    opens it: SQLite gives the ``-wal`` and ``-shm`` files the database file's mode, so they follow."""
    path = url.split(":///", 1)[1].split("?", 1)[0] if is_sqlite(url) and ":///" in url else ""
    if not path or path == ":memory:":
        return
    database = Path(path)
    statefiles.private_dir(database.parent)
    statefiles.private_file(database)
    for suffix in ("-wal", "-shm", "-journal"):  # left by an older version at 0644
        statefiles.restrict_file(database.with_name(database.name + suffix))


def make_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    if is_sqlite(url):
        ensure_sqlite_dir(url)
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _begin(conn: Any) -> None:
            # Writers take SQLite's write lock up front (BEGIN IMMEDIATE): a deferred transaction
            # that reads and then writes can fail with SQLITE_BUSY_SNAPSHOT under concurrency.
            immediate = conn.get_execution_options().get(IMMEDIATE, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


IMMEDIATE = "paddock_immediate"


@asynccontextmanager
async def transaction(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A writing session inside one transaction: committed on success, rolled back on any exception.

    On SQLite it holds the database write lock from its first statement, so read-check-write sequences
    (quota checks, state transitions) are serialised; on PostgreSQL use row locks (FOR UPDATE).
    """
    async with sessions() as session, session.begin():
        await session.connection(execution_options={IMMEDIATE: True})
        yield session


def alembic_config(script_location: Path, url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


async def upgrade(script_location: Path, url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision``. Alembic is synchronous; its env.py drives an async engine."""
    ensure_sqlite_dir(url)
    cfg = alembic_config(script_location, url)
    await asyncio.to_thread(command.upgrade, cfg, revision)


async def ping(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
