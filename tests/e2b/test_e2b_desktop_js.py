"""The unmodified ``@e2b/desktop`` SDK (npm, pinned by tests/e2b/js/package-lock.json; ``make setup-test``
runs ``npm ci`` there) under Node on Paddock's ``desktop:1``, configured only by E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY (tests/e2b/js/desktop.mjs): ``Sandbox.create()`` starts Xvfb and XFCE,
a screenshot is a PNG of the screen's size showing the desktop, the pointer goes where it is told, a
click into a Mousepad window and typing change the window's title and the screen, and ``kill`` ends the
sandbox. Then the stream: the desktop is made with E2B's public traffic, so ``stream.start({ requireAuth })``
on 6080 (where @e2b/desktop 2.4.0 always runs it) serves noVNC's page through the ingress at the SDK's
URL (docs/e2b.md). The script saves its screenshots; this test looks at
their pixels."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageChops

from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import E2bPlatform
from tests.hostagent.conftest import image_cache

pytestmark = [pytest.mark.root, pytest.mark.slow]

JS = Path(__file__).with_name("js")
SIZE = (1024, 768)  # @e2b/desktop's default resolution


def run_script(script: str, e2b_platform: E2bPlatform, out: Path) -> dict[str, object]:
    node = shutil.which("node")
    assert node is not None, "node is needed (scripts/setup-host.sh installs it)"
    assert (JS / "node_modules" / "@e2b" / "desktop").is_dir(), "run make setup-test (npm ci in tests/e2b/js)"
    ImageStore(image_cache()).build("desktop:1")  # rebuilt when its recipe changed
    env = (
        {key: value for key, value in os.environ.items() if not key.startswith("E2B_")}
        | e2b_platform.env
        | {"PADDOCK_E2B_JS_OUT": str(out), "PADDOCK_URL": e2b_platform.platform.url}
    )
    done = subprocess.run(
        [node, script], cwd=JS, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def test_the_js_desktop_sdk_drives_the_desktop(e2b_platform: E2bPlatform, tmp_path: Path) -> None:
    seen = run_script("desktop.mjs", e2b_platform, tmp_path)
    print(f"@e2b/desktop: create -> desktop ready in {seen['createSeconds']} s")
    assert seen["ok"] is True
    assert seen["templateId"] == "desktop"
    assert seen["screenSize"] == {"width": SIZE[0], "height": SIZE[1]}
    assert seen["cursor"] == {"x": 700, "y": 500}
    assert seen["killed"] is True
    # the stream: noVNC's page loaded through the ingress at the SDK's URL, on 6080
    assert seen["stream"] == "ok"
    assert str(seen["streamUrl"]).startswith(f"https://6080-{seen['sandboxId']}.sandbox.localhost:")

    shot = Image.open(tmp_path / "desktop.png").convert("RGB")
    assert shot.size == SIZE
    colours = shot.getcolors(maxcolors=SIZE[0] * SIZE[1]) or []
    assert len(colours) > 64 and max(colours)[1] != (0, 0, 0), f"{len(colours)} colours"  # XFCE's backdrop

    # Mousepad marks its title once the document is changed: the keys reached the clicked window.
    title = str(seen["title"])
    assert title.startswith("*"), title
    window = seen["window"]
    assert isinstance(window, dict)
    before = Image.open(tmp_path / "before.png").convert("RGB")
    after = Image.open(tmp_path / "after.png").convert("RGB")
    changed = ImageChops.difference(before, after).getbbox()
    assert changed is not None  # the typed text is on the screen
    left, top, right, bottom = changed
    assert left < window["x"] + window["width"] and top < window["y"] + window["height"], changed
    assert right > window["x"] and bottom > window["y"], changed
