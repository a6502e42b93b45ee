"""SDK fixtures: the real platform on loopback (control plane + host agent processes, runc sandboxes),
and the in-process control plane with a fake host for the unit seam tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controlplane.conftest import controlplane, cp_settings
from tests.controlplane.test_sandboxes_rules import fake_host
from tests.gateway.conftest import chain_gateway, devchains, paying_wallet
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform, start_platform

__all__ = [
    "chain_gateway",
    "controlplane",
    "cp_settings",
    "debian_image",
    "devchains",
    "fake_host",
    "guest_binary_dir",
    "paying_wallet",
]

#: Webhook deliveries go to a receiver on 127.0.0.1, as a self-hoster on one machine would allow.
LIVE_CP_ENV = {
    "PADDOCK_CP_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
    "PADDOCK_CP_WEBHOOK_POLL_INTERVAL_S": "0.2",
}


@pytest.fixture(scope="session")
def live(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    platform = start_platform(guest_binary_dir, cp_env=LIVE_CP_ENV)
    try:
        yield platform
    finally:
        platform.stop()
