"""mounts.is_mountpoint: the kernel's answer (statx) for every kind of path the agent asks about, the
same as /proc/self/mountinfo's, without reading mountinfo (whose scan grows with every mount on the
host, and which a fork paid for its disk's mount)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.storage import mounts

pytestmark = pytest.mark.root
MS_BIND = 0x1000


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A tmpfs, a directory inside it, a directory bound onto itself inside it, a symlink to the
    tmpfs's root, a missing path and a path under a plain file."""
    root = tmp_path / "tmpfs"
    root.mkdir()
    mounts.mount("tmpfs", root, "tmpfs", "size=1m")
    try:
        (root / "inner").mkdir()
        bound = root / "bound"
        bound.mkdir()
        mounts.mount(str(bound), bound, "none", flags=MS_BIND)
        try:
            (tmp_path / "link").symlink_to(root)
            (tmp_path / "file").write_text("")
            yield {
                "tmpfs": root,
                "inner": root / "inner",
                "bound": bound,
                "link": tmp_path / "link",
                "missing": tmp_path / "missing",
                "under_a_file": tmp_path / "file" / "x",
                "parent": tmp_path,
            }
        finally:
            mounts.unmount(bound)
    finally:
        mounts.unmount(root)


EXPECTED = {
    "tmpfs": True,
    "inner": False,
    "bound": True,
    "link": False,  # the path itself, as mountinfo lists it: a link is not a mount point
    "missing": False,
    "under_a_file": False,
    "parent": False,
}


def test_is_mountpoint_answers_as_mountinfo_does_without_reading_it(
    mounted: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert {name: mounts.in_mountinfo(path) for name, path in mounted.items()} == EXPECTED

    def no_scan(path: Path) -> bool:
        raise AssertionError(f"is_mountpoint({path}) scanned /proc/self/mountinfo")

    monkeypatch.setattr(mounts, "in_mountinfo", no_scan)
    assert {name: mounts.is_mountpoint(path) for name, path in mounted.items()} == EXPECTED


def test_is_mountpoint_without_statx_scans_mountinfo(
    mounted: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mounts, "_statx", None)
    assert {name: mounts.is_mountpoint(path) for name, path in mounted.items()} == EXPECTED


def test_an_unmounted_path_is_no_mountpoint_any_more(tmp_path: Path) -> None:
    mounts.mount("tmpfs", tmp_path, "tmpfs", "size=1m")
    try:
        assert mounts.is_mountpoint(tmp_path)
    finally:
        mounts.unmount(tmp_path)
    assert not mounts.is_mountpoint(tmp_path)
