"""A real headless Chromium on the host, driven over the DevTools protocol (CDP), and a small PNG reader.

Debian's ``chromium`` (installed by ``scripts/setup-host.sh --test``) is started with
``--remote-debugging-port=0``; the port is read from ``DevToolsActivePort`` and the page is driven over
its WebSocket with the ``websockets`` client. No browser download, no Playwright.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Page:
    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []  # what the browser reported meanwhile (enabled domains)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        self.socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result") or {})
            if "method" in message and len(self.events) < 10_000:
                self.events.append(message)

    def pending_requests(self) -> list[str]:
        """URLs the page asked for that neither finished nor failed (needs ``Network.enable``)."""
        started: dict[str, str] = {}
        for event in self.events:
            params = event.get("params") or {}
            if event["method"] == "Network.requestWillBeSent":
                started[params["requestId"]] = params["request"]["url"]
            elif event["method"] in ("Network.loadingFinished", "Network.loadingFailed"):
                started.pop(params["requestId"], None)
        return list(started.values())

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])


@contextlib.contextmanager
def headless_chromium(width: int, height: int) -> Iterator[Page]:
    profile = Path(tempfile.mkdtemp(prefix="pdk-chromium-"))
    process = subprocess.Popen(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Chromium puts its singleton socket in $TMPDIR/org.chromium.Chromium.*, and a killed chromium
        # never removes it: one left behind in /tmp per browser a test opened. Inside the profile it
        # goes with the profile.
        env={**os.environ, "TMPDIR": str(profile)},
        # Its own process group: chromium's helpers (GPU, network, renderers) outlive a kill of the main
        # process and wrote the profile back after it was removed, leaving /tmp/pdk-chromium-* behind.
        start_new_session=True,
    )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (active.exists() and len(active.read_text().splitlines()) >= 2):
            assert process.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(active.read_text().splitlines()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(page_url, max_size=64 << 20, open_timeout=10) as socket:
            page = Page(socket)
            page.call("Page.enable")
            page.call("Network.enable")
            page.call("Runtime.enable")
            page.call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            yield page
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        # Wait for the group's last helpers to be gone before the profile is removed.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(process.pid):
            time.sleep(0.05)
        shutil.rmtree(profile, ignore_errors=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# -- PNG -----------------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails on anything that is not a whole PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.endswith(b"IEND\xaeB`\x82")
    return width, height


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, RGB rows) of an 8-bit RGB or RGBA, non-interlaced PNG (what Pillow and Chromium
    write). Pure Python: fine for the few screenshots a test compares."""
    width, height = png_size(data)
    bit_depth, color_type, _, _, interlace = struct.unpack(">BBBBB", data[24:29])
    assert bit_depth == 8 and color_type in (2, 6) and interlace == 0, (bit_depth, color_type, interlace)
    channels = 3 if color_type == 2 else 4
    idat = bytearray()
    offset = 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        if kind == b"IDAT":
            idat += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    raw = zlib.decompress(bytes(idat))
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                upper_left = previous[i - channels] if i >= channels else 0
                line[i] = (line[i] + _paeth(left, previous[i], upper_left)) & 0xFF
        previous = line
        if channels == 4:
            del line[3::4]
        rows.append(bytes(line))
    return width, height, rows


def thumbnail(data: bytes, columns: int = 32, lines: int = 20) -> list[tuple[int, int, int]]:
    """The PNG averaged down to ``columns`` × ``lines`` cells of mean RGB, for comparing two images of
    the same scene at different sizes."""
    width, height, rows = decode_png(data)
    cells = []
    for cy in range(lines):
        for cx in range(columns):
            total = [0, 0, 0]
            count = 0
            for y in range(cy * height // lines, (cy + 1) * height // lines, 2):
                row = rows[y]
                for x in range(cx * width // columns, (cx + 1) * width // columns, 2):
                    total[0] += row[3 * x]
                    total[1] += row[3 * x + 1]
                    total[2] += row[3 * x + 2]
                    count += 1
            cells.append((total[0] // count, total[1] // count, total[2] // count))
    return cells


def mean_difference(a: list[tuple[int, int, int]], b: list[tuple[int, int, int]]) -> float:
    """Mean absolute difference per channel (0–255) between two thumbnails of the same grid."""
    assert len(a) == len(b)
    return sum(abs(x - y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True)) / (
        3 * len(a)
    )


def loopback_get(url: str, **options: Any) -> httpx.Response:
    """GET an ingress URL (``http://<port>-<id>.sandbox.localhost:<p>/…``) at 127.0.0.1 with its Host, as
    curl and browsers resolve ``*.localhost``."""
    parsed = httpx.URL(url)
    return httpx.get(
        parsed.copy_with(host="127.0.0.1"), headers={"Host": parsed.netloc.decode()}, timeout=30, **options
    )
