"""A SQLAlchemy asyncio dialect for SQLite that runs each statement on the event loop's own thread.

aiosqlite (SQLAlchemy's asyncio SQLite driver) sends every call to a thread of its own and back:
cursor, execute, fetch, close, commit, each ~40 µs of hand-over on the 2-core dev box, eight of them for
``BEGIN; SELECT 1``. A control-plane pause is two transactions of a dozen statements, so the database's
share of it was ~10 ms, for work SQLite itself does in well under one (WAL, ``synchronous=NORMAL``:
a commit is not an fsync). Here the same ``sqlite3`` calls run inline, inside SQLAlchemy's greenlet,
and cost what SQLite costs.

The one thing a thread gave for free was waiting for a lock. A synchronous wait on the loop's thread
would stall every request, and could never end if the lock holder is a transaction of this same
process waiting for its turn on the loop. So the connection's busy timeout is 0, and a statement that
finds the database locked (``SQLITE_BUSY``) is retried after an asynchronous sleep, which lets the
holder finish: the wait yields, through SQLAlchemy's greenlet bridge (``await_``), exactly like
aiosqlite's does. The retries stop after ``BUSY_WAIT_S`` (the 30 s busy timeout the engine had) with
the same ``OperationalError``. ``SQLITE_BUSY_SNAPSHOT`` (a deferred reader that later writes after
another commit) is not retried, as SQLite's busy handler would not either.

What still runs on the loop is the statement itself: keep scans bounded (they were already, as they
held aiosqlite's one thread per connection), and know that a commit which triggers a WAL checkpoint
pays for it inline (a few ms at SQLite's default of 1,000 pages).

Registered as ``sqlite+paddock_loop``; ``db.make_engine`` uses it for every SQLite URL, so
``sqlite+aiosqlite://`` URLs in existing configuration keep working unchanged.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import pool
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import URL
from sqlalchemy.util import await_

T = TypeVar("T")

#: How long a statement keeps retrying a locked database before giving up (the old busy timeout).
BUSY_WAIT_S = 30.0
_FIRST_DELAY_S = 0.0005
_MAX_DELAY_S = 0.02


def _locked(exc: sqlite3.OperationalError) -> bool:
    # ``sqlite_errorname`` (Python 3.11+) tells SQLITE_BUSY from SQLITE_BUSY_SNAPSHOT, which must not
    # be retried; the message is the fallback for builds without it.
    name = getattr(exc, "sqlite_errorname", None)
    if name is not None:
        return bool(name in ("SQLITE_BUSY", "SQLITE_LOCKED"))
    return "database is locked" in str(exc)


async def _done() -> None:
    """Awaited once per statement: SQLAlchemy's asyncio layer refuses a statement during which its
    greenlet never switched (``AwaitRequired``, its guard against a sync driver by mistake). Awaiting a
    finished coroutine switches without yielding to the loop."""


def _yielding(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``; while the database is locked, sleeps asynchronously and tries again."""
    await_(_done())
    deadline = 0.0
    delay = _FIRST_DELAY_S
    while True:
        try:
            return call(*args)
        except sqlite3.OperationalError as exc:
            if not _locked(exc):
                raise
            now = time.monotonic()
            deadline = deadline or now + BUSY_WAIT_S
            if now >= deadline:
                raise
        await_(asyncio.sleep(delay))
        delay = min(delay * 2, _MAX_DELAY_S)


class _Cursor:
    """A ``sqlite3.Cursor`` whose execute waits for a lock without blocking the loop."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def execute(self, sql: str, parameters: Any = ()) -> _Cursor:
        _yielding(self._cursor.execute, sql, parameters)
        return self

    def executemany(self, sql: str, seq_of_parameters: Any) -> _Cursor:
        _yielding(self._cursor.executemany, sql, seq_of_parameters)
        return self

    async def _async_soft_close(self) -> None:
        """Called by SQLAlchemy's asyncio results on adapted cursors; a sqlite3 cursor's rows stay
        readable and its close is synchronous, so there is nothing to do early."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _Connection:
    """A ``sqlite3.Connection`` handing out ``_Cursor``s; everything else is the connection's own."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        object.__setattr__(self, "_connection", connection)

    def cursor(self) -> _Cursor:
        return _Cursor(self._connection.cursor())

    def commit(self) -> None:
        _yielding(self._connection.commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)  # isolation_level, set by the engine's connect hook


class SQLiteDialect_paddock_loop(SQLiteDialect_pysqlite):
    driver = "paddock_loop"
    is_async = True
    supports_statement_cache = True
    supports_server_side_cursors = False

    @classmethod
    def get_pool_class(cls, url: URL) -> type[pool.Pool]:
        # asyncio-aware waiting for a free connection; one connection per transaction in flight.
        return pool.AsyncAdaptedQueuePool if cls._is_url_file_db(url) else pool.StaticPool

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = 0  # never wait for a lock on the loop's thread: ``_yielding`` does
        kwargs["check_same_thread"] = False  # made and used on the loop's thread; disposed from any
        return _Connection(sqlite3.connect(*args, **kwargs))

    def get_driver_connection(self, connection: Any) -> Any:
        return connection._connection


registry.register("sqlite.paddock_loop", __name__, "SQLiteDialect_paddock_loop")
#: The URL driver name of this dialect (registered on import).
DRIVERNAME = "sqlite+paddock_loop"
