"""What the console's browser tests do as a person would: sign in, type, click, wait, and save a
screenshot that must show something."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.desktop.browser import Page, png_size, thumbnail
from tests.live import LivePlatform


def wait_for(page: Page, expression: str, timeout_s: float, what: str) -> Any:
    """The expression's value once truthy; fails naming ``what`` and the page's text if it never is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = page.evaluate(
            f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()"
        )
        if value:
            return value
        time.sleep(0.2)
    text = page.evaluate("document.body ? document.body.innerText : ''")
    raise AssertionError(f"{what} not seen in {timeout_s} s; the page shows:\n{text}")


def type_text(page: Page, selector: str, text: str) -> None:
    assert page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); return true; }})()"
    )
    page.call("Input.insertText", text=text)


def press_enter(page: Page) -> None:
    for kind in ("keyDown", "keyUp"):
        page.call(
            "Input.dispatchKeyEvent",
            type=kind,
            key="Enter",
            code="Enter",
            windowsVirtualKeyCode=13,
            nativeVirtualKeyCode=13,
            **({"text": "\r"} if kind == "keyDown" else {}),
        )


def click(page: Page, selector: str) -> None:
    assert page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return false; e.click(); return true; }})()"
    ), selector


def sign_in(page: Page, live: LivePlatform, api_key: str) -> None:
    page.navigate(live.url + "/")  # the root redirects to /console
    wait_for(page, "document.getElementById('api-key')", 30, "the sign-in form")
    assert page.evaluate("location.pathname") == "/console"
    type_text(page, "#api-key", api_key)
    click(page, "#signin button[type=submit]")
    wait_for(page, "document.getElementById('sandboxes')", 30, "the sandbox list after signing in")
    # The key is in this tab's sessionStorage, not in localStorage, a cookie or the URL.
    assert page.evaluate("sessionStorage.getItem('paddock.apiKey')") == api_key
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("document.cookie") == ""
    assert api_key not in page.evaluate("location.href")


def save_screenshot(page: Page, directory: Path, name: str) -> bytes:
    """The page as a PNG, saved under ``directory``; it must show more than a blank or one-colour page."""
    png = page.screenshot()
    (directory / f"{name}.png").write_bytes(png)
    assert png_size(png) == (1280, 900)
    cells = thumbnail(png, columns=32, lines=24)
    assert len(set(cells)) >= 20, f"{name}: the screenshot is nearly uniform ({len(set(cells))} colours)"
    return png


def open_sandbox(page: Page, live: LivePlatform, api_key: str, sandbox_id: str) -> None:
    sign_in(page, live, api_key)
    page.evaluate(f"location.hash = '#/sandboxes/{sandbox_id}'")
    wait_for(page, "document.querySelector('#sandbox-state [data-state=running]')", 60, "the running state")
