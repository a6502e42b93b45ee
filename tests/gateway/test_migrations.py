"""The gateway's migration tree applies and reverts cleanly on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect

from paddock_core.db import alembic_config, make_engine, upgrade
from paddock_gateway.adapters.chain import ChainClient
from paddock_gateway.app import MIGRATIONS, check_chains
from tests.gateway.conftest import Chain, gateway_settings

TABLES = {
    "gw_nonces",
    "gw_payments",
    "gw_wallets",
    "gw_credit_entries",
    "gw_projects",
    "gw_deployments",
    "gw_sandbox_deployments",
    "gw_x402_authorizations",
    "gw_x402_payment_ids",
}


async def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


@pytest.mark.db
async def test_upgrade_and_downgrade(database_url: str) -> None:
    await upgrade(MIGRATIONS, database_url)
    assert await table_names(database_url) >= TABLES
    await upgrade(MIGRATIONS, database_url)  # idempotent on restart
    await asyncio.to_thread(command.downgrade, alembic_config(MIGRATIONS, database_url), "base")
    assert not TABLES & await table_names(database_url)


@pytest.mark.chain
async def test_an_rpc_on_the_wrong_chain_stops_start_up(tmp_path: Path, devchains: dict[str, Chain]) -> None:
    settings = gateway_settings(
        tmp_path, rpc_url_base=devchains["arbitrum"].rpc_url, rpc_url_arbitrum=devchains["arbitrum"].rpc_url
    )
    registry = settings.registry()
    clients = {spec.name: ChainClient(spec.rpc_url) for spec in registry.ordered()}
    try:
        with pytest.raises(RuntimeError, match="reports chain id 42161, expected 8453"):
            await check_chains(registry, clients)
    finally:
        for client in clients.values():
            await client.aclose()
