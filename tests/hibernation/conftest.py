"""Hibernation fixtures: one control plane and one host agent for the package's live tests, on the first
container-tier runtime this machine has (crun, else runc), torn down afterwards (the platform's
teardown destroys what the agent still holds, hibernated sandboxes too, and checks nothing is left)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hibernation.test_hibernation_live import Account
from tests.hostagent.conftest import debian_image, guest_binary_dir, pytest_collection_modifyitems
from tests.live import LivePlatform
from tests.volumes.conftest import platform_on

__all__ = ["debian_image", "guest_binary_dir", "pytest_collection_modifyitems"]


def container_runtime() -> str | None:
    return next((name for name in ("crun", "runc") if shutil.which(name)), None)


@pytest.fixture(scope="package")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    runtime = container_runtime()
    if runtime is None:
        pytest.skip("neither crun nor runc on this machine")
    with platform_on(runtime, guest_binary_dir) as live:
        yield live


@pytest.fixture
def account(platform: LivePlatform) -> Iterator[Account]:
    """A user whose sandboxes go when the test ends (the live hibernation tests', on every tier)."""
    made = Account(platform)
    try:
        yield made
    finally:
        made.close()
