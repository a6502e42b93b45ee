"""The SDK's ``client.disks`` and ``sandbox.disks`` against a real control plane (host faked), async and
sync (the sync client is generated from the async one)."""

from __future__ import annotations

import asyncio

import pytest

import paddock
from paddock_controlplane.settings import ControlPlaneSettings
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.resources.test_networks import fake_host as fake_host

pytestmark = pytest.mark.db


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    return cp_settings.model_copy(update={"disk_allow_private_endpoints": True})


async def test_async_sdk_round_trip(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    _, key = await controlplane.new_user("pro", 500)
    async with paddock.AsyncClient(controlplane.url, key) as client:
        disk = await client.disks.create(
            "data",
            bucket="b1",
            endpoint="http://127.0.0.1:9000",
            access_key="AK",
            secret_key="SK",
            use_path_style=True,
        )
        assert disk.id.startswith("disk_") and disk.config["bucket"] == "b1"
        assert [d.id for d in await client.disks.list()] == [disk.id]
        assert (await client.disks.get("data")).id == disk.id
        await client.disks.rotate_credentials("data", access_key="AK2", secret_key="SK2")
        sandbox = await client.sandboxes.create("s-1vcpu-1gb")
        attached = await sandbox.disks.attach("data", "/mnt/data", sub_path="x")
        assert (attached.mount_status, attached.disk_id, attached.sub_path) == ("mounted", disk.id, "x")
        assert fake_host.disks[(sandbox.id, "/mnt/data")].secret_key == "SK2"  # the rotated key is used
        assert [d.mount_path for d in await sandbox.disks.list()] == ["/mnt/data"]
        with pytest.raises(paddock.ConflictError):
            await client.disks.delete("data")
        await sandbox.disks.detach(disk.id, "/mnt/data")
        assert await sandbox.disks.list() == []
        await client.disks.delete(disk.id)
        with pytest.raises(paddock.NotFoundError):
            await client.disks.get(disk.id)


async def test_sync_sdk_round_trip(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    _, key = await controlplane.new_user("pro", 500)

    def use() -> None:
        with paddock.Client(controlplane.url, key) as client:
            client.disks.create(
                "logs", bucket="b2", endpoint="https://s3.example.com", access_key="A", secret_key="S"
            )
            sandbox = client.sandboxes.create("s-1vcpu-1gb")
            assert sandbox.disks.attach("logs", "/logs").mount_status == "mounted"
            assert [d.name for d in sandbox.disks.list()] == ["logs"]

    await asyncio.to_thread(use)
