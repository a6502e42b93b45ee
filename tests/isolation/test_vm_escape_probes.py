"""The escape probes (test_escape_probes.py, the same scripts and the same report) on the VM tier.

The integration suite's tiers do not include ``qemu`` (under TCG a platform per tier for every
integration test costs too much), so this module runs the probe test against one ``runtime=qemu``
platform of its own; the outcomes land in the same per-tier report as ``qemu``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.isolation.test_escape_probes import report, scene, test_escape_probe_holds
from tests.live import LivePlatform, start_platform

__all__ = ["debian_image", "guest_binary_dir", "report", "scene", "test_escape_probe_holds"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    live = start_platform(guest_binary_dir, agent_options={"runtime": "qemu"})
    live.tier = "qemu"  # type: ignore[attr-defined]
    try:
        yield live
    finally:
        live.stop()
