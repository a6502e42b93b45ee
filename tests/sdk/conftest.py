"""SDK fixtures: the real platform on loopback (control plane + host agent processes, runc sandboxes),
and the in-process control plane with a fake host for the unit seam tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from tests.controlplane.conftest import controlplane, cp_settings
from tests.controlplane.sandboxes.test_sandboxes_rules import fake_host
from tests.gateway.conftest import chain_gateway, devchains, paying_wallet
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.integration.conftest import TIERS, tier_params
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


@pytest.fixture(scope="package")
def live(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    platform = start_platform(guest_binary_dir, cp_env=LIVE_CP_ENV)
    try:
        yield platform
    finally:
        platform.stop()


# The tiers the run-as-a-user tests (test_live_users*.py) run on: one platform per tier for the session,
# shared by the sync and async twins (each module had started its own three, two of them VMs).
#: The VM tier's guest is the same binary (in its initramfs), so it runs as a user the same way.
VM_TIER = pytest.param(
    "qemu",
    id="vm",
    marks=[
        pytest.mark.qemu,
        pytest.mark.skipif(
            not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"
        ),
    ],
)


@pytest.fixture(
    scope="package", params=[param for param in tier_params() if param.id in ("crun", "gvisor")] + [VM_TIER]
)
def tier_live(
    request: pytest.FixtureRequest, debian_image: Path, guest_binary_dir: Path
) -> Iterator[LivePlatform]:
    runtime = TIERS.get(request.param, request.param)
    platform = start_platform(guest_binary_dir, agent_options={"runtime": runtime})
    try:
        yield platform
    finally:
        platform.stop()
