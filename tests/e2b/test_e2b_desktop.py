"""The unmodified ``e2b-desktop`` SDK (PyPI) on Paddock's ``desktop:1``, configured only by E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY: ``Sandbox.create()`` starts Xvfb and XFCE in the sandbox as it does on
E2B, then a screenshot, the pointer, a click into a window and typing. Fails on the image before it held
XFCE, scrot and xrandr (``create`` timed out waiting for ``xfce4-session``)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b_desktop import Sandbox
from PIL import Image, ImageChops

from e2b import CommandExitException
from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import E2bPlatform
from tests.hostagent.conftest import image_cache

pytestmark = [pytest.mark.root, pytest.mark.slow]

SIZE = (1024, 768)  # e2b-desktop's default resolution


@pytest.fixture(scope="module")
def desktop_image() -> Path:
    return ImageStore(image_cache()).build("desktop:1")  # rebuilt when its recipe changed


@pytest.fixture(scope="module")
def desktop(desktop_image: Path, e2b_env: E2bPlatform) -> Iterator[Sandbox]:
    started = time.monotonic()
    made = Sandbox.create(timeout=600)  # the SDK's default template: desktop; it waits for XFCE itself
    print(f"e2b-desktop: create -> desktop ready in {time.monotonic() - started:.1f} s")
    try:
        yield made
    finally:
        made.kill()


def png(data: bytes | bytearray) -> Image.Image:
    assert bytes(data[:8]) == b"\x89PNG\r\n\x1a\n"
    return Image.open(io.BytesIO(bytes(data))).convert("RGB")


def mousepad_window(desktop: Sandbox) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            windows = [w for w in desktop.get_application_windows("mousepad") if w]
        except CommandExitException:  # xdotool search exits 1 until the window is there
            windows = []
        if windows:
            return windows[-1]
        time.sleep(0.5)
    raise AssertionError("no Mousepad window appeared within 30 s")


def test_the_desktop_is_up_and_a_screenshot_shows_it(desktop: Sandbox) -> None:
    assert desktop.get_info().template_id == "desktop"
    assert desktop.commands.run("pgrep -x xfwm4 && pgrep -x xfdesktop").exit_code == 0
    assert desktop.get_screen_size() == SIZE
    # xfdesktop paints its backdrop (Xfce's logo on a gradient) soon after it starts; until then the
    # screen is black but for the pointer.
    deadline = time.monotonic() + 15
    while True:
        shot = png(desktop.screenshot())
        assert shot.size == SIZE
        colours = shot.getcolors(maxcolors=SIZE[0] * SIZE[1]) or []
        painted = len(colours) > 64 and max(colours)[1] != (0, 0, 0)
        if painted or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert painted, f"{len(colours)} colours, mostly {max(colours)[1]}"


def test_the_pointer_moves_where_it_is_told(desktop: Sandbox) -> None:
    desktop.move_mouse(300, 200)
    assert desktop.get_cursor_position() == (300, 200)
    desktop.move_mouse(700, 500)
    assert desktop.get_cursor_position() == (700, 500)


def test_a_click_into_a_window_and_typing_change_the_screen(desktop: Sandbox) -> None:
    desktop.commands.run("mousepad", background=True, timeout=0).disconnect()  # DISPLAY comes from create
    window = mousepad_window(desktop)
    geometry = desktop.commands.run(f"xdotool getwindowgeometry --shell {window}").stdout
    fields = dict(line.split("=", 1) for line in geometry.split() if "=" in line)
    x, y = int(fields["X"]) + int(fields["WIDTH"]) // 2, int(fields["Y"]) + int(fields["HEIGHT"]) // 2
    desktop.move_mouse(5, 5)  # the pointer out of the way, so that only the window's text differs below
    desktop.wait(500)
    before = png(desktop.screenshot())
    desktop.left_click(x, y)
    assert desktop.get_cursor_position() == (x, y)
    desktop.write("hi")
    desktop.press("Return")
    desktop.write("there")
    desktop.wait(500)
    # Mousepad marks its title once the document is changed: the keys reached the clicked window.
    assert desktop.get_window_title(window).startswith("*"), desktop.get_window_title(window)
    desktop.move_mouse(5, 5)
    desktop.wait(500)
    changed = ImageChops.difference(before, png(desktop.screenshot())).getbbox()
    assert changed is not None  # the typed text is on the screen
    left, top, right, bottom = changed
    assert left < x + int(fields["WIDTH"]) // 2 and top < y + int(fields["HEIGHT"]) // 2, changed
    assert right > int(fields["X"]) and bottom > int(fields["Y"]), changed
