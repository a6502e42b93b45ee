"""Local volumes on the gVisor tier (issue #34, docs/volumes.md) through the public API, on a real control
plane, host agent under runsc, loop devices and XFS.

gVisor's sentry binds host directories only when a sandbox starts, so a create sends its volumes to the
host before the create call and the host binds each one into the container. A volume written by one
gVisor sandbox is read by the next once the first is destroyed; read-only holders cannot write; a live
attach and a hibernation (which would lose the binds) are 409s naming the tier; the volume's files read
and written without a sandbox (``/v1/volumes/{ref}/files``) are seen by the running gVisor sandbox, and
what it writes by them; nothing is left mounted.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import LivePlatform
from tests.loopdevices import holders
from tests.volumes.conftest import platform_on
from tests.volumes.test_volumes_live import Account, settled

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("runsc") is None, reason="no runsc"),
]


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    with platform_on("runsc", guest_binary_dir) as live:
        yield live


def test_a_volume_written_in_one_gvisor_sandbox_is_read_in_the_next(
    platform: LivePlatform, account: Account
) -> None:
    vid = account.volume("gv")["id"]
    first = account.sandbox(volumes=[{"volume_id": vid, "mount_path": "/data/db"}])
    account.out(
        first,
        "echo one > /data/db/one.txt; head -c 2000000 /dev/urandom > /data/db/blob;"
        " cd /data/db && sha256sum blob > blob.sum; sync",
    )
    account.destroy(first)

    second = account.sandbox(volumes=[{"volume_id": "gv", "mount_path": "/mnt/vol"}])
    assert account.out(second, "cat /mnt/vol/one.txt") == "one\n"
    assert "OK" in account.out(second, "cd /mnt/vol && sha256sum -c blob.sum")
    # What the first wrote is on the volume, not on a sandbox's own disk: the second's root has no /data.
    assert account.sh(second, "test -e /data/db/one.txt")["exit_code"] != 0

    # A running gVisor sandbox takes no volume (its sentry binds host directories only at its start),
    # and cannot be hibernated while it holds one (a woken one would not have it).
    spare = account.volume("spare", 512)["id"]
    live = account.http.post(f"/v1/sandboxes/{second}/volumes", json={"volume_id": spare, "mount_path": "/s"})
    assert live.status_code == 409 and "gvisor" in live.text, live.text
    hibernate = account.http.post(f"/v1/sandboxes/{second}/pause", json={"keep_memory": False})
    assert hibernate.status_code == 409 and "gvisor" in hibernate.text, hibernate.text
    assert account.out(second, "cat /mnt/vol/one.txt") == "one\n"
    # Its files without a sandbox, beside the running gVisor sandbox, both ways.
    put = account.http.put(f"/v1/volumes/{vid}/files", params={"path": "/from-host.txt"}, content=b"host\n")
    assert put.status_code == 200, put.text
    assert account.out(second, "cat /mnt/vol/from-host.txt") == "host\n"
    account.out(second, "echo gvisor > /mnt/vol/from-gvisor.txt")
    read = account.http.get(f"/v1/volumes/{vid}/files", params={"path": "/from-gvisor.txt"})
    assert read.status_code == 200 and read.content == b"gvisor\n", read.text
    account.destroy(second)

    agent = platform.agents[0]
    points, loops = settled(agent.state_dir / "volumes")
    assert points == [] and loops == [], (points, loops, holders(loops))


def test_gvisor_readers_share_a_volume_and_cannot_write_it(platform: LivePlatform, account: Account) -> None:
    vid = account.volume("gvro")["id"]
    writer = account.sandbox(volumes=[{"volume_id": vid, "mount_path": "/data"}])
    account.out(writer, "echo from-writer > /data/f.txt; sync")
    refused = account.create(volumes=[{"volume_id": vid, "mount_path": "/data", "read_only": True}])
    assert refused.status_code == 409 and writer in refused.text, refused.text
    account.destroy(writer)

    readers = [
        account.sandbox(volumes=[{"volume_id": vid, "mount_path": "/ro", "read_only": True}])
        for _ in range(2)
    ]
    for reader in readers:
        assert account.out(reader, "cat /ro/f.txt") == "from-writer\n"
        denied = account.sh(reader, "echo x > /ro/new.txt")
        assert denied["exit_code"] != 0 and "Read-only file system" in denied["stderr"], denied
        assert account.sh(reader, "rm /ro/f.txt")["exit_code"] != 0
    assert account.out(readers[0], "cat /ro/f.txt") == "from-writer\n"
    held = account.http.get(f"/v1/volumes/{vid}").json()["data"]["attachments"]
    assert sorted(a["sandbox_id"] for a in held) == sorted(readers)
    refused = account.create(volumes=[{"volume_id": vid, "mount_path": "/data"}])
    assert refused.status_code == 409, refused.text
    for reader in readers:
        account.destroy(reader)

    # With no holder left, a writer may mount it again, and finds it as the first writer left it.
    again = account.sandbox(volumes=[{"volume_id": vid, "mount_path": "/data"}])
    # (no `ls`: the 2022 sentry refuses the statx of newer coreutils, docs/isolation.md)
    assert account.out(again, "cat /data/f.txt; echo /data/*") == "from-writer\n/data/f.txt\n"
    account.destroy(again)
    points, loops = settled(platform.agents[0].state_dir / "volumes")
    assert points == [] and loops == [], (points, loops, holders(loops))
