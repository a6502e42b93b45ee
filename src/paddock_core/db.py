"""Database plumbing: async engines for SQLite and PostgreSQL, sessions, Alembic upgrades.

A URL switches engines; no other code changes. Each service owns its own metadata and its own
migration tree, applied on start with :func:`upgrade_to_head`.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Hashable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Select, create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from paddock_core import sqlite_loop, statefiles


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
        # Whatever driver the URL names, statements run on the loop (``sqlite_loop``: why, and how
        # it waits for locks without blocking).
        engine = create_async_engine(make_url(url).set(drivername=sqlite_loop.DRIVERNAME))

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            # No busy timeout: a wait for the lock would block the loop (``sqlite_loop`` retries instead).
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _begin(conn: Any) -> None:
            # Writers take SQLite's write lock up front (BEGIN IMMEDIATE): a deferred transaction
            # that reads and then writes can fail with SQLITE_BUSY_SNAPSHOT under concurrency.
            statement = "BEGIN IMMEDIATE" if conn.get_execution_options().get(IMMEDIATE, False) else "BEGIN"
            # On the driver's cursor rather than through ``exec_driver_sql``: SQLAlchemy's statement
            # pipeline (context, result, events) was a tenth of a pause's database cost for a fixed
            # statement that returns nothing. The cursor still waits for a lock (``sqlite_loop``).
            cursor = conn.connection.dbapi_connection.cursor()
            try:
                cursor.execute(statement)
            except sqlite3.Error as exc:
                raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc
            finally:
                cursor.close()

        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


T = TypeVar("T")


class PointReads:
    """Lookups by key on the hot paths (a sandbox polled by ``GET``), made as cheap as the database
    allows. The entities returned may be shared between callers: read them, never change them.

    On a SQLite file they run synchronously on the event loop, on one read-only connection of their
    own. aiosqlite hands every statement to its thread and back (BEGIN, the query, its fetch, the
    rollback: ~0.7 ms for ``SELECT 1`` on the 2-core dev box, ~1.7 ms for a sandbox row), while a
    primary-key lookup in the same process takes tens of microseconds. It cannot block the loop on a
    lock: in WAL mode a reader never waits for writers, and each statement outside a transaction reads
    the latest commit. Only short lookups by key belong here: a scan would stall every request.

    Their results are kept until anything is committed to the file. ``PRAGMA data_version`` changes
    when any other connection, in this process or another, commits; this connection never writes. So
    an unchanged version proves a kept result is still exactly what the query would return, and the
    ORM's ~0.2 ms per row is paid once per change rather than once per poll.

    On PostgreSQL (asyncpg has no thread hop, and no cheap "nothing changed" check) they use the
    ordinary async session, uncached.
    """

    MAX_KEPT = 10_000

    def __init__(self, url: str, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._engine: Engine | None = None
        self._local: sessionmaker[Session] | None = None
        self._connection: sqlite3.Connection | None = None
        self._version = -1
        self._kept: dict[tuple[int, tuple[tuple[str, Hashable], ...]], Any] = {}
        url_parts = make_url(url)
        if is_sqlite(url) and url_parts.database not in (None, "", ":memory:"):
            # autocommit (isolation_level=None): no transaction stays open between reads.
            connection = sqlite3.connect(
                url_parts.database or "", isolation_level=None, check_same_thread=False
            )
            connection.execute("PRAGMA query_only=ON")
            connection.execute("PRAGMA busy_timeout=1000")  # only a WAL recovery or a schema change waits
            self._connection = connection
            self._engine = create_engine(
                "sqlite+pysqlite://", creator=lambda: connection, poolclass=StaticPool
            )
            self._local = sessionmaker(self._engine, expire_on_commit=False)

    async def first(self, statement: Select[T], params: Mapping[str, Hashable] | None = None) -> T | None:
        """The first entity ``statement`` selects (joined collections de-duplicated), detached."""
        if self._local is None or self._connection is None:
            async with self._sessions() as session:
                return (await session.scalars(statement, params)).unique().first()
        version = self._connection.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version or len(self._kept) >= self.MAX_KEPT:
            self._kept.clear()
            self._version = version
        key = (id(statement), tuple(sorted((params or {}).items())))
        if key in self._kept:
            kept: T | None = self._kept[key]
            return kept
        with self._local() as session:
            found = session.scalars(statement, params).unique().first()
        self._kept[key] = found
        return found

    def dispose(self) -> None:
        self._kept.clear()
        if self._engine is not None:
            self._engine.dispose()
        if self._connection is not None:
            self._connection.close()


IMMEDIATE = "paddock_immediate"
#: ``session.info`` key of the connection a :func:`transaction` holds (:func:`transaction_connection`).
_CONNECTION = "paddock_connection"


@asynccontextmanager
async def transaction(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A writing session inside one transaction: committed on success, rolled back on any exception.

    On SQLite it holds the database write lock from its first statement, so read-check-write sequences
    (quota checks, state transitions) are serialised; on PostgreSQL use row locks (FOR UPDATE).
    """
    session = sessions()
    try:
        async with session.begin():
            session.info[_CONNECTION] = await session.connection(execution_options={IMMEDIATE: True})
            yield session
    finally:
        session.info.pop(_CONNECTION, None)
        # Not ``async with session``: its exit closes the session in a task of its own, shielded from
        # cancellation (~40 µs of a 190 µs transaction). The transaction's end (commit or rollback)
        # has given its connection back, so the close has nothing left to wait for; only a rollback
        # cut short by a cancellation leaves one, and that close is shielded as before.
        if session.in_transaction():
            await asyncio.shield(session.close())
        else:
            await session.close()


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


async def transaction_connection(session: AsyncSession) -> AsyncConnection:
    """The connection of the session's transaction, for plain statements: the one :func:`transaction`
    took, kept while it lasts (each ``session.connection()`` is a trip through SQLAlchemy's greenlet
    bridge, ~11 µs), else the session's own."""
    kept: AsyncConnection | None = session.info.get(_CONNECTION)
    return kept if kept is not None else await session.connection()
