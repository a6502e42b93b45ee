"""Volume fixtures: a control plane and one host agent for the live tests, on each container-tier
runtime this machine has (crun, runc; the test id names it), torn down afterwards (the volumes a test
made are deleted through the API, and any left by a failing test through the agent's own API, before
the agent's teardown checks that nothing is left on the machine)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostagent.conftest import TOKEN, debian_image, guest_binary_dir, pytest_collection_modifyitems
from tests.live import LivePlatform, start_platform
from tests.volumes.test_volumes_live import Account

__all__ = ["debian_image", "guest_binary_dir", "pytest_collection_modifyitems"]


#: The container tier's runtimes, which keep volumes (gVisor and the VM tier refuse them).
CONTAINER_RUNTIMES = ("crun", "runc")


def runtime_params() -> list[Any]:
    return [
        pytest.param(name, id=name, marks=pytest.mark.skipif(shutil.which(name) is None, reason=f"no {name}"))
        for name in CONTAINER_RUNTIMES
    ]


def remove_volumes_on_hosts(platform: LivePlatform) -> None:
    """Whatever volumes a failed test left: removed by their agent (unmounted, loop freed)."""
    for agent in platform.agents:
        directory = agent.state_dir / "volumes"
        for volume in sorted(directory.glob("vol_*")) if directory.is_dir() else []:
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(
                    f"{agent.url}/internal/v1/volumes/{volume.name}",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=60,
                )


@contextlib.contextmanager
def platform_on(runtime: str, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    live = start_platform(guest_binary_dir, agent_options={"runtime": runtime})
    try:
        yield live
    finally:
        with contextlib.suppress(Exception):
            remove_volumes_on_hosts(live)
        live.stop()


@pytest.fixture(scope="module", params=runtime_params())
def platform(
    request: pytest.FixtureRequest, debian_image: Path, guest_binary_dir: Path
) -> Iterator[LivePlatform]:
    with platform_on(str(request.param), guest_binary_dir) as live:
        yield live


@pytest.fixture
def account(platform: LivePlatform) -> Iterator[Account]:
    """A user whose sandboxes and volumes go when the test ends (every live volume test's)."""
    made = Account(platform)
    try:
        yield made
    finally:
        made.close()
