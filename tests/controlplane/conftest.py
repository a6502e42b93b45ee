"""Control-plane fixtures: a real server on a fresh database, users and keys made through the domain."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from paddock_controlplane import accounts
from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.db import make_engine, make_sessionmaker, transaction
from tests.conftest import LiveServer

HOST_TOKEN = "test-host-token-0123456789"


@dataclass
class ControlPlane:
    url: str
    settings: ControlPlaneSettings
    http: httpx.AsyncClient

    async def new_user(self, plan: str = "pro", credits: int = 500) -> tuple[str, str]:
        """Create a user and a key through the domain (what the admin CLI does); returns (user id, key)."""
        engine = make_engine(self.settings.database_url)
        try:
            async with transaction(make_sessionmaker(engine)) as session:
                user = await accounts.create_user(session, plan_id=plan, signup_credits=credits)
                key = await accounts.create_key(session, user.id)
            return user.id, key.plaintext
        finally:
            await engine.dispose()


@pytest.fixture
def cp_settings(database_url: str, tmp_path: Path) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        database_url=database_url,
        data_dir=tmp_path / "cp",
        host_token=SecretStr(HOST_TOKEN),
        secret_key=SecretStr("test-secret-key-0123456789"),
        region="eu",
        reconcile_interval_s=0.2,
    )


@pytest.fixture
async def controlplane(cp_settings: ControlPlaneSettings) -> AsyncIterator[ControlPlane]:
    await migrate(cp_settings)
    async with (
        LiveServer(create_app(cp_settings)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
    ):
        yield ControlPlane(url=server.url, settings=cp_settings, http=http)
