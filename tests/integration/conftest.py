"""The platform as users meet it: control plane + real host agents + runc/crun, driven over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostagent.conftest import debian_image, guest_binary_dir, pytest_collection_modifyitems
from tests.live import LivePlatform, start_platform

__all__ = ["debian_image", "guest_binary_dir", "pytest_collection_modifyitems"]


@pytest.fixture(scope="session")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """One control plane and one host agent shared by the tests that do not restart either."""
    live = start_platform(guest_binary_dir)
    try:
        yield live
    finally:
        live.stop()
