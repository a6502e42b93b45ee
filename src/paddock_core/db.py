"""Database plumbing: async engines for SQLite and PostgreSQL, sessions, Alembic upgrades.

A URL switches engines; no other code changes. Each service owns its own metadata and its own
migration tree, applied on start with :func:`upgrade_to_head`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Select, create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
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
from paddock_core.pglisten import ChannelListener


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
    if make_url(url).get_driver_name() != "asyncpg":
        return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
    # Last in, first out: a steady load reuses the connections it used a moment ago, which need no
    # ping (``_check_on_checkout``), and the rest idle until they are pinged.
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_use_lifo=True)
    _check_on_checkout(engine, PG_PING_IDLE_AFTER_S)
    return engine


#: A pooled PostgreSQL connection that sat idle in the pool longer than this is pinged before it is
#: handed out. One back within it is handed out as it is, unless its server closed it.
PG_PING_IDLE_AFTER_S = 10.0
#: How long that ping may take before the connection counts as dead (a network that drops packets).
PG_PING_TIMEOUT_S = 5.0
#: ``connection_record.info`` key: when the connection went back into the pool.
_IDLE_SINCE = "paddock_idle_since"


def _check_on_checkout(engine: AsyncEngine, ping_idle_after_s: float) -> None:
    """In place of SQLAlchemy's ``pool_pre_ping``, which on asyncpg is three round trips (BEGIN, an
    empty query, ROLLBACK) before every transaction: a trivial transaction took 1.2–1.4 ms p50 with it
    and 0.74 ms without, here. A server that closed the connection (a restart, an administrator's
    ``pg_terminate_backend``, ``idle_session_timeout``) has sent its goodbye, which asyncpg has already
    read, so ``is_closed()`` costs nothing; only a connection idle past ``ping_idle_after_s`` (a
    network that dropped it silently) is pinged, in one round trip. Either kind is replaced by the
    pool (``DisconnectionError``), so the transaction gets a working connection."""

    @event.listens_for(engine.sync_engine, "checkin")
    def _went_idle(dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _check(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.pop(_IDLE_SINCE, None)
        if dbapi_connection.driver_connection.is_closed():
            raise DisconnectionError("the server closed the connection")
        if idle_since is not None and time.monotonic() - idle_since > ping_idle_after_s:
            try:
                dbapi_connection.run_async(
                    lambda connection: connection.fetchrow(";", timeout=PG_PING_TIMEOUT_S)
                )
            except Exception as exc:  # whatever the driver raises for a dead connection
                raise DisconnectionError(f"the idle connection failed its ping: {exc}") from exc


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


T = TypeVar("T")
#: A kept result's key: the statement (built once, so its id is stable) and its parameters.
_Key = tuple[int, tuple[tuple[str, Hashable], ...]]


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

    On PostgreSQL they use the ordinary async session, and keep results while a notification channel
    says nothing changed (:class:`PgChanges`): a service whose migrations create the function
    ``PG_NOTIFY_FUNCTION``, which NOTIFYs ``PG_CHANNEL`` on every commit that changes a table its point
    reads read, gets them kept; without it, or while the channel is not heard, nothing is kept.
    """

    MAX_KEPT = 10_000
    #: On PostgreSQL, no result is kept longer than this, whatever the channel says (a notification
    #: lost on a connection that died without telling is then late by at most this much).
    PG_KEPT_S = 1.0

    def __init__(self, url: str, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._engine: Engine | None = None
        self._local: sessionmaker[Session] | None = None
        self._connection: sqlite3.Connection | None = None
        self._version = -1
        self._kept: dict[_Key, Any] = {}
        self._pg: PgChanges | None = None
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
        elif url_parts.get_backend_name() == "postgresql":
            bind = sessions.kw.get("bind")
            self._pg = PgChanges(url, bind.sync_engine if isinstance(bind, AsyncEngine) else None)

    async def first(self, statement: Select[T], params: Mapping[str, Hashable] | None = None) -> T | None:
        """The first entity ``statement`` selects (joined collections de-duplicated), detached."""
        key = (id(statement), tuple(sorted((params or {}).items())))
        if self._pg is not None:
            return await self._pg_first(statement, params, key)
        if self._local is None or self._connection is None:
            async with self._sessions() as session:
                return (await session.scalars(statement, params)).unique().first()
        version = self._connection.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version or len(self._kept) >= self.MAX_KEPT:
            self._kept.clear()
            self._version = version
        if key in self._kept:
            kept: T | None = self._kept[key]
            return kept
        with self._local() as session:
            found = session.scalars(statement, params).unique().first()
        self._kept[key] = found
        return found

    async def _pg_first(
        self, statement: Select[T], params: Mapping[str, Hashable] | None, key: _Key
    ) -> T | None:
        changes = self._pg
        assert changes is not None
        changes.start()
        now = time.monotonic()
        if changes.version != self._version or len(self._kept) >= self.MAX_KEPT:
            self._kept.clear()
            self._version = changes.version
        entry = self._kept.get(key)
        if entry is not None and entry[0] > now:
            kept: T | None = entry[1]
            return kept
        # The version before the read: a change committed (or heard) while the read is in flight may
        # not be in what it returns, so its result is kept only if the version has not moved since.
        version = changes.version
        async with self._sessions() as session:
            found = (await session.scalars(statement, params)).unique().first()
        if changes.heard and changes.version == version == self._version:
            self._kept[key] = (now + self.PG_KEPT_S, found)
        return found

    def dispose(self) -> None:
        self._kept.clear()
        if self._pg is not None:
            self._pg.stop()
        if self._engine is not None:
            self._engine.dispose()
        if self._connection is not None:
            self._connection.close()


class PgChanges:
    """Whether anything a :class:`PointReads` keeps may have changed, on PostgreSQL. ``version`` moves:

    - on every notification on ``PG_CHANNEL``: a commit, in any process, that changed one of the tables
      whose triggers call ``PG_NOTIFY_FUNCTION`` (the database is asked which tables those are);
    - when a session of this process commits a transaction that wrote to one of those tables, at once:
      the notification of its own commit would come back a moment after the commit's answer, and a
      caller who changed a sandbox reads it back at once;
    - whenever the listening connection is opened or lost.

    ``heard`` is true only while that connection listens and the database has ``PG_NOTIFY_FUNCTION``
    on some table (the service's promise that the channel is fed).
    """

    def __init__(self, url: str, engine: Engine | None) -> None:
        self.version = 0
        self.heard = False
        #: The tables that notify the channel: writes to them in this process's sessions count too.
        self.tables: tuple[str, ...] = ()
        self._engine = engine
        self._started = False
        self._listener = ChannelListener(
            url, PG_CHANNEL, self.changed, on_listening=self._listening, on_lost=self._deaf
        )
        self._hooks: list[tuple[Any, str, Callable[..., None]]] = [
            (Session, "after_begin", self._began),
            (Session, "after_commit", self._committed),
            (Session, "after_rollback", self._rolled_back),
            (engine if engine is not None else Engine, "before_cursor_execute", self._executing),
        ]
        for target, name, hook in self._hooks:
            event.listen(target, name, hook)

    def changed(self, *_: Any) -> None:
        self.version += 1

    def _began(self, session: Session, _transaction: Any, connection: Any) -> None:
        if self._engine is None or connection.engine is self._engine:
            connection.info[_WRITER] = weakref.ref(session)

    def _executing(self, connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip()[:6].upper() == "SELECT" or not any(t in statement for t in self.tables):
            return
        writer = connection.info.get(_WRITER)
        session = writer() if writer is not None else None
        if session is not None:
            session.info[_DIRTY] = True
        else:  # a write outside a session: now, and again when its notification comes
            self.changed()

    def _committed(self, session: Session) -> None:
        if session.info.pop(_DIRTY, False):
            self.changed()

    def _rolled_back(self, session: Session) -> None:
        session.info.pop(_DIRTY, None)

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._listener.start()

    def stop(self) -> None:
        self.heard = False
        self.changed()
        for target, name, hook in self._hooks:
            if event.contains(target, name, hook):
                event.remove(target, name, hook)
        self._listener.cancel()

    async def _listening(self, connection: Any) -> None:
        tables = await connection.fetch(_FED_TABLES, PG_NOTIFY_FUNCTION)
        self.tables = tuple(sorted(str(row[0]) for row in tables))
        self.changed()  # whatever was committed while nobody listened
        self.heard = bool(self.tables)

    def _deaf(self) -> None:
        """The connection is lost, or could not be opened: nothing is kept until it is heard again."""
        self.heard = False
        self.changed()


#: ``session.info``/``connection.info`` keys of :class:`PgChanges`: the session a connection's
#: transaction belongs to, and a session that wrote to a notifying table.
_WRITER = "paddock_point_reads_writer"
_DIRTY = "paddock_point_reads_dirty"
#: The tables whose triggers call the notify function (unqualified names, as statements name them).
_FED_TABLES = """
    SELECT DISTINCT c.relname FROM pg_trigger t
    JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_class c ON c.oid = t.tgrelid
    WHERE p.proname = $1 AND NOT t.tgisinternal
"""

#: PostgreSQL: the channel :class:`PointReads` listens on, and the function whose presence says a
#: service's triggers NOTIFY it on every change to what its point reads read.
PG_CHANNEL = "paddock_point_reads"
PG_NOTIFY_FUNCTION = "paddock_point_reads_notify"


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
