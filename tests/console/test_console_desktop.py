"""The console opens a desktop sandbox's live view: its "Open desktop view" button fetches the
short-lived noVNC link (docs/desktop.md), and that link, opened in the same headless Chromium, connects
and shows the sandbox's screen."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.conftest import console_platform
from tests.console.support import click, open_sandbox, save_screenshot, wait_for
from tests.desktop.browser import Page, thumbnail
from tests.desktop.conftest import ROOTFS, SHAPE, desktop_image
from tests.desktop.test_live_view import connected
from tests.live import LivePlatform
from tests.network.ingress_support import DOMAIN
from tests.ports import free_port

__all__ = ["desktop_image"]

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def live(desktop_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """The console's platform with the ingress proxy on plain HTTP, which serves the live view."""
    env = {
        "PADDOCK_CP_INGRESS_PORT": str(free_port()),
        "PADDOCK_CP_INGRESS_SCHEME": "http",
        "PADDOCK_CP_INGRESS_DOMAIN": DOMAIN,
    }
    with console_platform(guest_binary_dir, env) as platform:
        yield platform


@pytest.fixture(scope="module")
def desktop(live: LivePlatform, api_key: str) -> Iterator[dict[str, Any]]:
    with live.http(api_key) as http:
        made = http.post("/v1/sandboxes", json={"shape": SHAPE, "rootfs": ROOTFS, "disk_mib": 4096})
        assert made.status_code == 200, made.text
        sandbox = made.json()["data"]
        try:
            # A white editor window on the black desktop: something for the view to show.
            base = f"/v1/sandboxes/{sandbox['id']}/computer"
            launched = http.post(base + "/launch", json={"application": "mousepad"})
            assert launched.status_code == 200, launched.text
            deadline = time.monotonic() + 60
            while not any("Mousepad" in w.get("title", "") for w in windows(http, base)):
                assert time.monotonic() < deadline, f"no Mousepad window: {windows(http, base)}"
                time.sleep(0.5)
            yield sandbox
        finally:
            http.delete(f"/v1/sandboxes/{sandbox['id']}")


def windows(http: httpx.Client, base: str) -> list[dict[str, Any]]:
    answer = http.get(base + "/windows")
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    return list(data["windows"] if isinstance(data, dict) else data)


def test_open_a_desktop_sandboxs_view_from_the_console(
    live: LivePlatform, api_key: str, desktop: dict[str, Any], page: Page, screenshots: Path
) -> None:
    open_sandbox(page, live, api_key, desktop["id"])
    wait_for(page, "document.getElementById('open-desktop')", 30, "the desktop button")
    click(page, "#open-desktop")
    url = wait_for(
        page,
        "(() => { const a = document.getElementById('desktop-link'); return a ? a.href : ''; })()",
        60,
        "the live-view link",
    )
    assert f"-{desktop['id']}.{DOMAIN}:" in url, url
    assert api_key not in url  # the link carries its own short-lived token, never the key
    # The console's link is good for the platform's default 300 s: a second load may use it again.
    assert connected(page, lambda: url), (page.evaluate("document.body.innerText"), page.pending_requests())
    time.sleep(1.0)  # the first full frame
    png = save_screenshot(page, screenshots, "desktop-view")
    # The remote screen is drawn: the editor's white window on the black desktop.
    cells = thumbnail(png, columns=32, lines=24)
    white = sum(1 for cell in cells if min(cell) > 220)
    black = sum(1 for cell in cells if max(cell) < 30)
    assert white >= 50 and black >= 100, (white, black)
