"""Fixtures of the terminal tests: those of the host agent suite (guest binary, image, agent, sandbox),
and a live platform (control plane + host agent processes) per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostagent.conftest import (
    agent,
    debian_image,
    guest_binary_dir,
    host,
    make_agent,
    sandbox,
    sandboxes,
)
from tests.live import LivePlatform, start_platform

__all__ = ["agent", "debian_image", "guest_binary_dir", "host", "make_agent", "sandbox", "sandboxes"]


@pytest.fixture(scope="module")
def live(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    platform = start_platform(guest_binary_dir)
    try:
        yield platform
    finally:
        platform.stop()
