"""Local volumes on the VM tier (issue #34, docs/volumes.md, docs/isolation-vm.md) through the public API,
on a real control plane and a host agent under QEMU (TCG here: each create boots a kernel, seconds).

A VM gets a volume as an extra virtio-blk drive (the volume's image file) at its boot, which
``paddock-vminit`` mounts at its path inside the VM. A volume written by one VM is read by the next once
the first is destroyed; a read-only drive refuses writes; a live attach, a fork and a snapshot of a VM
holding a volume are 409s naming the tier, and so is reading its files on the host (E2B's volume
content API), which works once no VM holds it. The mount such a read leaves for the calls after it is
taken down before the next VM boots with the volume; nothing of the volume stays mounted on the host.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from tests.hostagent.conftest import TOKEN
from tests.live import LivePlatform
from tests.volumes.conftest import platform_on
from tests.volumes.test_volumes_live import Account, settled, under

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]

VM = {"shape": "s-1vcpu-1gb", "disk_mib": 2048}


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    with platform_on("qemu", guest_binary_dir) as live:
        yield live


def test_a_volume_written_in_one_vm_is_read_in_the_next_and_a_read_only_drive_refuses_writes(
    platform: LivePlatform, account: Account
) -> None:
    agent = platform.agents[0]
    vid = account.volume("vmvol")["id"]
    first = account.sandbox(**VM, volumes=[{"volume_id": vid, "mount_path": "/data/db"}])
    assert account.out(first, "stat -f -c %T /data/db").strip() == "xfs"
    account.out(
        first,
        "echo one > /data/db/one.txt; head -c 3000000 /dev/urandom > /data/db/blob;"
        " cd /data/db && sha256sum blob > blob.sum; sync",
    )
    # The host never mounts a VM's volume (two kernels on one XFS would break it).
    assert under(agent.state_dir / "volumes")[0] == []
    # A VM holding a volume takes no other live, and is neither forked nor snapshotted (its memory has
    # the volume mounted: a copy would be a second writer).
    spare = account.volume("spare", 512)["id"]
    live = account.http.post(f"/v1/sandboxes/{first}/volumes", json={"volume_id": spare, "mount_path": "/s"})
    assert live.status_code == 409 and "vm" in live.text, live.text
    fork = account.http.post(f"/v1/sandboxes/{first}/fork", json={})
    assert fork.status_code == 409 and "volume" in fork.text and "vm" in fork.text, fork.text
    snapshot = account.http.post(f"/v1/sandboxes/{first}/snapshots", json={"name": "s"})
    assert snapshot.status_code == 409 and "volume" in snapshot.text, snapshot.text
    grow = account.http.patch(f"/v1/volumes/{vid}", json={"size_mib": 2048})
    assert grow.status_code == 409 and "vm" in grow.text, grow.text
    # Nor are its files read on the host (E2B's volume content API) while the VM has it mounted.
    content = httpx.Client(
        base_url=f"{agent.url}/internal/v1/volumes/{vid}/content/",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    held_by_vm = content.get("dir", params={"path": "/"})
    assert held_by_vm.status_code == 409 and "vm" in held_by_vm.text, held_by_vm.text
    assert under(agent.state_dir / "volumes")[0] == []
    account.destroy(first)
    # Once no VM holds it, they are: mounted on the host for the call, and for a while after it (the
    # calls of a burst share one mount), until a VM takes the volume as its drive (below).
    assert content.get("file", params={"path": "/one.txt"}).content == b"one\n"
    assert under(agent.state_dir / "volumes")[0] == [str(agent.state_dir / "volumes" / vid / "mnt")]
    content.close()

    readers = [
        account.sandbox(**VM, volumes=[{"volume_id": "vmvol", "mount_path": "/mnt/ro", "read_only": True}])
        for _ in range(2)
    ]
    # The VMs' boots took the volume off the host first: two kernels never mount one XFS.
    assert under(agent.state_dir / "volumes")[0] == []
    for reader in readers:
        assert account.out(reader, "cat /mnt/ro/one.txt") == "one\n"
        assert "OK" in account.out(reader, "cd /mnt/ro && sha256sum -c blob.sum")
        denied = account.sh(reader, "echo x > /mnt/ro/new.txt")
        assert denied["exit_code"] != 0 and "Read-only file system" in denied["stderr"], denied
        # What the first wrote is on the volume, not on a VM's own disk: this VM's root has no /data/db.
        assert account.sh(reader, "test -e /data/db/one.txt")["exit_code"] != 0
    writer = account.create(**VM, volumes=[{"volume_id": vid, "mount_path": "/data"}])
    assert writer.status_code == 409 and readers[0] in writer.text, writer.text
    for reader in readers:
        account.destroy(reader)

    again = account.sandbox(**VM, volumes=[{"volume_id": vid, "mount_path": "/w"}])
    assert (
        account.out(again, "cat /w/one.txt; echo two > /w/two.txt; sync; ls /w")
        == "one\nblob\nblob.sum\none.txt\ntwo.txt\n"
    )
    account.destroy(again)
    held = account.http.get(f"/v1/volumes/{vid}").json()["data"]["attachments"]
    assert held == []
    grown = account.http.patch(f"/v1/volumes/{vid}", json={"size_mib": 2048})  # held by none: it grows
    assert grown.status_code == 200 and grown.json()["data"]["size_mib"] == 2048, grown.text
    assert settled(agent.state_dir / "volumes") == ([], [])
