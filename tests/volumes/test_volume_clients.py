"""Volumes through the SDK (both clients) and the CLI (``paddock volume …``, each command with
``--json``), against the live platform of this folder: what a user of either does with a volume."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import paddock
from paddock._models import Volume
from tests.cli.test_sandbox_cli import Cli
from tests.live import LivePlatform
from tests.volumes.conftest import platform_on

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """The clients need one runtime, not each (the live tests cover crun and runc)."""
    with platform_on("crun" if shutil.which("crun") else "runc", guest_binary_dir) as live:
        yield live


def test_the_sync_sdk_creates_mounts_reads_resizes_and_deletes_a_volume(platform: LivePlatform) -> None:
    with paddock.Client(api_key=platform.api_key(), base_url=platform.url) as client:
        volume = client.volumes.create("sdk-data", 1024)
        try:
            assert isinstance(volume, Volume) and volume.id.startswith("vol_") and volume.status == "ready"
            writer = client.sandboxes.create(
                "s-1vcpu-256mb", volumes=[{"volume_id": "sdk-data", "mount_path": "/data"}]
            )
            with writer:
                assert writer.run("echo sdk > /data/f; cat /data/f", shell=True).stdout == "sdk\n"
                held = client.volumes.get("sdk-data").attachments
                assert [(a.sandbox_id, a.mount_path, a.read_only) for a in held] == [
                    (writer.id, "/data", False)
                ]
                with pytest.raises(paddock.ConflictError, match=writer.id):
                    client.volumes.delete(volume.id)
                writer.detach_volume("sdk-data")
            with client.sandboxes.create("s-1vcpu-256mb") as reader:
                reader.attach_volume(volume.id, "/ro", read_only=True)
                assert reader.run("cat", ["/ro/f"]).stdout == "sdk\n"
                assert reader.run("touch /ro/x", shell=True).exit_code != 0
                reader.destroy(wait=True)  # destroyed, not destroying: it holds the volume no more
            assert client.volumes.resize("sdk-data", 2048).size_mib == 2048
            assert [v.id for v in client.volumes.list()] == [volume.id]
        finally:
            client.volumes.delete(volume.id)
        assert client.volumes.list() == []


async def test_the_async_sdk_makes_and_deletes_a_volume(platform: LivePlatform) -> None:
    async with paddock.AsyncClient(api_key=platform.api_key(), base_url=platform.url) as client:
        volume = await client.volumes.create("async-data", 512)
        try:
            async with await client.sandboxes.create(
                "s-1vcpu-256mb", volumes=[{"volume_id": volume.id, "mount_path": "/v", "read_only": True}]
            ) as sandbox:
                assert (await sandbox.run("stat", ["-f", "-c", "%T", "/v"])).stdout == "xfs\n"
                await sandbox.destroy(wait=True)
            assert (await client.volumes.get("async-data")).attachments == []
        finally:
            await client.volumes.delete("async-data")
        with pytest.raises(paddock.NotFoundError):
            await client.volumes.get(volume.id)


def test_every_volume_command_prints_json(platform: LivePlatform) -> None:
    cli = Cli(platform.url, platform.api_key())

    def run(*args: str, code: int = 0) -> Any:
        done = cli("volume", *args, "--json")
        assert done.returncode == code, (args, done.stderr.decode())
        return json.loads(done.stdout) if code == 0 else done

    made = run("create", "cli-data", "--size-mib", "600")
    assert made["id"].startswith("vol_") and made["size_mib"] == 600 and made["status"] == "ready"
    plain = cli("volume", "create", "cli-other", "--size-mib", "512")
    assert plain.returncode == 0 and plain.stdout.decode().strip().startswith("vol_")  # only its id
    assert {v["name"] for v in run("ls")} == {"cli-data", "cli-other"}
    assert run("get", "cli-data")["id"] == made["id"]
    assert run("resize", "cli-data", "--size-mib", "1024")["size_mib"] == 1024
    refused = run("resize", "cli-data", "--size-mib", "700", code=1)  # the API refused it
    assert b"size_mib" in refused.stderr
    assert run("rm", "cli-data", "cli-other") == [
        {"id": made["id"], "deleted": True},
        {"id": plain.stdout.decode().strip(), "deleted": True},
    ]
    assert run("ls") == []
    missing = cli("volume", "get", "cli-data")
    assert missing.returncode != 0 and b"not found" in missing.stderr
