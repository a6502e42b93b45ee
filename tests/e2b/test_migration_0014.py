"""Migration 0014 moves what 0012 kept in E2B-only tables into the native columns: a database with an
E2B sandbox's lifetime (``autoPause``: pause) and metadata, upgraded, shows them in ``sandboxes``'
``timeout_s``/``on_timeout``/``end_at``/``metadata``; a sandbox that already had native values keeps
them; ``e2b_sandboxes`` keeps the templateID; the E2B-only tables and columns are gone."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, inspect, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncEngine

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.resources import accounts
from paddock_core.db import make_engine, make_sessionmaker, transaction, upgrade
from paddock_core.timeutil import as_utc

pytestmark = pytest.mark.db


def _sandbox_row(columns: set[str], sandbox_id: str, user_id: str, **native: object) -> dict[str, Any]:
    """A ``sandboxes`` row as the model writes it, for the columns the table has at 0013: later
    migrations add columns (0019 ``hibernated``, …) that an ORM insert at 0013 would name."""
    given: dict[str, object] = {
        "id": sandbox_id,
        "user_id": user_id,
        "name": sandbox_id,
        "status": "running",
        "shape": "s-1vcpu-1gb",
        "rootfs": "debian:13",
        "vcpu": 1,
        "mem_mib": 1024,
        "disk_mib": 1024,
        "region": "eu",
        **native,
    }
    row: dict[str, Any] = {}
    for attribute in sa_inspect(Sandbox).column_attrs:
        column = attribute.columns[0]
        if column.name not in columns:
            continue
        if attribute.key in given:
            row[column.name] = given[attribute.key]
        elif column.default is not None and column.default.is_scalar:
            row[column.name] = column.default.arg
        elif column.default is not None and column.default.is_callable:
            row[column.name] = column.default.arg(None)
    return row


async def _insert_sandboxes(engine: AsyncEngine, rows: list[tuple[str, str, dict[str, object]]]) -> None:
    async with engine.begin() as conn:
        table = await conn.run_sync(lambda c: Table("sandboxes", MetaData(), autoload_with=c))
        columns = {column.name for column in table.columns}
        for sandbox_id, user_id, native in rows:
            await conn.execute(table.insert().values(**_sandbox_row(columns, sandbox_id, user_id, **native)))


async def test_e2b_lifetimes_and_metadata_move_to_the_native_columns(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url, "0013")
    engine = make_engine(database_url)
    end = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    async with transaction(make_sessionmaker(engine)) as session:
        user = await accounts.create_user(session, plan_id="pro", signup_credits=500)
    await _insert_sandboxes(
        engine,
        [
            ("sb-e2b", user.id, {}),
            ("sb-both", user.id, {"timeout_s": 60, "on_timeout": "destroy", "labels": {"mine": "1"}}),
        ],
    )
    async with engine.begin() as conn:
        for sandbox_id, auto_pause in (("sb-e2b", True), ("sb-both", False)):
            await conn.execute(
                text(
                    "INSERT INTO e2b_sandboxes (sandbox_id, user_id, template_id, timeout_s, auto_pause, end_at,"
                    " created_at) VALUES (:sid, :uid, 'base', 120, :ap, :end, CURRENT_TIMESTAMP)"
                ),
                {"sid": sandbox_id, "uid": user.id, "ap": auto_pause, "end": end},
            )
            await conn.execute(
                text("INSERT INTO e2b_sandbox_metadata (sandbox_id, key, value) VALUES (:sid, 'suite', 'x')"),
                {"sid": sandbox_id},
            )
    await upgrade(MIGRATIONS, database_url)
    async with make_sessionmaker(engine)() as session:
        moved = await session.get(Sandbox, "sb-e2b")
        kept = await session.get(Sandbox, "sb-both")
        assert moved is not None and kept is not None
        assert (moved.timeout_s, moved.on_timeout, moved.labels) == (120, "pause", {"suite": "x"})
        assert moved.end_at is not None and as_utc(moved.end_at) == end
        assert (kept.timeout_s, kept.on_timeout, kept.labels) == (60, "destroy", {"mine": "1"})
        templates = (await session.execute(text("SELECT sandbox_id, template_id FROM e2b_sandboxes"))).all()
        assert sorted(tuple(row) for row in templates) == [("sb-both", "base"), ("sb-e2b", "base")]
    async with engine.connect() as conn:
        tables = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        columns = await conn.run_sync(
            lambda c: {col["name"] for col in inspect(c).get_columns("e2b_sandboxes")}
        )
    assert "e2b_sandbox_metadata" not in tables
    # The E2B-only columns went; later migrations may add others of their own.
    assert {"sandbox_id", "user_id", "template_id", "created_at"} <= columns
    assert not {"timeout_s", "auto_pause", "end_at"} & columns
    await engine.dispose()
