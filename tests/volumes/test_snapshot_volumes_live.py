"""A snapshot that asks for its sandbox's volumes (``include_volumes``, issue #34, docs/volumes.md) on a
real control plane and host agent (the first container-tier runtime this machine has): the snapshot
keeps its own copy of each volume, so it outlives the source and its volume; each sandbox booted from it
gets its own new volume at the same path holding what the source wrote, and they diverge. A non-boolean
flag is a 400 naming it; a snapshot without the flag boots with no volume; a copy made for a snapshot the host does not hold whole is
removed when the agent starts; deleting the snapshot removes its copies and leaves the booted sandboxes'
volumes as they are."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.test_sandbox_cli import Cli
from tests.hostagent.conftest import TOKEN
from tests.live import LivePlatform
from tests.volumes.conftest import CONTAINER_RUNTIMES, platform_on
from tests.volumes.test_volumes_live import Account, wait_host

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """One runtime only (crun where there is one): the copy path is the host's, not the runtime's, and
    the fork's test already runs both."""
    runtime = next((name for name in CONTAINER_RUNTIMES if shutil.which(name)), None)
    if runtime is None:
        pytest.skip("no container runtime")
    with platform_on(runtime, guest_binary_dir) as live:
        yield live


def snapshot(account: Account, sandbox_id: str, **body: Any) -> dict[str, Any]:
    answer = account.http.post(f"/v1/sandboxes/{sandbox_id}/snapshots", json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"])


def held_by(account: Account, sandbox_id: str) -> list[dict[str, Any]]:
    """The user's volumes ``sandbox_id`` holds (and noted for deletion when the test ends)."""
    listed = account.http.get("/v1/volumes", params={"limit": 100}).json()["data"]["data"]
    mine = [v for v in listed if any(a["sandbox_id"] == sandbox_id for a in v["attachments"])]
    account.volumes.extend(v["id"] for v in mine if v["id"] not in account.volumes)
    return mine


def copies_on_host(platform: LivePlatform) -> dict[str, str | None]:
    """The volumes in the agent's store, and the snapshot each belongs to (None: a user's)."""
    directory = platform.agents[0].state_dir / "volumes"
    return {
        meta.parent.name: json.loads(meta.read_text()).get("snapshot_id")
        for meta in sorted(directory.glob("vol_*/volume.json"))
    }


def test_a_snapshot_with_include_volumes_boots_copies_that_diverge(
    platform: LivePlatform, account: Account
) -> None:
    data = account.volume("data")
    source = account.sandbox(volumes=[{"volume_id": data["id"], "mount_path": "/data"}])
    account.out(source, "echo from-source > /data/f.txt")  # no sync: the snapshot's copy must hold it

    bad = account.http.post(f"/v1/sandboxes/{source}/snapshots", json={"include_volumes": "yes"})
    assert bad.status_code == 400 and "include_volumes" in bad.text, bad.text
    # Taken through the CLI (``paddock sandbox snapshot --include-volumes``), the SDK under it.
    cli = Cli(platform.url, str(account.http.headers["X-API-Key"]))
    snap = cli.json("sandbox", "snapshot", source, "--include-volumes")
    assert isinstance(snap, dict) and snap["status"] == "ready", snap
    plain = snapshot(account, source)
    try:
        assert snap["volumes"] == [
            {"name": "data", "mount_path": "/data", "read_only": False, "size_mib": 1024}
        ]
        assert plain["volumes"] == []
        owned = [vid for vid, owner in copies_on_host(platform).items() if owner == snap["id"]]
        assert len(owned) == 1 and owned[0] != data["id"], copies_on_host(platform)
        assert snap["size_bytes"] > plain["size_bytes"]  # the copy's blocks are counted in the snapshot's

        # The snapshot outlives its source and the source's volume.
        account.destroy(source)
        assert account.http.delete(f"/v1/volumes/{data['id']}").status_code == 200
        account.volumes.remove(data["id"])

        first, second = account.sandbox(rootfs=snap["id"]), account.sandbox(rootfs=snap["id"])
        [one], [two] = held_by(account, first), held_by(account, second)
        assert one["id"] != two["id"] and one["name"].startswith("data-snap-") and one["size_mib"] == 1024
        assert one["attachments"] == [{"sandbox_id": first, "mount_path": "/data", "read_only": False}]
        assert (
            account.out(first, "cat /data/f.txt") == account.out(second, "cat /data/f.txt") == "from-source\n"
        )
        account.out(first, "echo one > /data/mine.txt && sync")
        account.out(second, "echo two > /data/mine.txt && sync")
        assert account.out(first, "cat /data/mine.txt") == "one\n"
        assert account.out(second, "cat /data/mine.txt") == "two\n"

        # Without the flag, no volume.
        bare = account.sandbox(rootfs=plain["id"])
        assert held_by(account, bare) == []
        assert account.sh(bare, "test -e /data/f.txt")["exit_code"] != 0

        # A copy made for a snapshot this host does not hold whole (an agent killed between the copy
        # and the disk) is removed when the agent starts; the snapshot's own copy stays.
        stray = "vol_" + "0" * 20 + "stray"
        made = httpx.post(
            f"{platform.agents[0].url}/internal/v1/volumes/{one['id']}/clone",
            json={"volume_id": stray, "snapshot_id": "snap_" + "0" * 20 + "gone"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        assert made.status_code == 200, made.text
        platform.agents[0].stop(signal.SIGKILL)
        platform.agents[0].start()
        wait_host(platform, account)
        on_host = copies_on_host(platform)
        assert stray not in on_host and owned[0] in on_host, on_host

        # Deleting the snapshot removes its copy; the booted sandboxes keep their volumes.
        assert account.http.delete(f"/v1/snapshots/{snap['id']}").status_code == 200
        on_host = copies_on_host(platform)
        assert owned[0] not in on_host and {one["id"], two["id"]} <= set(on_host), on_host
        assert account.out(first, "cat /data/f.txt /data/mine.txt") == "from-source\none\n"
    finally:
        for made_snapshot in (snap, plain):
            account.http.delete(f"/v1/snapshots/{made_snapshot['id']}")
