"""Migration 0030 moves what 0028 and 0029 kept beside an E2B sandbox (``maskRequestHost``,
``httpsPorts``) onto the sandbox's own row, where /v1 reads and patches it: a database at 0029 with an E2B
sandbox that set both, one that set neither and a /v1 sandbox, upgraded, shows the first one's values in
``sandboxes`` and nothing on the others; the columns are gone from ``e2b_sandboxes``; a downgrade puts
the values back there."""

from __future__ import annotations

import asyncio
import json

import pytest
from alembic import command
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.resources import accounts
from paddock_core.db import alembic_config, make_engine, make_sessionmaker, transaction, upgrade
from tests.e2b.test_migration_0014 import _insert_sandboxes

pytestmark = pytest.mark.db

MASK = "${PORT}-myapp.example.test"


def _ports(raw: object) -> object:
    """A JSON column as read by a text query: a string on SQLite, decoded already on PostgreSQL."""
    return json.loads(raw) if isinstance(raw, str) else raw


async def _read(engine: AsyncEngine, query: str, table: str) -> tuple[dict[str, object], set[str]]:
    """``{id: (host header, ports)}`` from ``query``, and the columns of ``table``."""
    async with engine.connect() as conn:
        rows = {row[0]: (row[1], _ports(row[2])) for row in await conn.execute(text(query))}
        columns = await conn.run_sync(lambda c: {col["name"] for col in inspect(c).get_columns(table)})
    return rows, columns


async def test_app_ports_move_onto_the_sandbox_row_and_back(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url, "0029")
    engine = make_engine(database_url)
    try:
        async with transaction(make_sessionmaker(engine)) as session:
            user = await accounts.create_user(session, plan_id="pro", signup_credits=500)
        await _insert_sandboxes(
            engine, [("sb-set", user.id, {}), ("sb-plain", user.id, {}), ("sb-v1", user.id, {})]
        )
        async with engine.begin() as conn:
            for sandbox_id, mask, ports in (("sb-set", MASK, "[8443, 9443]"), ("sb-plain", None, None)):
                await conn.execute(
                    text(
                        "INSERT INTO e2b_sandboxes (sandbox_id, user_id, template_id, created_at,"
                        " mask_request_host, https_ports) VALUES (:id, :user, 'base', CURRENT_TIMESTAMP,"
                        " :mask, :ports)"
                    ),
                    {"id": sandbox_id, "user": user.id, "mask": mask, "ports": ports},
                )
        await upgrade(MIGRATIONS, database_url, "0030")
        rows, e2b_columns = await _read(
            engine, "SELECT id, ingress_host_header, ingress_https_ports FROM sandboxes", "e2b_sandboxes"
        )
        assert rows == {"sb-set": (MASK, [8443, 9443]), "sb-plain": (None, None), "sb-v1": (None, None)}
        assert not {"mask_request_host", "https_ports"} & e2b_columns
        assert {"sandbox_id", "template_id"} <= e2b_columns

        await asyncio.to_thread(command.downgrade, alembic_config(MIGRATIONS, database_url), "0029")
        back, columns = await _read(
            engine, "SELECT sandbox_id, mask_request_host, https_ports FROM e2b_sandboxes", "sandboxes"
        )
        assert back == {"sb-set": (MASK, [8443, 9443]), "sb-plain": (None, None)}
        assert not {"ingress_host_header", "ingress_https_ports"} & columns
        await upgrade(MIGRATIONS, database_url)
    finally:
        await engine.dispose()
