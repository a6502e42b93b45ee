"""Computer use (§12.3) on a real ``desktop:1`` sandbox, through the SDK as an agent would drive it.

One desktop sandbox serves the module: the tests build on what a screen shows (an editor window, a page
in Chromium), and each asserts what a user of the screen would notice — the pixels, the window titles,
the page's own record of a click, the clipboard's content.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx
import pytest

import paddock
from paddock_controlplane.sandboxes.computer import HELPER_SOCKET
from paddock_core.rootfs import ROOT_IMAGES_BY_NAME
from tests.desktop.browser import decode_png, png_size
from tests.desktop.conftest import ROOTFS, SHAPE
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]
T = TypeVar("T")

PAGE_PORT = 8000
# A page whose one big button records each click twice: in the page (its title) and on the sandbox's own
# server (POST /click, appended to /tmp/clicks), so the test reads the page's state back both ways.
PAGE_SERVER = r"""
import http.server, pathlib
PAGE = b'''<!doctype html><html><head><title>ready</title></head>
<body style="margin:0"><button id="b" style="width:100vw;height:100vh;font-size:40px"
onclick="n=(window.n||0)+1;window.n=n;document.title='clicked '+n;fetch('/click',{method:'POST'})">
press me</button></body></html>'''
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header('Content-Type', 'text/html')
        self.send_header('Content-Length', str(len(PAGE))); self.end_headers(); self.wfile.write(PAGE)
    def do_POST(self):
        with open('/tmp/clicks', 'a') as f: f.write('click\n')
        self.send_response(204); self.end_headers()
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(('127.0.0.1', PORT), Handler).serve_forever()
"""


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def window_titled(
    sandbox: paddock.Sandbox, fragment: str, screen_id: str | None = None
) -> paddock.Window | None:
    return next((w for w in sandbox.computer.windows(screen_id=screen_id) if fragment in w.title), None)


@pytest.fixture(scope="module")
def editor(desktop: paddock.Sandbox) -> paddock.Window:
    """A Mousepad window on screen-0, focused."""
    desktop.computer.launch("mousepad")
    window = eventually(lambda: window_titled(desktop, "Mousepad"), "the Mousepad window")
    desktop.computer.focus_window(window.id)
    return window


def test_the_image_holds_everything_its_description_names(desktop: paddock.Sandbox) -> None:
    image = ROOT_IMAGES_BY_NAME[ROOTFS]
    missing = {}
    for content in image.contents:
        assert content.label in image.description
        probe = desktop.run("sh", ["-c", content.probe])
        if probe.exit_code != 0:
            missing[content.label] = (probe.stdout + probe.stderr)[-300:]
    assert not missing, missing


def test_a_screenshot_is_a_png_of_the_screen_size(desktop: paddock.Sandbox) -> None:
    width, height = desktop.computer.screen_size()
    assert (width, height) == (1280, 800)
    assert png_size(desktop.computer.screenshot()) == (width, height)
    assert png_size(desktop.computer.screenshot(region=(10, 20, 300, 200))) == (300, 200)


def test_a_resident_helper_serves_screenshots_of_what_the_screen_shows(desktop: paddock.Sandbox) -> None:
    # A still, patterned screen (no window is open yet in this module): the resident helper's screenshot
    # of a region, asked for through its own socket, must hold exactly the pixels scrot grabs there.
    desktop.computer.screen_size()  # the first call: the screen starts, and the helper stays resident
    patterned = desktop.run("sh", ["-c", "DISPLAY=:0 xsetroot -mod 7 5 -fg '#c03010' -bg '#1040a0'"])
    assert patterned.exit_code == 0, patterned.stderr
    served = desktop.run(
        "curl",
        ["-sS", "--unix-socket", HELPER_SOCKET, "--data-binary", "@-", "http://helper/screenshot"],
        stdin='{"x": 0, "y": 0, "width": 320, "height": 200}',
    )
    assert served.exit_code == 0, (served.stderr, helper_state(desktop))
    from_helper = base64.b64decode(json.loads(served.stdout)["data"]["png"])
    grabbed = desktop.run(
        "sh", ["-c", "DISPLAY=:0 scrot -o -a 0,0,320,200 /tmp/grab.png && base64 -w0 /tmp/grab.png"]
    )
    assert grabbed.exit_code == 0, grabbed.stderr
    expected = decode_png(base64.b64decode(grabbed.stdout))
    assert decode_png(from_helper) == expected
    assert decode_png(desktop.computer.screenshot(region=(0, 0, 320, 200))) == expected
    # A helper that is gone (killed, or lost to a fork or a restart) is started again by the next call.
    assert resident_helpers(desktop), "no resident helper after the first call"
    killed = desktop.run("sh", ["-c", f"kill -KILL {' '.join(resident_helpers(desktop))}"])
    assert killed.exit_code == 0, killed.stderr
    eventually(lambda: not resident_helpers(desktop), "the killed helper to be gone")
    assert decode_png(desktop.computer.screenshot(region=(0, 0, 320, 200))) == expected
    # The call answers before its helper forks off to stay resident, so that may take a moment.
    eventually(lambda: resident_helpers(desktop), "the helper to be started again", timeout_s=15)


# What a failure to reach the resident helper needs explained: the state directory (through Python:
# coreutils' statx fails on gVisor 2022), the lock's pid, the helper processes, and its faults log.
HELPER_STATE = r"""
import os, subprocess
d = "/run/paddock-desktop"
print(sorted(os.listdir(d)) if os.path.isdir(d) else "no state dir")
for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    if name.endswith(".lock"):
        print(name, open(os.path.join(d, name)).read().strip())
print(subprocess.run(["ps", "-eo", "pid,ppid,etimes,args"], capture_output=True, text=True).stdout[-3000:])
faults = os.path.join(d, "helper-faults.log")
print(open(faults).read()[-3000:] if os.path.exists(faults) else "no faults logged")
"""


def helper_state(sandbox: paddock.Sandbox) -> str:
    probe = sandbox.run("python3", ["-c", HELPER_STATE])
    return probe.stdout + probe.stderr


def resident_helpers(sandbox: paddock.Sandbox) -> list[str]:
    """The live pid the resident helper wrote into its lock file (it holds the lock for its whole life)."""
    lock = HELPER_SOCKET.removesuffix(".sock") + ".lock"
    script = f"p=$(cat '{lock}' 2>/dev/null) && [ -n \"$p\" ] && kill -0 $p 2>/dev/null && echo $p"
    return sandbox.run("sh", ["-c", script]).stdout.split()


def test_typing_into_an_editor_changes_the_screen_and_its_title(
    desktop: paddock.Sandbox, editor: paddock.Window
) -> None:
    geometry = desktop.computer.window_geometry(editor.id)
    assert geometry.width > 100 and geometry.height > 100 and geometry.screen == "screen-0"
    window_shot = desktop.computer.screenshot(window_id=editor.id)
    assert png_size(window_shot) == (geometry.width, geometry.height)
    before = desktop.computer.screenshot()
    desktop.computer.click(geometry.x + geometry.width // 2, geometry.y + geometry.height // 2)
    desktop.computer.type("Hello from the agent")
    after = eventually(
        lambda: shot if (shot := desktop.computer.screenshot()) != before else None, "the text on screen"
    )
    assert decode_png(after)[2] != decode_png(before)[2]
    # Mousepad marks a modified document in its title: the windows list shows it.
    modified = eventually(lambda: window_titled(desktop, "*"), "the modified title")
    assert modified.id == editor.id and "Mousepad" in modified.title
    assert desktop.computer.current_window().id == editor.id


def test_the_clipboard_round_trips_and_reaches_applications(
    desktop: paddock.Sandbox, editor: paddock.Window
) -> None:
    desktop.computer.set_clipboard("naïve ✓ clipboard")
    assert desktop.computer.get_clipboard() == "naïve ✓ clipboard"
    # What the editor holds, copied with the keyboard, is what the clipboard then reads.
    desktop.computer.focus_window(editor.id)
    desktop.computer.press("ctrl", "a")
    desktop.computer.press("ctrl", "c")
    assert eventually(lambda: desktop.computer.get_clipboard() == "Hello from the agent", "the copied text")


def test_windows_move_resize_minimize_restore_and_close(
    desktop: paddock.Sandbox, editor: paddock.Window
) -> None:
    # Geometry is the window's own area, without the window manager's frame (its border and title bar
    # lie outside it): a move puts that area's corner where asked, a resize sizes it, a window
    # screenshot holds it. (xdotool's reading counted the frame's offset twice: (62, 120) here.)
    desktop.computer.move_window(editor.id, 60, 80)
    desktop.computer.resize_window(editor.id, 500, 400)
    moved = desktop.computer.window_geometry(editor.id)
    assert (moved.x, moved.y, moved.width, moved.height) == (60, 80, 500, 400)
    assert png_size(desktop.computer.screenshot(window_id=editor.id)) == (500, 400)
    desktop.computer.move_window(editor.id, 0, 0)  # its frame now reaches past the screen's edge
    corner = desktop.computer.window_geometry(editor.id)
    assert (corner.x, corner.y) == (0, 0)
    desktop.computer.maximize_window(editor.id)
    # Maximised once the call returns (the window manager enlarges the window inside its old frame
    # before it moves the frame: read in between, it was at (-1, -1)), it fills the screen below its
    # title bar: within the screen, down to its bottom edge (xdotool's reading had it from y=38, 781
    # high, 19 pixels past an 800-pixel screen).
    big = desktop.computer.window_geometry(editor.id)
    width, height = desktop.computer.screen_size()
    assert (big.x, big.width) == (0, width) and 0 < big.y < 60 and big.y + big.height == height, big
    assert png_size(desktop.computer.screenshot(window_id=editor.id)) == (big.width, big.height)
    desktop.computer.minimize_window(editor.id)
    assert editor.id in [w.id for w in desktop.computer.windows()]  # still listed
    with pytest.raises(paddock.ConflictError):  # not on the screen: no pixels of its own to show
        desktop.computer.screenshot(window_id=editor.id)
    desktop.computer.restore_window(editor.id)
    assert eventually(lambda: desktop.computer.current_window().id == editor.id, "the restored window")
    assert desktop.computer.window(editor.id).title.endswith("Mousepad")
    # Back where it was before it was maximised, at its size then (Openbox alone put it a border and a
    # title bar off, (1, 20)).
    back = desktop.computer.window_geometry(editor.id)
    assert (back.x, back.y, back.width, back.height) == (0, 0, 500, 400), back


def test_maximize_and_restore_return_once_the_window_manager_has_done_them(
    desktop: paddock.Sandbox, editor: paddock.Window
) -> None:
    # A busy window manager carries out a request late (a loaded CI box read a window half-maximised:
    # enlarged inside its old frame, at (-1, -1)). Held stopped, it cannot act before it is let go: the
    # call must still be waiting then, and the geometry read right after it returns is the final one.
    desktop.computer.move_window(editor.id, 60, 80)
    before = desktop.computer.window_geometry(editor.id)
    for action in ("maximize", "restore"):
        stopped = desktop.run("pkill", ["-STOP", "-x", "openbox"])
        assert stopped.exit_code == 0, stopped.stderr
        with ThreadPoolExecutor(1) as pool:
            try:
                call = pool.submit(getattr(desktop.computer, f"{action}_window"), editor.id)
                time.sleep(0.5)
                waiting = not call.done()
            finally:
                assert desktop.run("pkill", ["-CONT", "-x", "openbox"]).exit_code == 0
            call.result(timeout=30)
        assert waiting, f"{action} returned while the window manager was stopped"
        box = desktop.computer.window_geometry(editor.id)
        width, height = desktop.computer.screen_size()
        if action == "maximize":
            assert (box.x, box.width, box.y + box.height) == (0, width, height), box
        else:  # its size and place before
            assert (box.x, box.y, box.width, box.height) == (before.x, before.y, before.width, before.height)


def test_a_window_manager_that_died_is_started_again(
    desktop: paddock.Sandbox, editor: paddock.Window
) -> None:
    # Without a window manager no window is listed or can be moved; the next operation brings one back,
    # and it adopts the windows already open.
    killed = desktop.run("sh", ["-c", "pkill -KILL -x openbox && sleep 0.5 && ! pgrep -x openbox"])
    assert killed.exit_code == 0, killed.stderr
    assert editor.id in [w.id for w in desktop.computer.windows()]
    assert desktop.run("pgrep", ["-x", "openbox"]).exit_code == 0
    desktop.computer.move_window(editor.id, 80, 90)
    moved = desktop.computer.window_geometry(editor.id)
    assert (moved.x, moved.y) == (80, 90)


def test_clicking_a_button_in_chromium_changes_the_page(desktop: paddock.Sandbox) -> None:
    desktop.files.write("/srv/page_server.py", PAGE_SERVER.replace("PORT", str(PAGE_PORT)).encode())
    desktop.run("bash", ["-c", "setsid python3 /srv/page_server.py >/tmp/page.log 2>&1 </dev/null &"])
    eventually(
        lambda: desktop.run("curl", ["-sf", f"http://127.0.0.1:{PAGE_PORT}/"]).exit_code == 0,
        "the page server",
    )
    desktop.computer.open(f"http://127.0.0.1:{PAGE_PORT}/")
    page = eventually(lambda: window_titled(desktop, "ready"), "Chromium showing the page", timeout_s=90)
    assert "Chromium" in page.title
    desktop.computer.maximize_window(page.id)
    eventually(lambda: desktop.computer.window_geometry(page.id).width > 1200, "the maximized browser")
    before = desktop.computer.screenshot()
    desktop.computer.click(640, 500)
    clicked = eventually(lambda: window_titled(desktop, "clicked 1"), "the page's title after the click")
    assert clicked.id == page.id
    assert desktop.files.read("/tmp/clicks") == b"click\n"  # the page told its server
    assert desktop.computer.screenshot() != before
    assert [w.title for w in desktop.computer.windows("chromium")] == [clicked.title]
    desktop.computer.close_window(page.id)
    eventually(lambda: page.id not in [w.id for w in desktop.computer.windows()], "the closed browser")


def test_a_second_screen_works_independently(desktop: paddock.Sandbox, editor: paddock.Window) -> None:
    screen = desktop.computer.create_screen(800, 600)
    try:
        assert screen.screen_id != "screen-0" and (screen.width, screen.height) == (800, 600)
        assert screen.screen_id in [s.screen_id for s in desktop.computer.screens()]
        second = screen.screen_id
        assert png_size(desktop.computer.screenshot(screen_id=second)) == (800, 600)
        first_before = desktop.computer.screenshot()
        first_windows = desktop.computer.windows()
        desktop.computer.launch("mousepad", screen_id=second)
        other = eventually(
            lambda: window_titled(desktop, "Mousepad", second), "Mousepad on the second screen"
        )
        assert desktop.computer.windows() == first_windows  # window ids are per screen: compare lists
        desktop.computer.focus_window(other.id, screen_id=second)
        desktop.computer.type("second screen", screen_id=second)
        eventually(lambda: window_titled(desktop, "*", second), "typing on the second screen")
        assert desktop.computer.screenshot() == first_before  # screen-0 did not change
        desktop.computer.move_mouse(100, 50, screen_id=second)
        assert desktop.computer.cursor(screen_id=second) == (100, 50)
        resized = desktop.computer.resize_screen(second, 1024, 700)
        assert (resized.width, resized.height) == (1024, 700)
        assert png_size(desktop.computer.screenshot(screen_id=second)) == (1024, 700)
    finally:
        desktop.computer.delete_screen(screen.screen_id)
    with pytest.raises(paddock.NotFoundError):
        desktop.computer.get_screen(screen.screen_id)


def test_a_fork_of_a_desktop_gets_a_screen_of_its_own(
    desktop: paddock.Sandbox, editor: paddock.Window
) -> None:
    # The fork's disk carries the source's X lock (/tmp/.X0-lock, naming a pid that another process of
    # the child may hold): Xvfb refused to start there, and every call on the child answered 500.
    child = desktop.fork()
    try:
        assert png_size(child.computer.screenshot()) == (1280, 800)
        assert child.computer.windows() == []  # files carry over, processes (and windows) do not
        child.computer.launch("mousepad")
        eventually(lambda: window_titled(child, "Mousepad"), "Mousepad on the fork's screen")
        assert editor.id in [w.id for w in desktop.computer.windows()]  # the source's screen is its own
    finally:
        child.destroy()


def test_bad_input_is_a_400_naming_the_field(
    live: LivePlatform, api_key: str, desktop: paddock.Sandbox
) -> None:
    http = live.http(api_key)
    base = f"/v1/sandboxes/{desktop.id}/computer"
    for method, path, body, params, field in (
        ("POST", "/mouse/click", {"button": "sideways"}, {}, "button"),
        ("POST", "/mouse/move", {"x": -1, "y": 0}, {}, "x"),
        ("POST", "/keyboard/press", {"keys": []}, {}, "keys"),
        ("GET", "/screen", None, {"screen_id": "screen-9"}, "screen_id"),
        ("GET", "/windows/not-a-window", None, {}, "window_id"),
        ("GET", "/screenshot", None, {"x": 1270, "width": 100}, "width"),
        ("POST", "/launch", {"application": "no-such-app"}, {}, "application"),
    ):
        answer = http.request(method, base + path, json=body, params=params)
        assert answer.status_code == 400, (path, answer.text)
        assert field in answer.json()["data"], (path, answer.text)
    missing = http.get(base + "/windows/99999999")
    assert missing.status_code == 404, missing.text
    assert http.delete(base + "/screens/screen-0").status_code == 409


def test_a_read_the_caller_gave_up_on_ends_in_the_sandbox_and_an_action_finishes(
    live: LivePlatform, api_key: str, client: paddock.Client
) -> None:
    """Computer use runs ``curl`` (to the resident helper) in the sandbox, and the sandbox is the tenant's
    to change. A read whose caller times out takes that command with it, as a buffered exec's does,
    instead of leaving it running, and the sandbox counted busy, for as long as it lasts. An action is
    not cut short: it takes effect even when its caller has gone. (A desktop of its own: the module's
    shared one keeps its ``curl``.)"""
    with client.sandboxes.create(SHAPE, rootfs=ROOTFS, disk_mib=4096) as sandbox:
        http = live.http(api_key)
        base = f"/v1/sandboxes/{sandbox.id}/computer"
        stuck = "#!/bin/sh\necho $$ > /tmp/curl.pid\nexec sleep 300\n"
        placed = sandbox.run(
            "sh", ["-c", f"printf '{stuck}' > /usr/local/bin/curl; chmod +x /usr/local/bin/curl"]
        )
        assert placed.exit_code == 0, placed
        for route in ("/screenshot", "/windows"):
            with pytest.raises(httpx.ReadTimeout):
                http.get(base + route, timeout=2.0)
            pid = sandbox.run("cat", ["/tmp/curl.pid"]).stdout.strip()
            assert pid.isdigit(), f"{route} did not run the tenant's curl"
            deadline = time.monotonic() + 10
            while sandbox.run("kill", ["-0", pid]).exit_code == 0:
                assert time.monotonic() < deadline, f"{route}'s curl (pid {pid}) outlived its caller"
                time.sleep(0.2)

        slow = '#!/bin/sh\nsleep 3\nexec /usr/bin/curl "$@"\n'
        placed = sandbox.run("sh", ["-c", f"printf '{slow}' > /usr/local/bin/curl"])
        assert placed.exit_code == 0, placed
        with pytest.raises(httpx.ReadTimeout):
            http.put(base + "/clipboard", json={"text": "set after its caller left"}, timeout=1.0)
        assert sandbox.run("rm", ["/usr/local/bin/curl"]).exit_code == 0  # reads answer at once again
        deadline = time.monotonic() + 15
        while sandbox.computer.get_clipboard() != "set after its caller left":
            assert time.monotonic() < deadline, "the clipboard action stopped when its caller left"
            time.sleep(0.3)
