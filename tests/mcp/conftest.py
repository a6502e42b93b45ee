"""MCP fixtures: the real platform on loopback (control plane + host agent processes), with its ingress
proxy on plain HTTP so ``expose_port`` has a URL to hand out, and the code-interpreter image built."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.images import ImageStore
from tests.hostagent.conftest import free_port, guest_binary_dir, image_cache
from tests.live import LivePlatform, start_platform

__all__ = ["guest_binary_dir"]


@pytest.fixture(scope="session")
def code_interpreter_image() -> Path:
    return ImageStore(image_cache()).build("code-interpreter:1")  # cached after the first build (~75 s)


@pytest.fixture(scope="module")
def live(code_interpreter_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    ingress = {
        "PADDOCK_CP_INGRESS_PORT": str(free_port()),
        "PADDOCK_CP_INGRESS_SCHEME": "http",
        "PADDOCK_CP_INGRESS_DOMAIN": "sandbox.localhost",
    }
    platform = start_platform(guest_binary_dir, cp_env=ingress)
    try:
        yield platform
    finally:
        platform.stop()
