"""What s3fs's mount namespace lets go of at its start (``nsmount._release_copies``), on mounts this
test makes: a loop-backed filesystem under a private parent is detached in the copy and stays mounted on
the host; one whose parent is shared stays in both (its detach would have reached the host's).

The copy is made by a child process (``unshare`` needs a single-threaded caller, and the test's own
namespace must stay the host's)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root]

CHILD = """
import sys
from paddock_hostagent.drivers.storage import nsmount
assert nsmount._libc.unshare(nsmount._CLONE_NEWNS) == 0
nsmount._release_copies(sys.argv[1])
print(open("/proc/self/mountinfo").read())
"""


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _points() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    """``private/`` holds a loop-backed ext4; ``shared/`` is a shared bind of itself with another on it;
    ``keep/`` is a loop-backed ext4 the copy must keep (the FUSE point's stand-in)."""
    made: list[Path] = []
    try:
        for name in ("private", "keep"):
            image, point = tmp_path / f"{name}.img", tmp_path / name
            point.mkdir()
            _run(["truncate", "-s", "16M", str(image)])
            _run(["mkfs.ext4", "-q", str(image)])
            _run(["mount", "-o", "loop", str(image), str(point)])
            made.append(point)
        shared = tmp_path / "shared"
        shared.mkdir()
        _run(["mount", "--bind", str(shared), str(shared)])
        made.append(shared)
        _run(["mount", "--make-shared", str(shared)])
        _run(["truncate", "-s", "16M", str(tmp_path / "on-shared.img")])
        _run(["mkfs.ext4", "-q", str(tmp_path / "on-shared.img")])
        _run(["mount", "-o", "loop", str(tmp_path / "on-shared.img"), str(shared)])
        made.append(shared)
        yield tmp_path
    finally:
        for point in reversed(made):
            subprocess.run(["umount", str(point)], check=False, capture_output=True)


def test_the_copy_lets_go_of_a_private_loop_mount_and_keeps_what_would_reach_the_host(tree: Path) -> None:
    keep = tree / "keep" / "mnt"
    copy = subprocess.run(
        [sys.executable, "-c", CHILD, str(keep)], check=True, capture_output=True, text=True
    ).stdout
    in_copy = [line.split()[4] for line in copy.splitlines() if line.strip()]
    assert str(tree / "private") not in in_copy, copy
    assert str(tree / "keep") in in_copy, "the mount holding the FUSE point stays"
    assert in_copy.count(str(tree / "shared")) == 2, "a mount on a shared parent stays"
    on_host = _points()
    assert str(tree / "private") in on_host and str(tree / "keep") in on_host
    assert on_host.count(str(tree / "shared")) == 2, "the host's mount on the shared bind is still there"
