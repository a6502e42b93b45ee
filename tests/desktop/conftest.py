"""Fixtures of the desktop tests: the ``desktop:1`` image, a live platform with the ingress proxy on
(live-view links expire after ``CONNECT_TTL_S``), and one desktop sandbox per test module.

Each module runs on the container tier (``crun``) and on gVisor (``gvisor``, where runsc is installed):
``pytest tests/desktop -k gvisor`` runs one tier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import paddock
from paddock_hostagent.images import ImageStore
from tests.hostagent.conftest import guest_binary_dir, image_cache
from tests.integration.conftest import TIERS, tier_params
from tests.live import LivePlatform
from tests.network.ingress_support import start_ingress_platform

__all__ = ["guest_binary_dir"]

ROOTFS = "desktop:1"
SHAPE = "s-2vcpu-2gb"  # Chromium and an X server per screen
CONNECT_TTL_S = 15


@pytest.fixture(scope="session")
def desktop_image() -> Path:
    return ImageStore(image_cache()).build(ROOTFS)  # cached after the first build (~55 s)


@pytest.fixture(scope="module", params=[param for param in tier_params() if param.id in ("crun", "gvisor")])
def live(
    request: pytest.FixtureRequest, desktop_image: Path, guest_binary_dir: Path
) -> Iterator[LivePlatform]:
    platform, ingress_port = start_ingress_platform(
        guest_binary_dir,
        cp_env={"PADDOCK_CP_DESKTOP_CONNECT_TTL_S": str(CONNECT_TTL_S)},
        agent_options={"runtime": TIERS[request.param]},
    )
    platform.ingress_port = ingress_port  # type: ignore[attr-defined]
    platform.tier = request.param  # type: ignore[attr-defined]
    try:
        yield platform
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def api_key(live: LivePlatform) -> str:
    return live.api_key()


@pytest.fixture(scope="module")
def client(live: LivePlatform, api_key: str) -> Iterator[paddock.Client]:
    with paddock.Client(live.url, api_key) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def desktop(client: paddock.Client) -> Iterator[paddock.Sandbox]:
    with client.sandboxes.create(SHAPE, rootfs=ROOTFS, disk_mib=4096) as sandbox:
        yield sandbox
