"""The platform as users meet it: control plane + real host agents + crun/runc/gVisor, driven over HTTP.

``platform`` runs each test under every tier this machine has; the tier is the test id (``crun``,
``runc``, ``gvisor``), so ``pytest -k gvisor`` runs one tier. The VM tier adds ``qemu`` to ``TIERS``.
Where a tier behaves differently, the test asserts that tier's behaviour (``platform_tier``) and
its module says why.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostagent.conftest import (
    TOKEN,
    debian_image,
    guest_binary_dir,
    pytest_collection_modifyitems,
)
from tests.live import LivePlatform, start_platform

__all__ = ["debian_image", "guest_binary_dir", "pytest_collection_modifyitems"]


#: Test id -> the host agent's ``runtime`` setting. The id is what ``-k`` selects.
TIERS = {"crun": "crun", "runc": "runc", "gvisor": "runsc"}


def tier_params() -> list[Any]:
    """Every tier, each marked skip with the reason when this machine lacks its runtime."""
    return [
        pytest.param(
            tier,
            id=tier,
            marks=pytest.mark.skipif(shutil.which(runtime) is None, reason=f"{runtime} is not installed"),
        )
        for tier, runtime in TIERS.items()
    ]


@pytest.fixture(scope="package", params=tier_params())
def platform(
    request: pytest.FixtureRequest, debian_image: Path, guest_binary_dir: Path
) -> Iterator[LivePlatform]:
    """One control plane and one host agent shared by the tests that do not restart either; every test
    that uses it runs once under each tier (crun is the default where it works)."""
    runtime = TIERS[request.param]
    live = start_platform(guest_binary_dir, agent_options={"runtime": runtime})
    live.tier = request.param  # type: ignore[attr-defined]
    try:
        info = httpx.get(
            live.agents[0].url + "/internal/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        assert info["runtime"] == runtime, info
        yield live
    finally:
        live.stop()


def platform_tier(platform: LivePlatform) -> str:
    """``crun``, ``runc`` or ``gvisor``: where a tier differs, a test asserts what that tier does."""
    return str(getattr(platform, "tier", "crun"))
