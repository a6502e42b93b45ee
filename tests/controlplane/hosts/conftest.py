"""A migrated control-plane database and its sessions, for tests of the fleet's statements that need no
running control plane (placement, liveness, the fleet's images)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import async_sessionmaker

from paddock_controlplane.app import migrate
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.db import make_engine, make_sessionmaker


@pytest.fixture
async def sessions(cp_database_url: str, tmp_path: Path) -> AsyncIterator[async_sessionmaker]:  # type: ignore[type-arg]
    settings = ControlPlaneSettings(
        database_url=cp_database_url,
        data_dir=tmp_path / "cp",
        host_token=SecretStr("fleet-host-token-0123456789"),
        secret_key=SecretStr("fleet-secret-key-0123456789"),
        region="eu",
    )
    await migrate(settings)
    engine = make_engine(cp_database_url)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()
