"""The suite's check that a destroyed sandbox's image is let go (``tests.loopdevices.ImageFile``) follows
the file, not its path: the pool may rebuild a slot on its recycled network under the same id, and so
make a new image, on a loop device of its own, at the path a destroyed sandbox's image had."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.loopdevices import ImageFile

pytestmark = pytest.mark.root


@pytest.fixture
def attached() -> Iterator[list[str]]:
    """Loop devices the test attaches, detached at its end."""
    devices: list[str] = []
    yield devices
    for device in devices:
        subprocess.run(["losetup", "--detach", device], check=False, capture_output=True)


def _attach(image: Path, devices: list[str]) -> str:
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    devices.append(device)
    return device


def test_a_new_image_at_a_removed_ones_path_is_not_taken_for_it(tmp_path: Path, attached: list[str]) -> None:
    path = tmp_path / "slot-1.img"
    path.write_bytes(b"\0" * (1 << 20))
    old_device = _attach(path, attached)
    old = ImageFile.of(path)
    assert old.bound_to() == [old_device]

    # The destroy removes the image while its loop device still holds it; the pool makes another at
    # the same path and attaches it.
    path.unlink()
    path.write_bytes(b"\0" * (1 << 20))
    new_device = _attach(path, attached)
    new = ImageFile.of(path)
    assert new != old

    assert old.bound_to() == [old_device], "the removed image, still held, is found"
    assert not old.wait_unbound(timeout_s=0.3)
    subprocess.run(["losetup", "--detach", old_device], check=True)
    assert old.wait_unbound(timeout_s=5), old.bound_to()
    assert old.bound_to() == [], "the new image at its path is not the old one"
    assert new.bound_to() == [new_device]
