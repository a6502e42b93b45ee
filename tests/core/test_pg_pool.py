"""PostgreSQL's pool (``db.make_engine``): a transaction on a connection used a moment ago goes straight
to work, with no ping before it (SQLAlchemy's ``pool_pre_ping`` sent BEGIN, an empty query and ROLLBACK
before every one); a connection idle past ``PG_PING_IDLE_AFTER_S`` is pinged first; and one its server
closed (``pg_terminate_backend``, as a restart does) is replaced, so the transaction still works.

Every statement each connection sends is read from asyncpg's query logger on the real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from paddock_core import db
from tests.conftest import _pg_database, _pg_execute, pg_admin_url


class Statements:
    """The statements every connection of an engine sends, in order, but for prepared ones (asyncpg logs
    only those it sends as text: BEGIN, COMMIT, ROLLBACK, and the ping's empty query)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.sent: list[str] = []

        @event.listens_for(engine.sync_engine, "connect")
        def _log(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.driver_connection.add_query_logger(lambda record: self.sent.append(record.query))

    async def take(self) -> list[str]:
        await asyncio.sleep(0.05)  # asyncpg calls its loggers soon after each statement, not during it
        sent, self.sent = self.sent, []
        return [statement.strip().rstrip(";").upper() for statement in sent]


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async with _pg_database() as url:
        yield url


async def backend_pid(engine: AsyncEngine) -> int:
    async with db.transaction(db.make_sessionmaker(engine)) as session:
        return int((await session.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def test_a_connection_used_a_moment_ago_is_not_pinged_and_an_idle_one_is(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "PG_PING_IDLE_AFTER_S", 0.5)
    engine = db.make_engine(pg_url)
    statements = Statements(engine)
    try:
        first = await backend_pid(engine)
        await statements.take()
        for _ in range(5):
            assert await backend_pid(engine) == first  # the same connection, last in first out
        assert await statements.take() == ["BEGIN", "COMMIT"] * 5
        await asyncio.sleep(0.7)
        assert await backend_pid(engine) == first
        assert await statements.take() == ["", "BEGIN", "COMMIT"]  # the ping (";") first
    finally:
        await engine.dispose()


async def test_a_connection_its_server_closed_is_replaced_before_the_transaction_uses_it(pg_url: str) -> None:
    engine = db.make_engine(pg_url)
    try:
        first = await backend_pid(engine)
        await _pg_execute(pg_admin_url(), f"SELECT pg_terminate_backend({first})")
        await asyncio.sleep(0.2)  # the server's goodbye reaches the pooled connection
        second = await backend_pid(engine)  # no error: the pool replaced the closed connection
        assert second != first
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()
