"""The program that performs computer-use operations inside a ``desktop:1`` sandbox (spec §12.3).

Never imported: the control plane's ``sandboxes/computer.py`` reads this file's text and runs it in
the sandbox through the ordinary exec path, as ``python3 -c <this source> <operation> <JSON arguments>``,
so the helper always matches the control plane that sends it (no version skew with an image built earlier).
It prints one JSON document: ``{"data": …}`` on success, ``{"error": {"status", "code", "message",
"field"?}}`` for a request the desktop refuses (exit status 3). A screenshot's PNG travels base64 in
``data.png``, since exec output is text.

The X session is started lazily, per screen, on first use: ``Xvfb :N`` and Openbox for ``screen-N``;
``x11vnc`` (loopback only) and ``websockify`` serving noVNC on ``6080+N`` start on the first ``connect``.
Every process is started in its own session, so it outlives this exec. State lives in
``/run/paddock-desktop`` (one JSON file per screen), guarded by one lock.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import ImageGrab

STATE_DIR = Path("/run/paddock-desktop")
MAX_SCREENS = 8
DEFAULT_SIZE = (1280, 800)
MIN_SIZE = (320, 240)
MAX_SIZE = (3840, 2160)
VNC_BASE_PORT = 5900
NOVNC_BASE_PORT = 6080
NOVNC_WEB = "/usr/share/novnc"
BUTTONS = {"left": "1", "middle": "2", "right": "3"}
KEY_NAMES = {
    "enter": "Return",
    "return": "Return",
    "ctrl": "ctrl",
    "control": "ctrl",
    "alt": "alt",
    "shift": "shift",
    "cmd": "super",
    "command": "super",
    "meta": "super",
    "super": "super",
    "win": "super",
    "esc": "Escape",
    "escape": "Escape",
    "tab": "Tab",
    "backspace": "BackSpace",
    "delete": "Delete",
    "del": "Delete",
    "insert": "Insert",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "pageup": "Prior",
    "page_up": "Prior",
    "pagedown": "Next",
    "page_down": "Next",
    "home": "Home",
    "end": "End",
    "space": "space",
    "capslock": "Caps_Lock",
}
BROWSERS = {"chromium", "chrome", "google-chrome", "browser", "firefox", "web-browser"}
EDITORS = {"mousepad", "editor", "text-editor", "texteditor", "gedit", "notepad"}


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def bad(field: str, message: str) -> Refused:
    return Refused(400, "VALIDATION_ERROR", f"{field}: {message}", field)


# -- screens -------------------------------------------------------------------------------------


def screen_index(screen_id: str) -> int:
    match = re.fullmatch(r"screen-([0-7])", screen_id)
    if match is None:
        raise bad("screen_id", "must be one of screen-0 … screen-7")
    return int(match.group(1))


def state_path(index: int) -> Path:
    return STATE_DIR / f"screen-{index}.json"


def alive(pid: int, name: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return name.encode() in cmdline


def read_state(index: int) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_path(index).read_text())
    except (OSError, ValueError):
        return None
    if not alive(int(state.get("xvfb_pid", 0)), "Xvfb"):
        return None
    return state


def write_state(index: int, state: dict[str, Any]) -> None:
    tmp = state_path(index).with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(state_path(index))


def spawn(
    argv: list[str], display: str | None = None, log_name: str | None = None
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.setdefault("HOME", "/root")
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if display:
        env["DISPLAY"] = display
    out: Any = subprocess.DEVNULL
    if log_name:
        out = open(STATE_DIR / log_name, "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
    )
    if log_name:
        out.close()
    if RESIDENT:
        CHILDREN.append(process)
    return process


def display_of(index: int) -> str:
    return f":{index}"


def socket_made(path: Path) -> bool:
    """Whether the X server's socket file is there. On gVisor ``/tmp`` is a directory of the host's
    (runsc's gofer), where a socket is the host's own (``--host-uds=create``) and stat() on it answers
    EPERM: the name exists, and clients reach the server by its abstract socket anyway."""
    try:
        return path.exists()
    except PermissionError:
        return True


def wait_for_display(index: int, xvfb: subprocess.Popen[bytes]) -> None:
    socket = Path(f"/tmp/.X11-unix/X{index}")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if socket_made(socket) and run(["xdotool", "getdisplaygeometry"], index, check=False).returncode == 0:
            return
        if xvfb.poll() is not None:
            break
        time.sleep(0.05)
    raise Refused(500, "DESKTOP_FAILED", f"the X server of screen-{index} did not start")


def clear_stale_display(index: int) -> list[str]:
    """Removes the lock and socket a screen's X server left when it is not running, and says which
    listeners Xvfb may not open. A fork's copy of the disk (or a restart) carries ``/tmp/.X<N>-lock``
    naming a pid that some other process of the new sandbox may hold, and Xvfb then refused to start
    ("Server is already active for display 0"). On gVisor the old socket is the host's own (``/tmp`` is
    bound from the sandbox's disk, ``--host-uds=create``) and cannot be removed from inside (EPERM):
    that Xvfb listens on its abstract socket alone (``-nolisten unix``), which X clients try first."""
    lock = Path(f"/tmp/.X{index}-lock")
    try:
        pid = int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        pid = 0
    if pid and alive(pid, "Xvfb"):
        return []
    with contextlib.suppress(OSError):
        lock.unlink()
    try:
        Path(f"/tmp/.X11-unix/X{index}").unlink()
    except FileNotFoundError:
        pass
    except OSError:
        return ["-nolisten", "unix"]
    return []


def start_screen(index: int, width: int, height: int) -> dict[str, Any]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    Path("/tmp/.X11-unix").mkdir(mode=0o1777, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod("/tmp/.X11-unix", 0o1777)
    listeners = clear_stale_display(index)
    display = display_of(index)
    xvfb = spawn(
        ["Xvfb", display, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", *listeners, "-ac"],
        log_name=f"xvfb-{index}.log",
    )
    wait_for_display(index, xvfb)
    state = {
        "index": index,
        "width": width,
        "height": height,
        "xvfb_pid": xvfb.pid,
        "wm_pid": start_window_manager(index),
        "vnc_pid": 0,
        "novnc_pid": 0,
    }
    write_state(index, state)
    return state


def start_window_manager(index: int) -> int:
    """Starts openbox on the screen and waits until it manages the root window: a window mapped before
    that gets no frame and never shows in ``wmctrl -l``, so an app launched too early is invisible to the
    window operations. The wait used to end after 5 s regardless; a CI run on a loaded 2-core box then
    showed no window for 90 s, which a late or dead window manager explains."""
    wm = spawn(["openbox", "--sm-disable"], display_of(index), f"openbox-{index}.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if run(["wmctrl", "-m"], index, check=False).returncode == 0:
            return wm.pid
        if wm.poll() is not None:
            # Started while the screen's previous X server or window manager was still going away (a
            # resize restarts both; on a loaded box that takes seconds), openbox can give up at once:
            # start it again until the deadline rather than fail the request.
            time.sleep(0.2)
            wm = spawn(["openbox", "--sm-disable"], display_of(index), f"openbox-{index}.log")
            continue
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.killpg(wm.pid, signal.SIGKILL)
    raise Refused(500, "DESKTOP_FAILED", f"the window manager of screen-{index} did not start")


ADOPT_TIMEOUT_S = 10.0


def with_window_manager(state: dict[str, Any]) -> dict[str, Any]:
    """The screen's state with its window manager running: one that died is started again (its
    windows are adopted by the new one), since without it no window is listed or can be moved."""
    index = int(state["index"])
    if alive(int(state.get("wm_pid") or 0), "openbox"):
        return state
    with Lock():
        current = read_state(index)
        if current is None or alive(int(current.get("wm_pid") or 0), "openbox"):
            return current or state
        orphans = orphaned_clients(index)
        current["wm_pid"] = start_window_manager(index)
        write_state(index, current)
        # Openbox answers wmctrl -m before it has adopted the windows already open (a second later on
        # gVisor, where the list came back empty; the dead one's list stays on the root window until
        # the new one clears it): wait, bounded, until it has framed them all and lists them.
        deadline = time.monotonic() + ADOPT_TIMEOUT_S
        while time.monotonic() < deadline and (
            orphaned_clients(index) > 0 or len(managed_windows(index)) < orphans
        ):
            time.sleep(0.1)
        return current


def orphaned_clients(index: int) -> int:
    """How many windows a dead window manager had managed and none has framed again: the X server
    hands them back to the root window (its save-set), and they keep the WM_STATE property it gave
    them."""
    tree = run(["xwininfo", "-root", "-children"], index, check=False).stdout.decode(errors="replace")
    count = 0
    for match in re.finditer(r"^\s+(0x[0-9a-f]+) ", tree, re.MULTILINE):
        state = run(["xprop", "-id", match.group(1), "WM_STATE"], index, check=False).stdout
        count += b"window state:" in state
    return count


def stop_screen(state: dict[str, Any]) -> None:
    for key in ("novnc_pid", "vnc_pid", "wm_pid", "xvfb_pid"):
        pid = int(state.get(key) or 0)
        if pid > 0:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and alive(int(state["xvfb_pid"]), "Xvfb"):
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.killpg(int(state["xvfb_pid"]), signal.SIGKILL)
    # Gone, not just signalled: a screen started again on the same display (a resize) must not meet the
    # old server or window manager still holding it.
    names = {"xvfb_pid": "Xvfb", "wm_pid": "openbox", "vnc_pid": "x11vnc", "novnc_pid": "websockify"}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        alive(int(state.get(key) or 0), name) for key, name in names.items()
    ):
        time.sleep(0.05)
    state_path(int(state["index"])).unlink(missing_ok=True)


class Lock:
    def __enter__(self) -> Lock:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.file = open(STATE_DIR / "lock", "w")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def ensure_screen(index: int) -> dict[str, Any]:
    """The running screen; screen-0 is started on first use, others must have been created."""
    state = read_state(index)
    if state is not None:
        return with_window_manager(state)
    if index != 0:
        raise Refused(404, "NOT_FOUND", f"screen-{index} does not exist; create it with POST /screens")
    with Lock():
        return read_state(0) or start_screen(0, *DEFAULT_SIZE)


def screen_view(state: dict[str, Any]) -> dict[str, Any]:
    index = int(state["index"])
    return {
        "screen_id": f"screen-{index}",
        "display": display_of(index),
        "width": int(state["width"]),
        "height": int(state["height"]),
        "vnc_port": VNC_BASE_PORT + index,
        "novnc_port": NOVNC_BASE_PORT + index,
    }


def size_from(args: dict[str, Any], default: tuple[int, int]) -> tuple[int, int]:
    width = args.get("width", default[0])
    height = args.get("height", default[1])
    for field, value, low, high in (
        ("width", width, MIN_SIZE[0], MAX_SIZE[0]),
        ("height", height, MIN_SIZE[1], MAX_SIZE[1]),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise bad(field, f"must be an integer from {low} to {high}")
    return int(width), int(height)


# -- running X tools -----------------------------------------------------------------------------


def run(argv: list[str], index: int, *, check: bool = True, stdin: bytes | None = None) -> Any:
    env = dict(os.environ, DISPLAY=display_of(index))
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    result = subprocess.run(argv, env=env, input=stdin, capture_output=True, timeout=30, check=False)
    if check and result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()[-300:]
        raise Refused(500, "DESKTOP_FAILED", f"{argv[0]} failed: {message}")
    return result


def shell_values(output: bytes) -> dict[str, str]:
    values = {}
    for line in output.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def window_id(raw: Any) -> int:
    try:
        value = int(str(raw), 0)
    except ValueError:
        raise bad("window_id", "must be a window id (decimal or 0x hex)") from None
    if not 0 < value < 2**32:
        raise bad("window_id", "must be a window id (decimal or 0x hex)")
    return value


def managed_windows(index: int) -> list[dict[str, Any]]:
    """Top-level windows the window manager manages (minimized ones too), oldest first."""
    result = run(["wmctrl", "-lx"], index, check=False)
    windows = []
    for line in result.stdout.decode(errors="replace").splitlines():
        parts = line.split(None, 4)
        if len(parts) < 4:
            continue
        title = parts[4] if len(parts) == 5 else ""
        windows.append({"id": str(int(parts[0], 16)), "wm_class": parts[2], "title": title})
    return windows


def existing_window(index: int, raw: Any) -> int:
    wid = window_id(raw)
    if run(["xdotool", "getwindowname", str(wid)], index, check=False).returncode != 0:
        raise Refused(404, "NOT_FOUND", f"no window {raw} on screen-{index}")
    return wid


def window_title(index: int, wid: int) -> str:
    result = run(["xdotool", "getwindowname", str(wid)], index)
    return str(result.stdout.decode(errors="replace").rstrip("\n"))


def window_info(index: int, wid: int) -> dict[str, str]:
    """``xwininfo -id``'s fields (``Absolute upper-left X``, ``Width``, ``Map State`` …)."""
    values = {}
    for line in run(["xwininfo", "-id", str(wid)], index).stdout.decode(errors="replace").splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            values[key.strip()] = value.strip()
    return values


def geometry(index: int, wid: int) -> dict[str, int]:
    """The window's own area, without the window manager's frame (border and title bar), in screen
    coordinates: what the application draws, what a window screenshot holds, and what a move places and
    a resize sizes. ``xwininfo`` translates the window's origin to the root window. (``xdotool
    getwindowgeometry`` translated the window's offset inside its frame from the window's own origin,
    so it counted that offset twice: a maximised window read y=38 and height 781 on an 800-pixel screen,
    and a window moved to (60, 80) read (62, 120).)"""
    values = window_info(index, wid)
    return {
        "x": int(values["Absolute upper-left X"]),
        "y": int(values["Absolute upper-left Y"]),
        "width": int(values["Width"]),
        "height": int(values["Height"]),
    }


def point(args: dict[str, Any], prefix: str = "") -> tuple[int, int]:
    coords = []
    for axis in ("x", "y"):
        value = args.get(axis)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100_000:
            raise bad(prefix + axis, "must be a non-negative integer")
        coords.append(value)
    return coords[0], coords[1]


def button_of(args: dict[str, Any]) -> str:
    button = args.get("button", "left")
    if button not in BUTTONS:
        raise bad("button", "must be one of left, middle, right")
    return BUTTONS[button]


def keysym(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > 64 or not key.isprintable():
        raise bad("keys", "each key must be a non-empty key name")
    lowered = key.lower()
    if lowered in KEY_NAMES:
        return KEY_NAMES[lowered]
    if re.fullmatch(r"f([1-9]|1[0-9]|2[0-4])", lowered):
        return lowered.upper()
    return key


def keys_of(args: dict[str, Any]) -> list[str]:
    keys = args.get("keys")
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list) or not keys or len(keys) > 16:
        raise bad("keys", "must be a list of 1 to 16 key names")
    return [keysym(key) for key in keys]


def text_of(args: dict[str, Any], field: str) -> str:
    text = args.get(field)
    if not isinstance(text, str):
        raise bad(field, "must be a string")
    return text


def launch_argv(application: str, uri: str | None, index: int) -> list[str]:
    name = application.strip().lower()
    if name in BROWSERS:
        argv = [
            "chromium",
            "--no-sandbox",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--password-store=basic",
            # Xvfb has no compositor: without these Chromium may think its window hidden and stop painting.
            "--disable-backgrounding-occluded-windows",
            "--disable-renderer-backgrounding",
            f"--user-data-dir=/root/.config/chromium-screen-{index}",
        ]
        return [*argv, uri] if uri else [*argv, "--new-window"]
    if name in EDITORS:
        return ["mousepad"] + ([uri] if uri else [])
    if re.fullmatch(r"[A-Za-z0-9._+-]{1,64}", application) and shutil.which(application):
        return [application] + ([uri] if uri else [])
    raise bad("application", f"{application!r} is not installed (try chromium or mousepad)")


# -- operations ----------------------------------------------------------------------------------


def op_screenshot(index: int, args: dict[str, Any]) -> dict[str, Any]:
    state = ensure_screen(index)
    width, height = int(state["width"]), int(state["height"])
    if args.get("window_id") is not None:
        wid = existing_window(index, args["window_id"])
        if window_info(index, wid).get("Map State") != "IsViewable":
            raise Refused(409, "INVALID_STATE", "the window is not on the screen (minimized?)")
        box = geometry(index, wid)
        left, top = max(box["x"], 0), max(box["y"], 0)
        right, bottom = min(box["x"] + box["width"], width), min(box["y"] + box["height"], height)
        if right <= left or bottom <= top:
            raise Refused(409, "INVALID_STATE", "the window is not on the screen (minimized?)")
    else:
        region = {key: args.get(key) for key in ("x", "y", "width", "height")}
        left, top = int(region["x"] or 0), int(region["y"] or 0)
        right = left + int(region["width"] if region["width"] is not None else width - left)
        bottom = top + int(region["height"] if region["height"] is not None else height - top)
        if not (0 <= left < right <= width):
            raise bad(
                "width" if region["width"] is not None else "x", f"the region must lie within 0…{width}"
            )
        if not (0 <= top < bottom <= height):
            raise bad(
                "height" if region["height"] is not None else "y", f"the region must lie within 0…{height}"
            )
    image = ImageGrab.grab(bbox=(left, top, right, bottom), xdisplay=display_of(index))
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=1)
    return {"png": base64.b64encode(buffer.getvalue()).decode()}


def op_screen(index: int, args: dict[str, Any]) -> dict[str, Any]:
    ensure_screen(index)
    values = run(["xdotool", "getdisplaygeometry"], index, check=True)
    width, height = values.stdout.split()
    return {"width": int(width), "height": int(height)}


def op_cursor(index: int, args: dict[str, Any]) -> dict[str, Any]:
    ensure_screen(index)
    values = shell_values(run(["xdotool", "getmouselocation", "--shell"], index).stdout)
    return {"x": int(values["X"]), "y": int(values["Y"])}


def op_clipboard_get(index: int, args: dict[str, Any]) -> dict[str, Any]:
    ensure_screen(index)
    result = run(["xclip", "-selection", "clipboard", "-o"], index, check=False)
    return {"text": result.stdout.decode(errors="replace") if result.returncode == 0 else ""}


def op_clipboard_set(index: int, args: dict[str, Any]) -> dict[str, Any]:
    text = text_of(args, "text")
    ensure_screen(index)
    # xclip stays in the background to serve the selection; it must not hold this exec's pipes.
    env = dict(os.environ, DISPLAY=display_of(index))
    process = subprocess.Popen(
        ["xclip", "-selection", "clipboard", "-i"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    process.communicate(text.encode(), timeout=10)
    return {"ok": True}


def op_launch(index: int, args: dict[str, Any]) -> dict[str, Any]:
    application = text_of(args, "application")
    uri = args.get("uri")
    if uri is not None and (not isinstance(uri, str) or uri.startswith("-")):
        raise bad("uri", "must be a string that does not start with '-'")
    ensure_screen(index)
    argv = launch_argv(application, uri, index)
    spawn(argv, display_of(index), f"{Path(argv[0]).name}-{index}.log")
    return {"ok": True}


def op_open(index: int, args: dict[str, Any]) -> dict[str, Any]:
    target = text_of(args, "target")
    if not target or target.startswith("-"):
        raise bad("target", "must be a URL or a path")
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", target):
        return op_launch(index, {"application": "chromium", "uri": target})
    path = Path(target)
    if not path.exists():
        raise bad("target", f"{target} does not exist in the sandbox")
    text_like = path.suffix.lower() not in {".html", ".htm", ".pdf", ".png", ".jpg", ".jpeg", ".gif", ".svg"}
    if text_like and path.is_file():
        return op_launch(index, {"application": "mousepad", "uri": str(path)})
    return op_launch(index, {"application": "chromium", "uri": path.resolve().as_uri()})


def op_mouse_move(index: int, args: dict[str, Any]) -> dict[str, Any]:
    x, y = point(args)
    ensure_screen(index)
    run(["xdotool", "mousemove", str(x), str(y)], index)
    return {"ok": True}


def op_mouse_click(index: int, args: dict[str, Any]) -> dict[str, Any]:
    button = button_of(args)
    count = args.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 10:
        raise bad("count", "must be an integer from 1 to 10")
    argv = ["xdotool"]
    if args.get("x") is not None or args.get("y") is not None:
        x, y = point(args)
        argv += ["mousemove", str(x), str(y)]
    ensure_screen(index)
    run([*argv, "click", "--repeat", str(count), "--delay", "80", button], index)
    return {"ok": True}


def op_mouse_scroll(index: int, args: dict[str, Any]) -> dict[str, Any]:
    direction = args.get("direction", "down")
    if direction not in ("up", "down", "left", "right"):
        raise bad("direction", "must be up or down")
    amount = args.get("amount", 1)
    if not isinstance(amount, int) or isinstance(amount, bool) or not 1 <= amount <= 100:
        raise bad("amount", "must be an integer from 1 to 100")
    button = {"up": "4", "down": "5", "left": "6", "right": "7"}[direction]
    ensure_screen(index)
    run(["xdotool", "click", "--repeat", str(amount), "--delay", "20", button], index)
    return {"ok": True}


def op_mouse_drag(index: int, args: dict[str, Any]) -> dict[str, Any]:
    start, end = args.get("from"), args.get("to")
    if not isinstance(start, dict):
        raise bad("from", "must be an object {x, y}")
    if not isinstance(end, dict):
        raise bad("to", "must be an object {x, y}")
    x0, y0 = point(start, "from.")
    x1, y1 = point(end, "to.")
    ensure_screen(index)
    steps = [(x0 + (x1 - x0) * i // 8, y0 + (y1 - y0) * i // 8) for i in range(1, 9)]
    argv = ["xdotool", "mousemove", str(x0), str(y0), "mousedown", "1"]
    for x, y in steps:
        argv += ["sleep", "0.02", "mousemove", str(x), str(y)]
    run([*argv, "mouseup", "1"], index)
    return {"ok": True}


def op_mouse_down(index: int, args: dict[str, Any]) -> dict[str, Any]:
    button = button_of(args)
    ensure_screen(index)
    run(["xdotool", "mousedown", button], index)
    return {"ok": True}


def op_mouse_up(index: int, args: dict[str, Any]) -> dict[str, Any]:
    button = button_of(args)
    ensure_screen(index)
    run(["xdotool", "mouseup", button], index)
    return {"ok": True}


def op_keyboard_type(index: int, args: dict[str, Any]) -> dict[str, Any]:
    text = text_of(args, "text")
    delay = args.get("delay_in_ms", 12)
    if not isinstance(delay, int) or isinstance(delay, bool) or not 0 <= delay <= 1000:
        raise bad("delay_in_ms", "must be an integer from 0 to 1000")
    ensure_screen(index)
    if text:
        run(["xdotool", "type", "--delay", str(delay), "--", text], index)
    return {"ok": True}


def op_keyboard_press(index: int, args: dict[str, Any]) -> dict[str, Any]:
    keys = keys_of(args)
    ensure_screen(index)
    run(["xdotool", "key", "--clearmodifiers", "--", "+".join(keys)], index)
    return {"ok": True}


def op_keyboard_down(index: int, args: dict[str, Any]) -> dict[str, Any]:
    keys = keys_of(args)
    ensure_screen(index)
    run(["xdotool", "keydown", "--", *keys], index)
    return {"ok": True}


def op_keyboard_up(index: int, args: dict[str, Any]) -> dict[str, Any]:
    keys = keys_of(args)
    ensure_screen(index)
    run(["xdotool", "keyup", "--", *keys], index)
    return {"ok": True}


def op_windows(index: int, args: dict[str, Any]) -> list[dict[str, Any]]:
    ensure_screen(index)
    application = args.get("application")
    windows = managed_windows(index)
    if application:
        wanted = str(application).lower()
        windows = [w for w in windows if wanted in w["wm_class"].lower()]
    return [{"id": w["id"], "title": w["title"]} for w in windows]


def op_window_current(index: int, args: dict[str, Any]) -> dict[str, Any]:
    ensure_screen(index)
    result = run(["xdotool", "getactivewindow"], index, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        raise Refused(404, "NOT_FOUND", f"no window has the focus on screen-{index}")
    wid = int(result.stdout.split()[0])
    return {"id": str(wid), "title": window_title(index, wid)}


def op_window_get(index: int, args: dict[str, Any]) -> dict[str, Any]:
    ensure_screen(index)
    wid = existing_window(index, args.get("window_id"))
    return {"id": str(wid), "title": window_title(index, wid)}


def op_window_geometry(index: int, args: dict[str, Any]) -> dict[str, Any]:
    ensure_screen(index)
    wid = existing_window(index, args.get("window_id"))
    return {"id": str(wid), **geometry(index, wid), "screen": f"screen-{index}"}


def window_action(index: int, args: dict[str, Any], *commands: list[str]) -> dict[str, Any]:
    ensure_screen(index)
    wid = str(existing_window(index, args.get("window_id")))
    for command in commands:
        run([part.replace("{id}", wid) for part in command], index)
    return {"ok": True}


def op_window_focus(index: int, args: dict[str, Any]) -> dict[str, Any]:
    return window_action(index, args, ["wmctrl", "-i", "-a", "{id}"])


MAXIMIZED = frozenset({"_NET_WM_STATE_MAXIMIZED_VERT", "_NET_WM_STATE_MAXIMIZED_HORZ"})
SETTLE_TIMEOUT_S = 2.0


def property_values(index: int, window: list[str], name: str) -> list[str]:
    """An X property's values as ``xprop`` prints them (``NAME(TYPE) = a, b``); none if it is unset."""
    output = run(["xprop", *window, name], index, check=False).stdout.decode(errors="replace")
    head, sep, values = output.partition("=")
    if not sep or not head.startswith(name):
        return []
    return [value.strip() for value in values.split(",") if value.strip()]


def numbers(values: list[str], count: int) -> list[int] | None:
    try:
        parsed = [int(value) for value in values[:count]]
    except ValueError:
        return None
    return parsed if len(parsed) == count else None


def is_maximized(index: int, wid: int) -> bool:
    return set(property_values(index, ["-id", str(wid)], "_NET_WM_STATE")) >= MAXIMIZED


def maximized_in_place(index: int, wid: int) -> bool:
    """Whether the window manager has finished maximising the window: its state says so and its frame's
    corner is the work area's. Openbox enlarges the window inside its old frame before it moves the
    frame, so in between the window reads (-1, -1) at its maximised size (a CI run read that)."""
    if not is_maximized(index, wid):
        return False
    area = numbers(property_values(index, ["-root"], "_NET_WORKAREA"), 2) or [0, 0]
    left, _right, top, _bottom = numbers(
        property_values(index, ["-id", str(wid)], "_NET_FRAME_EXTENTS"), 4
    ) or [0, 0, 0, 0]
    box = geometry(index, wid)
    return [box["x"] - left, box["y"] - top] == area[:2]


def restored_in_place(index: int, wid: int) -> bool:
    """Whether the window manager has finished restoring the window: its state no longer says
    maximised, and its geometry reads the same twice (the frame moves after the window shrinks)."""
    if MAXIMIZED & set(property_values(index, ["-id", str(wid)], "_NET_WM_STATE")):
        return False
    before = geometry(index, wid)
    time.sleep(0.02)
    return geometry(index, wid) == before


def settle(done: Callable[[], bool]) -> None:
    """Waits, bounded, until the window manager has carried out what was asked, so that the next read
    sees it (an application's size hints may keep another size: the wait then just ends)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)


#: Where a window was before it was maximised (its own area's corner, "x y"), kept on the window itself
#: so that it goes with the window and every exec of this helper finds it.
PLACE_PROPERTY = "_PADDOCK_PLACE"


def op_window_maximize(index: int, args: dict[str, Any]) -> dict[str, Any]:
    ensure_screen(index)
    wid = existing_window(index, args.get("window_id"))
    if not is_maximized(index, wid):  # a second maximise keeps the place from before the first
        box = geometry(index, wid)
        place = f"{box['x']} {box['y']}"
        run(["xprop", "-id", str(wid), "-f", PLACE_PROPERTY, "8s", "-set", PLACE_PROPERTY, place], index)
    # The screen and the window were checked above (``window_action`` would check them again).
    run(["wmctrl", "-i", "-r", str(wid), "-b", "add,maximized_vert,maximized_horz"], index)
    settle(lambda: maximized_in_place(index, wid))
    return {"ok": True}


def remembered_place(index: int, wid: int) -> tuple[int, int] | None:
    """The place ``op_window_maximize`` kept on the window, if it kept one."""
    values = property_values(index, ["-id", str(wid)], PLACE_PROPERTY)
    parts = values[0].strip('"').split() if len(values) == 1 else []
    parsed = numbers(parts, 2)
    return (parsed[0], parsed[1]) if parsed else None


def op_window_minimize(index: int, args: dict[str, Any]) -> dict[str, Any]:
    return window_action(index, args, ["xdotool", "windowminimize", "--sync", "{id}"])


def op_window_restore(index: int, args: dict[str, Any]) -> dict[str, Any]:
    """Un-minimises and un-maximises the window, back to its size and place before. Openbox alone puts
    the frame's corner where the window's own had been (the window then lies a border and a title bar
    off), and a GTK application may ask for its old place again after the window manager is done; so
    once it has settled, a window that was maximised here is moved back to the place kept then, until
    it stays there."""
    acted = window_action(
        index,
        args,
        ["wmctrl", "-i", "-r", "{id}", "-b", "remove,maximized_vert,maximized_horz"],
        ["wmctrl", "-i", "-a", "{id}"],
    )
    wid = window_id(args.get("window_id"))
    settle(lambda: restored_in_place(index, wid))
    place = remembered_place(index, wid)
    if place is not None and not is_maximized(index, wid):
        settle(lambda: placed(index, wid, place))
        run(["xprop", "-id", str(wid), "-remove", PLACE_PROPERTY], index, check=False)
    return acted


def placed(index: int, wid: int, place: tuple[int, int]) -> bool:
    """Whether the window's own area is at ``place`` and stays there a moment (an application's own
    late request would move it again); asks the window manager to move it there when it is not. A window
    not yet shown again (un-minimising) is not placed: unmapped, it reads (0, 0) wherever it will be."""
    if window_info(index, wid).get("Map State") != "IsViewable":
        return False
    box = geometry(index, wid)
    if (box["x"], box["y"]) != place:
        # Right after a restore Openbox still holds the window's place from before its maximise as the
        # window's own, though the window lies a frame's offset from it, so a request for that place is
        # no change to it and does nothing (measured: (61, 100) stayed after a move to (60, 80); a move
        # anywhere else went there). The window is asked one pixel off first, then there.
        x, y = place
        for there in (f"10,{x + 1},{y},-1,-1", f"10,{x},{y},-1,-1"):
            run(["wmctrl", "-i", "-r", str(wid), "-e", there], index)
        return False
    time.sleep(0.1)
    box = geometry(index, wid)
    return (box["x"], box["y"]) == place


def op_window_move(index: int, args: dict[str, Any]) -> dict[str, Any]:
    """The window's own area goes to (x, y), as ``geometry`` reads it back: asked of the window manager
    with static gravity (EWMH ``_NET_MOVERESIZE_WINDOW``, gravity 10), which places the window itself
    there and its frame around it. (A plain move places the frame's corner there, the window a border
    and a title bar further in; and ``wmctrl -e`` reads -1 as "unchanged", so a frame's corner cannot be
    asked for left of or above the screen's edge.) A maximised window stays where it is."""
    x, y = point(args)
    ensure_screen(index)
    wid = existing_window(index, args.get("window_id"))
    run(["wmctrl", "-i", "-r", str(wid), "-e", f"10,{x},{y},-1,-1"], index)
    deadline = time.monotonic() + 2
    while (box := geometry(index, wid))["x"] != x or box["y"] != y:
        if time.monotonic() > deadline:  # the window manager keeps it elsewhere (maximised)
            break
        time.sleep(0.02)
    return {"ok": True}


def op_window_resize(index: int, args: dict[str, Any]) -> dict[str, Any]:
    """The window's own area gets the size asked, its corner staying where it is (static gravity, as a
    move; ``xdotool windowsize`` had the window manager shift the window by its frame's offset)."""
    width, height = size_from(args, (-1, -1))
    ensure_screen(index)
    wid = existing_window(index, args.get("window_id"))
    run(["wmctrl", "-i", "-r", str(wid), "-e", f"10,-1,-1,{width},{height}"], index)
    deadline = time.monotonic() + 2
    while (box := geometry(index, wid))["width"] != width or box["height"] != height:
        if time.monotonic() > deadline:  # the application's size hints, or maximised, keep another size
            break
        time.sleep(0.02)
    return {"ok": True}


def op_window_close(index: int, args: dict[str, Any]) -> dict[str, Any]:
    return window_action(index, args, ["wmctrl", "-i", "-c", "{id}"])


def op_screens(index: int, args: dict[str, Any]) -> list[dict[str, Any]]:
    ensure_screen(0)
    return [screen_view(state) for i in range(MAX_SCREENS) if (state := read_state(i)) is not None]


def op_screen_create(index: int, args: dict[str, Any]) -> dict[str, Any]:
    width, height = size_from(args, DEFAULT_SIZE)
    ensure_screen(0)
    with Lock():
        for candidate in range(1, MAX_SCREENS):
            if read_state(candidate) is None:
                return screen_view(start_screen(candidate, width, height))
    raise Refused(409, "LIMIT_EXCEEDED", f"a sandbox has at most {MAX_SCREENS} screens")


def op_screen_get(index: int, args: dict[str, Any]) -> dict[str, Any]:
    return screen_view(ensure_screen(index))


def op_screen_resize(index: int, args: dict[str, Any]) -> dict[str, Any]:
    state = ensure_screen(index)
    width, height = size_from(args, (int(state["width"]), int(state["height"])))
    with Lock():
        # Xvfb cannot grow its framebuffer: the screen's X server is started again at the new size, so
        # the windows that were on it are closed.
        vnc_was_on = bool(state.get("novnc_pid"))
        stop_screen(state)
        state = start_screen(index, width, height)
        if vnc_was_on:
            state = start_vnc(state)
    return screen_view(state)


def op_screen_delete(index: int, args: dict[str, Any]) -> dict[str, Any]:
    if index == 0:
        raise Refused(409, "INVALID_STATE", "screen-0 is the sandbox's main screen and cannot be deleted")
    state = read_state(index)
    if state is None:
        raise Refused(404, "NOT_FOUND", f"screen-{index} does not exist")
    with Lock():
        stop_screen(state)
    return {"ok": True}


def start_vnc(state: dict[str, Any]) -> dict[str, Any]:
    index = int(state["index"])
    display = display_of(index)
    if not alive(int(state.get("vnc_pid") or 0), "x11vnc"):
        state["vnc_pid"] = spawn(
            [
                "x11vnc",
                "-display",
                display,
                "-rfbport",
                str(VNC_BASE_PORT + index),
                "-localhost",
                "-forever",
                "-shared",
                "-nopw",
                "-noxdamage",
                "-quiet",
            ],
            log_name=f"x11vnc-{index}.log",
        ).pid
    if not alive(int(state.get("novnc_pid") or 0), "websockify"):
        state["novnc_pid"] = spawn(
            [
                "python3",
                "-m",
                "websockify",
                "--web",
                NOVNC_WEB,
                f"0.0.0.0:{NOVNC_BASE_PORT + index}",
                f"127.0.0.1:{VNC_BASE_PORT + index}",
            ],
            log_name=f"websockify-{index}.log",
        ).pid
    write_state(index, state)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if listening(VNC_BASE_PORT + index) and listening(NOVNC_BASE_PORT + index):
            return state
        time.sleep(0.05)
    raise Refused(500, "DESKTOP_FAILED", f"the VNC server of screen-{index} did not start")


def listening(port: int) -> bool:
    wanted = f"{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].rsplit(":", 1)[-1] == wanted and fields[3] == "0A":
                    return True
    return False


def op_connect(index: int, args: dict[str, Any]) -> dict[str, Any]:
    state = ensure_screen(index)
    with Lock():
        state = start_vnc(read_state(index) or state)
    return screen_view(state)


OPERATIONS = {name.removeprefix("op_"): fn for name, fn in dict(globals()).items() if name.startswith("op_")}


def answer(operation: str, raw_args: str | bytes) -> tuple[dict[str, Any], int]:
    """One operation's JSON document and exit status: ``{"data": …}`` and 0, or ``{"error": …}`` and 3."""
    try:
        if operation not in OPERATIONS:
            raise Refused(500, "DESKTOP_FAILED", f"unknown operation {operation[:40]!r}")
        args = json.loads(raw_args)
        if not isinstance(args, dict):
            raise Refused(500, "DESKTOP_FAILED", "the arguments must be a JSON object")
        index = screen_index(str(args.pop("screen_id", None) or "screen-0"))
        return {"data": OPERATIONS[operation](index, args)}, 0
    except Refused as exc:
        error = {"status": exc.status, "code": exc.code, "message": exc.message}
        if exc.field:
            error["field"] = exc.field
        return {"error": error}, 3
    except subprocess.TimeoutExpired as exc:
        message = f"{exc.cmd[0]} timed out"
        return {"error": {"status": 500, "code": "DESKTOP_FAILED", "message": message}}, 3
    except ValueError as exc:
        return {"error": {"status": 500, "code": "DESKTOP_FAILED", "message": f"bad arguments: {exc}"}}, 3
    except Exception as exc:
        # Every request gets an answer, this one naming the fault. Uncaught, it killed the resident
        # helper's handler thread, and the caller saw only an empty reply (curl exit 52: a CI run's
        # create_screen on gVisor). The traceback goes to a bounded log.
        note_fault()
        message = f"the desktop helper failed: {type(exc).__name__}: {exc}"[:300]
        return {"error": {"status": 500, "code": "DESKTOP_FAILED", "message": message}}, 3


#: The faults log (``STATE_DIR/helper-faults.log``) is cut back to its newest half past this size.
MAX_FAULT_LOG_BYTES = 64 * 1024


def note_fault() -> None:
    """Appends the current exception's traceback to the faults log, keeping the log bounded."""
    import traceback

    entry = traceback.format_exc().encode(errors="replace")[-8192:]
    with contextlib.suppress(OSError):
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        log = STATE_DIR / "helper-faults.log"
        kept = log.read_bytes() if log.exists() else b""
        if len(kept) + len(entry) > MAX_FAULT_LOG_BYTES:
            kept = kept[-(MAX_FAULT_LOG_BYTES // 2) :]
        log.write_bytes(kept + entry)


# -- the resident helper ---------------------------------------------------------------------------
# A Python start costs ~80 ms in a sandbox here, and Pillow's import more: most of a screenshot's time
# when every call was ``python3 -c``. So the first call, after answering, leaves this program running as
# a small HTTP server on a unix socket in STATE_DIR; later calls are one ``curl --unix-socket`` each.
# The socket's name carries the control plane's digest of this source, so a newer control plane never
# talks to an older helper: it starts its own, and the old one, its socket taken away, exits. An idle
# helper exits too; the next call starts it again (the control plane falls back to ``python3 -c``
# whenever curl cannot connect, so a fork, a hibernated sandbox or a killed helper cost one slow call).

#: An idle resident helper exits after this long.
IDLE_EXIT_S = 900.0
#: How long a leaving helper still serves connections that reached it before its socket's name went.
LEAVE_GRACE_S = 1.0
#: The largest request body the resident helper reads (the arguments of one operation).
MAX_REQUEST_BYTES = 1 << 20
#: Popen objects of long-lived children (Xvfb, Openbox, x11vnc, websockify, applications) started by a
#: resident helper: polled so that those that exit are reaped instead of staying zombies of it.
CHILDREN: list[subprocess.Popen[bytes]] = []
RESIDENT = False


def serve(socket_path: Path) -> None:
    """Answers operations on ``socket_path`` until idle or until the socket is no longer ours."""
    import http.server
    import socketserver
    import threading

    # Opened without truncating: a helper that loses the race must not erase the winner's pid.
    lock = open(socket_path.with_suffix(".lock"), "a")  # noqa: SIM115 - held for this process's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another resident helper of this digest is running or starting
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")  # who serves the socket, for anyone (a test, a person) who asks
    lock.flush()
    for stale in STATE_DIR.glob("helper-*.sock"):
        stale.unlink(missing_ok=True)  # ours (left by a dead helper) and older digests' (they exit)
    last_request = [time.monotonic()]

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 60  # a caller that stalls sending its request cannot hold a thread, or a leave, for good

        def do_POST(self) -> None:
            last_request[0] = time.monotonic()
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_REQUEST_BYTES:
                document: dict[str, Any] = {
                    "error": {"status": 400, "code": "VALIDATION_ERROR", "message": "request too large"}
                }
            else:
                document, _ = answer(self.path.lstrip("/"), self.rfile.read(length))
            payload = (json.dumps(document) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            last_request[0] = time.monotonic()

        def log_message(self, *args: Any) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = False  # so that ``server_close`` waits for the requests in flight

    server = Server(str(socket_path), Handler)
    os.chmod(socket_path, 0o600)
    ours = os.stat(socket_path).st_ino

    def still_ours() -> bool:
        # Only a missing name or another inode means the socket was taken away: any other failure to
        # stat it (a transient one of gVisor's gofer) must not end a helper with requests in flight.
        try:
            return os.stat(socket_path).st_ino == ours
        except FileNotFoundError:
            return False
        except OSError:
            return True

    def watch() -> None:
        while True:
            time.sleep(2.0)
            for child in list(CHILDREN):
                if child.poll() is not None:
                    CHILDREN.remove(child)
            if not still_ours() or time.monotonic() - last_request[0] > IDLE_EXIT_S:
                leave()
                return

    def leave() -> None:
        # Leaving must not drop a request: the name goes first (a caller that comes later cannot connect,
        # and curl's exit 7 sends it to the ``python3 -c`` path), then connections already queued are
        # still served for a moment, and the requests in flight are waited for (``server_close`` joins
        # the handler threads). Before, the process exited under them and their callers got an empty
        # reply.
        with contextlib.suppress(OSError):
            if still_ours():
                socket_path.unlink()
        time.sleep(LEAVE_GRACE_S)
        server.shutdown()

    threading.Thread(target=watch, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()


def become_resident(socket_path: Path) -> None:
    """Forks a resident helper that outlives this call, detached from the exec's pipes and session."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() != 0:
        return
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        global RESIDENT
        RESIDENT = True
        serve(socket_path)
    finally:
        os._exit(0)


def main(argv: list[str]) -> int:
    """``<operation> <JSON arguments> [<socket path>]``: answers the operation, then stays resident on
    the socket when one is named."""
    if len(argv) not in (3, 4):
        print(json.dumps({"error": {"status": 500, "code": "DESKTOP_FAILED", "message": "bad arguments"}}))
        return 3
    document, status = answer(argv[1], argv[2])
    print(json.dumps(document))
    if len(argv) == 4:
        socket_path = Path(argv[3])
        if socket_path.parent == STATE_DIR and re.fullmatch(r"helper-[0-9a-f]{16}\.sock", socket_path.name):
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            become_resident(socket_path)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
