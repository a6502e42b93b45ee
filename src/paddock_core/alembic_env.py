"""The body of every service's Alembic ``env.py``: run migrations through an async engine."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import MetaData
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool


def run(metadata: MetaData, version_table: str) -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url, "sqlalchemy.url is not set"

    def do_run(connection: Connection) -> None:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table=version_table,
            render_as_batch=url.startswith("sqlite"),
        )
        with context.begin_transaction():
            context.run_migrations()

    async def main() -> None:
        engine = create_async_engine(url, poolclass=NullPool)
        async with engine.connect() as connection:
            await connection.run_sync(do_run)
            await connection.commit()
        await engine.dispose()

    # Alembic runs in a worker thread (see db.upgrade), which has no running loop of its own.
    asyncio.run(main())
