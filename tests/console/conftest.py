"""Fixtures of the console's browser tests: one live platform (control plane with the console, one host
agent), a user's API key, and a headless Debian Chromium driven over CDP (tests/desktop/browser.py)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.desktop.browser import Page, headless_chromium
from tests.hostagent.conftest import (
    AgentProcess,
    debian_image,
    guest_binary_dir,
    pytest_collection_modifyitems,
)
from tests.live import ControlPlaneProcess, LivePlatform

__all__ = ["debian_image", "guest_binary_dir", "pytest_collection_modifyitems"]

SCREENSHOTS = Path("/tmp/pdk-console-screenshots")


@contextlib.contextmanager
def console_platform(guest_dir: Path, cp_env: dict[str, str] | None = None) -> Iterator[LivePlatform]:
    """A control plane (it serves the console) and one host agent, as tests/live.py's ``start_platform``."""
    tag = secrets.token_hex(3)
    controlplane = ControlPlaneProcess(state_dir=Path(f"/tmp/pdkcp-{tag}"), extra_env=dict(cp_env or {}))
    platform = LivePlatform(controlplane=controlplane, agents=[])
    try:
        controlplane.start()
        platform.add_agent(AgentProcess(state_dir=Path(f"/tmp/pdkt-{tag}0"), guest_dir=guest_dir))
        platform.wait_for_hosts()
        yield platform
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def live(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    # Webhooks may target loopback here: the account-pages test lists an endpoint at 127.0.0.1.
    with console_platform(guest_binary_dir, {"PADDOCK_CP_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true"}) as platform:
        yield platform


@pytest.fixture(scope="module")
def api_key(live: LivePlatform) -> str:
    return live.api_key()


@pytest.fixture
def page() -> Iterator[Page]:
    with headless_chromium(1280, 900) as browser_page:
        yield browser_page


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
