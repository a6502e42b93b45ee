"""Volumes through the SDK (both clients) and the CLI (``paddock volume …``, each command with
``--json``), against the live platform of this folder: what a user of either does with a volume, and its
files without a sandbox (``client.volumes.files(...)``): seeded before any sandbox mounts it, shared
with one that runs, a tenant's symlink to the host's ``/etc`` shown and never followed."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import paddock
from paddock._models import Volume
from tests.cli.test_sandbox_cli import Cli
from tests.live import LivePlatform
from tests.volumes.conftest import platform_on
from tests.volumes.test_volumes_live import LINGER_S, settled, under, unmounted_after_linger

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


def test_a_volumes_files_are_seeded_before_a_sandbox_and_shared_with_one_that_runs(
    platform: LivePlatform,
) -> None:
    agent = platform.agents[0]
    with paddock.Client(api_key=platform.api_key(), base_url=platform.url) as client:
        client.volumes.create("seeded", 1024)
        try:
            files = client.volumes.files("seeded")  # by name, as every volume call takes it
            assert files.write("/app/config/settings.toml", "debug = false\n") == len("debug = false\n")
            assert files.read("/app/config/settings.toml") == b"debug = false\n"
            assert files.make_dir("/app/cache") is True and files.make_dir("/app/cache") is False
            listed = {entry.path: entry.type for entry in files.list("/app", depth=2)}
            assert listed == {"/app/cache": "dir", "/app/config": "dir", "/app/config/settings.toml": "file"}
            entry = files.stat("/app/config/settings.toml")
            assert (entry.size, entry.permissions, entry.owner) == (14, "-rw-r--r--", "0"), entry
            assert files.exists("/app") and not files.exists("/nothing")
            # One call is bounded: a file over 64 MiB is refused as it arrives, and nothing is written.
            with pytest.raises(paddock.PayloadTooLargeError):
                files.write("/too-big.bin", bytes(files.MAX_FILE_BYTES + 1))
            assert not files.exists("/too-big.bin")
            with pytest.raises(paddock.NotFoundError):
                files.read("/nothing")
            with pytest.raises(paddock.ValidationError, match="path"):
                files.read("relative/path")
            # No sandbox holds it: the calls share one mount on the host, kept a while after the last.
            volume_id = client.volumes.get("seeded").id
            assert under(agent.state_dir / "volumes")[0] == [
                str(agent.state_dir / "volumes" / volume_id / "mnt")
            ]
            # Another account reaches none of it, by name or by id.
            with paddock.Client(api_key=platform.api_key(), base_url=platform.url) as stranger:
                for ref in ("seeded", volume_id):
                    with pytest.raises(paddock.NotFoundError):
                        stranger.volumes.files(ref).read("/app/config/settings.toml")
                    with pytest.raises(paddock.NotFoundError):
                        stranger.volumes.files(ref).write("/planted.txt", "x")
            assert not files.exists("/planted.txt")

            with client.sandboxes.create(
                "s-1vcpu-256mb", volumes=[{"volume_id": "seeded", "mount_path": "/srv"}]
            ) as sandbox:
                # The sandbox took the volume while the calls' mount lingered: the mount is its now,
                # and the linger's end leaves it be.
                time.sleep(LINGER_S + 1)
                assert under(agent.state_dir / "volumes")[0] == [
                    str(agent.state_dir / "volumes" / volume_id / "mnt")
                ]
                files.write("/app/late.txt", b"late\n")
                assert sandbox.run("cat", ["/srv/app/late.txt"]).stdout == "late\n"
                assert sandbox.run("cat", ["/srv/app/config/settings.toml"]).stdout == "debug = false\n"
                made = sandbox.run("echo from-sandbox > /srv/app/out.txt && ln -s /etc /srv/etc", shell=True)
                assert made.exit_code == 0, made
                assert files.read("/app/out.txt") == b"from-sandbox\n"
                files.write("/app/beside.txt", b"written beside it\n")
                assert sandbox.run("cat", ["/srv/app/beside.txt"]).stdout == "written beside it\n"
                link = files.stat("/etc")
                assert (link.type, link.symlink_target) == ("symlink", "/etc"), link
                with pytest.raises(paddock.ValidationError, match="symlink"):
                    files.read("/etc/hostname")  # the host's, were it followed
                files.remove("/etc")
                assert Path("/etc/hostname").exists() and not files.exists("/etc")
                files.remove("/app/cache")
                assert sandbox.run("test", ["-e", "/srv/app/cache"]).exit_code != 0
                sandbox.destroy(wait=True)
            assert under(agent.state_dir / "volumes")[0] == []
            # Once the calls stop, the mount they shared goes.
            assert files.read("/app/out.txt") == b"from-sandbox\n"
            assert under(agent.state_dir / "volumes")[0] != []
            assert unmounted_after_linger(agent.state_dir / "volumes") == []
            assert settled(agent.state_dir / "volumes") == ([], [])
        finally:
            client.volumes.delete("seeded")


def test_a_volume_is_deleted_or_resized_right_after_a_file_call(platform: LivePlatform) -> None:
    """The mount a file call leaves for the next is no obstacle: a delete or a resize right after a
    call goes through, with nothing left mounted."""
    agent = platform.agents[0]
    with paddock.Client(api_key=platform.api_key(), base_url=platform.url) as client:
        client.volumes.create("brief", 512)
        files = client.volumes.files("brief")
        files.write("/a.txt", "a")
        assert client.volumes.resize("brief", 1024).size_mib == 1024
        assert files.read("/a.txt") == b"a"
        client.volumes.delete("brief")
        with pytest.raises(paddock.NotFoundError):
            client.volumes.get("brief")
        assert under(agent.state_dir / "volumes") == ([], [])


async def test_the_async_sdk_reads_and_writes_a_volumes_files(platform: LivePlatform) -> None:
    async with paddock.AsyncClient(api_key=platform.api_key(), base_url=platform.url) as client:
        await client.volumes.create("async-files", 512)
        try:
            files = client.volumes.files("async-files")
            assert await files.write("/a/b.txt", "async\n") == 6
            assert await files.read("/a/b.txt") == b"async\n"
            assert [entry.path for entry in await files.list("/", depth=2)] == ["/a", "/a/b.txt"]
            await files.remove("/a")
            assert await files.list("/") == []
        finally:
            await client.volumes.delete("async-files")


def test_every_volume_command_prints_json(platform: LivePlatform, tmp_path: Path) -> None:
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
    # One file in and out without a sandbox, into a directory under its own name, and through pipes.
    local = tmp_path / "init.sql"
    local.write_text("create table t (x int);\n")
    copied_in = run("cp", str(local), "cli-data:/seed/")
    assert copied_in == {"source": str(local), "destination": "cli-data:/seed/init.sql", "bytes": 24}
    piped = cli("volume", "cp", "-", "cli-data:/seed/piped.txt", stdin=b"from stdin\n")
    assert piped.returncode == 0 and piped.stderr.decode().strip() == "11 bytes", piped
    listed = run("files", "cli-data", "/", "--depth", "2")
    assert [(e["path"], e["type"]) for e in listed] == [
        ("/seed", "dir"),
        ("/seed/init.sql", "file"),
        ("/seed/piped.txt", "file"),
    ]
    copied_out = run("cp", "cli-data:/seed/init.sql", str(tmp_path / "back.sql"))
    assert copied_out["bytes"] == 24 and (tmp_path / "back.sql").read_text() == "create table t (x int);\n"
    out = cli("volume", "cp", "cli-data:/seed/piped.txt", "-")
    assert out.returncode == 0 and out.stdout == b"from stdin\n", out
    both = cli("volume", "cp", str(local), str(tmp_path / "x"))
    assert both.returncode == 2 and b"VOLUME:/path" in both.stderr
    refused = run("resize", "cli-data", "--size-mib", "700", code=1)  # the API refused it
    assert b"size_mib" in refused.stderr
    assert run("rm", "cli-data", "cli-other") == [
        {"id": made["id"], "deleted": True},
        {"id": plain.stdout.decode().strip(), "deleted": True},
    ]
    assert run("ls") == []
    missing = cli("volume", "get", "cli-data")
    assert missing.returncode != 0 and b"not found" in missing.stderr
