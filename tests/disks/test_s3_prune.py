"""An agent's start sweeps the S3 mount directories of sandboxes it no longer holds from ``<state>/disks``,
which is also the disk store's root: the store's snapshots (and the hibernated sandboxes' disks) are no
sandbox's mounts, and every agent start on a host with s3fs once removed them all (issue #34)."""

from __future__ import annotations

from pathlib import Path

from paddock_hostagent.drivers.storage import rootdisks
from paddock_hostagent.drivers.storage.s3mounts import S3Mounter


async def test_the_sweep_removes_gone_sandboxes_mounts_and_keeps_the_snapshots(tmp_path: Path) -> None:
    snapshot = tmp_path / rootdisks.SNAPSHOTS_DIRNAME / "snap_01keep"
    snapshot.mkdir(parents=True)
    (snapshot / "disk.img").write_bytes(b"\0" * 4096)
    (tmp_path / "sb-gone" / "disk_1").mkdir(parents=True)
    (tmp_path / "sb-held" / "disk_2").mkdir(parents=True)
    (tmp_path / "slot-3.img").write_bytes(b"\0")  # a slot's disk image, a file of the store
    await S3Mounter(tmp_path, resolv_conf="").prune({"sb-held"})
    assert sorted(path.name for path in tmp_path.iterdir()) == ["sb-held", "slot-3.img", "snapshots"]
    assert (snapshot / "disk.img").stat().st_size == 4096
