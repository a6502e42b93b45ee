"""MCP fixtures: the real platform on loopback (control plane + host agent processes), with its ingress
proxy on plain HTTP so ``expose_port`` has a URL to hand out, and the code-interpreter image built."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.images import ImageStore
from tests.hostagent.conftest import guest_binary_dir, image_cache
from tests.live import LivePlatform, plain_http_ingress, start_platform

__all__ = ["guest_binary_dir"]


@pytest.fixture(scope="session")
def code_interpreter_image() -> Path:
    return ImageStore(image_cache()).build("code-interpreter:1")  # cached after the first build (~75 s)


@pytest.fixture(scope="module")
def live(code_interpreter_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    platform = start_platform(guest_binary_dir, cp_env=plain_http_ingress())
    try:
        yield platform
    finally:
        platform.stop()
