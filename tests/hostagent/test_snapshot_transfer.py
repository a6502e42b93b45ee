"""The stream a snapshot travels in between hosts (``image_transfer.stream_snapshot`` and what the
receiving host writes of it): holes stay holes, the bytes arrive whole, and a peer's stream that lies
about the snapshot or reaches outside its image is refused. The hosts themselves are in
tests/multihost/test_snapshots_across_hosts.py."""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path

import pytest

from paddock_hostagent import errors, image_transfer
from paddock_hostagent.drivers.base import SnapshotInfo

MIB = 1 << 20


def _snapshot(tmp_path: Path, disk_mib: int = 8) -> SnapshotInfo:
    directory = tmp_path / "snap_01ABC"
    directory.mkdir()
    path = directory / "disk.img"
    with open(path, "wb") as disk:
        disk.truncate(disk_mib * MIB)
        disk.seek(MIB)
        disk.write(os.urandom(300_000))
        disk.seek(5 * MIB)
        disk.write(b"tail" * 1000)
    return SnapshotInfo("snap_01ABC", path, "debian:13", "xfs", disk_mib, "sb-1", 0.0, 0)


def _streamed(info: SnapshotInfo | None, name: str) -> bytes:
    async def collect() -> bytes:
        return b"".join([chunk async for chunk in await image_transfer.stream_snapshot(info, name)])

    return asyncio.run(collect())


def _receive(stream: bytes, target: Path, name: str = "snap_01ABC") -> dict[str, object]:
    reader = io.BufferedReader(io.BytesIO(stream))
    meta = image_transfer._snapshot_meta(reader.readline(4097), name, "http://peer")
    image_transfer._write_extents(reader, target, int(str(meta["size"])))
    return meta


def test_a_snapshot_arrives_whole_and_as_sparse_as_it_left(tmp_path: Path) -> None:
    info = _snapshot(tmp_path)
    stream = _streamed(info, "snap_01ABC")
    assert len(stream) < 2 * MIB  # the data, not the 8 MiB image
    copy = tmp_path / "copy.img"
    meta = _receive(stream, copy)
    assert meta["image"] == "debian:13" and meta["fs"] == "xfs" and meta["disk_mib"] == 8
    assert copy.read_bytes() == info.path.read_bytes()
    assert os.stat(copy).st_blocks * 512 < 2 * MIB


def test_a_snapshot_not_here_is_a_404_before_any_byte(tmp_path: Path) -> None:
    with pytest.raises(errors.SnapshotNotFound):
        _streamed(None, "snap_01ABC")
    info = _snapshot(tmp_path)
    with pytest.raises(errors.SnapshotNotFound):
        _streamed(info, "snap_../../etc")


def test_a_peer_that_lies_about_the_snapshot_or_writes_outside_its_image_is_refused(tmp_path: Path) -> None:
    stream = _streamed(_snapshot(tmp_path), "snap_01ABC")
    head, body = stream.split(b"\n", 1)
    with pytest.raises(errors.BadRequest, match="not of snapshot"):
        _receive(stream, tmp_path / "a.img", name="snap_01OTHER")
    for lie in ({"fs": "btrfs"}, {"image": "../x"}, {"size": 1 << 50}, {"disk_mib": -1}):
        meta = {**json.loads(head), **lie}
        with pytest.raises(errors.BadRequest):
            _receive(json.dumps(meta).encode() + b"\n" + body, tmp_path / "b.img")
    outside = image_transfer._EXTENT.pack(8 * MIB - 10, 100) + b"x" * 100
    with pytest.raises(image_transfer.UnpackError, match="outside"):
        _receive(head + b"\n" + outside, tmp_path / "c.img")
    with pytest.raises(image_transfer.UnpackError, match="ended"):
        _receive(stream[:-16], tmp_path / "d.img")  # no end header: cut short
