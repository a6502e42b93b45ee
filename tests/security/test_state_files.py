"""State files are the service user's alone (issue #12): databases with their -wal/-shm, the gateway's
key, host agent records and the data directory are 0600/0700 even under the usual 022 umask, and files an
older version left 0644 are closed on the next start."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from paddock_cli import serve
from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_gateway.settings import GatewaySettings
from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord
from paddock_hostagent.records import RecordStore
from tests.conftest import LiveServer
from tests.gateway.conftest import RECIPIENT


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The umask most systems run services with: without the fixes every file below is 0644."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


async def test_a_control_plane_on_sqlite_keeps_its_database_files_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"  # made by the control plane itself
    settings = ControlPlaneSettings(
        data_dir=data_dir,
        host_token=SecretStr("test-host-token-0123456789"),
        secret_key=SecretStr("test-secret-key-0123456789"),
    )
    await migrate(settings)
    async with LiveServer(create_app(settings)) as server, httpx.AsyncClient(base_url=server.url) as http:
        beat = {"id": "host-1", "url": "http://127.0.0.1:9", "free_mib": 1024, "total_mib": 1024}
        resp = await http.post(
            "/internal/v1/hosts/heartbeat",
            json=beat,
            headers={"Authorization": "Bearer test-host-token-0123456789"},
        )
        assert resp.status_code == 200  # a write: the WAL and shared-memory files exist now
        database = data_dir / "controlplane.db"
        files = [database, data_dir / "controlplane.db-wal", data_dir / "controlplane.db-shm"]
        assert all(path.exists() for path in files)
        assert {str(path.name): mode(path) for path in files} == {path.name: 0o600 for path in files}
        assert mode(data_dir) == 0o700


async def test_database_files_an_older_version_left_readable_are_closed_on_start(tmp_path: Path) -> None:
    settings = ControlPlaneSettings(
        data_dir=tmp_path,
        host_token=SecretStr("test-host-token-0123456789"),
        secret_key=SecretStr("test-secret-key-0123456789"),
    )
    await migrate(settings)
    database = tmp_path / "controlplane.db"
    wal = tmp_path / "controlplane.db-wal"
    wal.touch()
    for path in (database, wal):
        os.chmod(path, 0o644)
    await migrate(settings)  # what every start does first
    assert mode(database) == 0o600 and mode(wal) == 0o600


def test_the_gateways_generated_key_and_its_directory_are_private(tmp_path: Path) -> None:
    settings = GatewaySettings(data_dir=tmp_path / "gw", recipient=RECIPIENT)
    settings.secret_box()
    assert mode(tmp_path / "gw" / "gateway-secret.key") == 0o600
    assert mode(tmp_path / "gw") == 0o700


def test_host_agent_records_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "host" / "sandboxes"
    directory.mkdir(parents=True)  # as an older agent made it: 0755
    store = RecordStore(directory)
    record = SandboxRecord(
        id="sb-1",
        name="one",
        image="debian:13",
        vcpu=1,
        mem_mib=256,
        disk_mib=1024,
        cpu_quota_pct=None,
        ip="10.88.0.2",
        state=RuntimeState.RUNNING,
        driver="oci",
    )
    store.save(record)
    assert mode(directory) == 0o700
    assert mode(directory / "sb-1.json") == 0o600
    assert [r.id for r in store.load_all()] == ["sb-1"]


def test_serve_makes_its_data_directory_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "paddock"
    data_dir.mkdir()  # 0755, as an installer might leave it
    serve.private_data_dir(data_dir)
    assert mode(data_dir) == 0o700
    serve.load_or_create_secrets(data_dir)
    assert mode(data_dir / "secrets.env") == 0o600
