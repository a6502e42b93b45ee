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


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def ensure_sqlite_dir(url: str) -> None:
    path = url.split(":///", 1)[1] if is_sqlite(url) and ":///" in url else ""
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def make_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    if is_sqlite(url):
        ensure_sqlite_dir(url)
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def transaction(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A session inside one transaction: committed on success, rolled back on any exception."""
    async with sessions() as session, session.begin():
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
