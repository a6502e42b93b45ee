"""Template fixtures: the in-process control plane with a fake host (rules), and the real platform
with buildah on its host agent (builds)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controlplane.conftest import controlplane, cp_settings
from tests.controlplane.sandboxes.test_sandboxes_rules import fake_host
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform, start_platform

__all__ = ["controlplane", "cp_settings", "debian_image", "fake_host", "guest_binary_dir"]


@pytest.fixture(scope="module")
def live(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """The real platform (control plane + a host agent with buildah), per module: builds leave buildah
    storage in the agent's state dir, removed with it."""
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: scripts/setup-host.sh installs it")
    platform = start_platform(guest_binary_dir)
    try:
        yield platform
    finally:
        platform.stop()
