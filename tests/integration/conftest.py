"""The platform as users meet it: control plane + real host agents + runc/crun, driven over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="session", params=["crun", "runc"])
def platform(
    request: pytest.FixtureRequest, debian_image: Path, guest_binary_dir: Path
) -> Iterator[LivePlatform]:
    """One control plane and one host agent shared by the tests that do not restart either; every test
    that uses it runs once under each OCI runtime (crun is the default where it works, runc the other)."""
    live = start_platform(guest_binary_dir, agent_options={"runtime": request.param})
    try:
        info = httpx.get(
            live.agents[0].url + "/internal/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        assert info["runtime"] == request.param, info
        yield live
    finally:
        live.stop()
