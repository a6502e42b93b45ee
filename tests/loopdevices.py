"""Waiting for a loop device to let go of its backing file, for tests that check an image once its
filesystem is unmounted and its loop device detached.

The host's mounts are private here (no ``shared:`` propagation on ``/``), so a mount namespace made while
a test's filesystem was mounted (another test's container, before its ``pivot_root`` drops the host's
mounts) holds its own copy of it: the host's unmount then succeeds while the filesystem stays live, and
the loop device is only marked to go once that copy does (autoclear). Until then the image may still
have a dirty log, which ``xfs_repair -n`` reports as damage."""

from __future__ import annotations

import time
from pathlib import Path


def backing_files() -> set[str]:
    """Every loop device's backing file."""
    found = set()
    for path in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            found.add(path.read_text().strip().removesuffix(" (deleted)"))
        except OSError:
            continue
    return found


def wait_released(image: Path, timeout_s: float = 60.0) -> bool:
    """Whether no loop device holds ``image`` any more, waiting up to ``timeout_s`` for it."""
    deadline = time.monotonic() + timeout_s
    while str(image) in backing_files():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
