"""The unmodified ``e2b-desktop`` SDK's stream, ``launch`` and ``open`` on Paddock's ``desktop:1``,
configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.

``stream.start()`` runs the SDK's own commands in the sandbox: ``x11vnc`` on the SDK's display and
``/opt/noVNC/utils/novnc_proxy`` (the image links Debian's noVNC there), waiting for its port with
``netstat``. ``get_url()`` is ``https://<port>-<sandbox id>.<domain>/vnc.html?…``, the ingress's name
for that port. The test opens exactly that host, path and query on the ingress's listener at 127.0.0.1
(the test platform's ingress speaks plain HTTP; ``paddock serve`` serves the same names over HTTPS):

- the desktop is made with E2B's public traffic (``network={"allow_public_traffic": True}``), so its
  6080, where the SDK's stream always is, serves as an ordinary ingress port: the page loads, and
  noVNC's WebSocket reaches the VNC server, which asks for the password ``require_auth`` set;
- a desktop made through ``/v1`` keeps 6080-6087 its live view's: 401 ``LIVE_VIEW_TOKEN_REQUIRED``
  without a live-view link, ingress on or not (docs/e2b.md, docs/security.md);
- on another port the same holds.

Fails on the image before it held /opt/noVNC (``start`` timed out: "Could not start noVNC server") and
gtk-launch (no window)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from e2b_desktop import Sandbox
from websockets.sync.client import connect as websocket_connect
from websockets.typing import Subprotocol

from e2b import CommandExitException
from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import E2bPlatform
from tests.hostagent.conftest import image_cache

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def desktop_image() -> Path:
    return ImageStore(image_cache()).build("desktop:1")  # rebuilt when its recipe changed


@pytest.fixture(scope="module")
def desktop(desktop_image: Path, e2b_env: E2bPlatform) -> Iterator[Sandbox]:
    made = Sandbox.create(timeout=600, network={"allow_public_traffic": True})
    try:
        yield made
    finally:
        made.kill()


def through_ingress(url: str) -> httpx.Response:
    """GET of the SDK's URL: its host, path and query, sent to the ingress's listener on 127.0.0.1."""
    parts = urlsplit(url)
    assert parts.port is not None, url  # the test platform's ingress is on a port of its own
    target = f"http://127.0.0.1:{parts.port}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    return httpx.get(target, headers={"Host": parts.netloc}, timeout=30)


def rfb_hello(url: str) -> tuple[bytes, bytes]:
    """Opens noVNC's WebSocket (``websockify`` beside the page, as vnc.html does) through the ingress and
    answers the VNC server's version: (the server's version line, the security types it offers)."""
    parts = urlsplit(url)
    assert parts.port is not None, url
    sock = socket.create_connection(("127.0.0.1", parts.port), timeout=30)
    with websocket_connect(
        f"ws://{parts.netloc}/websockify", sock=sock, subprotocols=[Subprotocol("binary")], open_timeout=30
    ) as ws:
        version = ws.recv(timeout=30)
        ws.send(b"RFB 003.008\n")
        types = ws.recv(timeout=30)
    assert isinstance(version, bytes) and isinstance(types, bytes), (version, types)
    return version, types


def windows_of(desktop: Sandbox, application: str, timeout_s: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            windows = [w for w in desktop.get_application_windows(application) if w]
        except CommandExitException:  # xdotool search exits 1 until a window is there
            windows = []
        if windows:
            return windows
        time.sleep(0.5)
    raise AssertionError(f"no {application} window appeared within {timeout_s:.0f} s")


def test_the_default_stream_opens_through_the_ingress_with_its_password(
    desktop: Sandbox, e2b_env: E2bPlatform
) -> None:
    desktop.stream.start(require_auth=True)
    try:
        assert desktop.commands.run("pgrep -x x11vnc").exit_code == 0
        key = desktop.stream.get_auth_key()
        url = desktop.stream.get_url(auth_key=key)
        parts = urlsplit(url)
        assert parts.scheme == "https" and parts.hostname == f"6080-{desktop.sandbox_id}.sandbox.localhost"
        assert parts.path == "/vnc.html"

        page = through_ingress(url)
        assert page.status_code == 200, page.text[:300]
        assert 'class="noVNC_loading"' in page.text, page.text[:300]
        version, types = rfb_hello(url)
        assert version.startswith(b"RFB 003."), version
        assert 2 in types[1:], types  # VNC authentication: the password the SDK set is asked for

        # the edge serves the same port by the same rule
        edge = {"E2b-Sandbox-Id": desktop.sandbox_id, "E2b-Sandbox-Port": "6080"}
        served = httpx.get(f"{e2b_env.sandbox_url}/vnc.html", headers=edge, timeout=30)
        assert served.status_code == 200 and "noVNC" in served.text, served.text[:300]
    finally:
        desktop.stream.stop()
    assert desktop.commands.run("pgrep -x x11vnc || true").stdout.strip() == ""


def test_a_native_desktops_live_view_port_still_wants_its_token(
    desktop_image: Path, e2b_env: E2bPlatform
) -> None:
    with e2b_env.platform.http(e2b_env.api_key) as api:
        made = api.post(
            "/v1/sandboxes", json={"shape": "s-2vcpu-2gb", "rootfs": "desktop:1", "ingress_enabled": True}
        )
        assert made.status_code == 200, made.text
        sandbox_id = made.json()["data"]["id"]
        try:
            with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as e2b_api:
                domain = e2b_api.get(f"/sandboxes/{sandbox_id}").json()["domain"]  # what the SDK would get
            url = f"https://6080-{sandbox_id}.{domain}/vnc.html"
            refused = through_ingress(url)
            assert refused.status_code == 401, refused.text
            assert refused.headers["x-paddock-ingress-error"] == "LIVE_VIEW_TOKEN_REQUIRED"
            edge = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "6080"}
            refused = httpx.get(f"{e2b_env.sandbox_url}/vnc.html", headers=edge, timeout=30)
            assert refused.status_code == 403, refused.text
            assert "live-view ports (6080-6087)" in refused.json()["message"], refused.text
        finally:
            api.delete(f"/v1/sandboxes/{sandbox_id}")


def test_a_stream_with_a_password_on_another_port_opens_through_the_ingress(
    desktop: Sandbox, e2b_env: E2bPlatform
) -> None:
    desktop.stream.start(port=6200, require_auth=True)
    try:
        key = desktop.stream.get_auth_key()
        url = desktop.stream.get_url(auth_key=key)
        assert urlsplit(url).hostname == f"6200-{desktop.sandbox_id}.sandbox.localhost"
        page = through_ingress(url)
        assert page.status_code == 200, page.text[:300]
        assert 'class="noVNC_loading"' in page.text, page.text[:300]
        script = through_ingress(url.replace("/vnc.html?", "/app/ui.js?"))  # what the page loads next
        assert script.status_code == 200 and "export default UI" in script.text, script.text[-300:]
        version, types = rfb_hello(url)
        assert version.startswith(b"RFB 003."), version
        assert 2 in types[1:], types  # VNC authentication: the password the SDK set is asked for
    finally:
        desktop.stream.stop()


def titles_of(desktop: Sandbox, application: str, wanted: str, timeout_s: float = 60) -> list[str]:
    """The titles of ``application``'s windows once one of them holds ``wanted`` (or the last seen)."""
    deadline = time.monotonic() + timeout_s
    titles: list[str] = []
    while time.monotonic() < deadline:
        titles = [desktop.get_window_title(w) for w in windows_of(desktop, application, timeout_s)]
        if any(wanted in title for title in titles):
            break
        time.sleep(0.5)
    return titles


def test_launch_and_open_bring_up_windows(desktop: Sandbox) -> None:
    desktop.files.write("/tmp/site/index.html", "<title>first page</title><h1>first</h1>")
    desktop.files.write("/tmp/site/second.html", "<title>second page</title><h1>second</h1>")
    desktop.commands.run(
        "cd /tmp/site && python3 -m http.server 8000", background=True, timeout=0
    ).disconnect()
    assert desktop._wait_and_verify("netstat -tln | grep -q ':8000 '", lambda r: r.exit_code == 0)

    # launch: gtk-launch takes the application's desktop file name, and the URI; Chromium runs as root
    # (the image gives it --no-sandbox)
    desktop.launch("chromium", "http://127.0.0.1:8000/")
    titles = titles_of(desktop, "chromium", "first page")
    assert any("first page" in title for title in titles), titles

    # open: a URL goes to the browser (the running Chromium takes it), a text file to Mousepad
    desktop.open("http://127.0.0.1:8000/second.html")
    titles = titles_of(desktop, "chromium", "second page")
    assert any("second page" in title for title in titles), titles
    desktop.files.write("/tmp/opened-by-e2b.txt", "opened by xdg-open\n")
    desktop.open("/tmp/opened-by-e2b.txt")
    titles = titles_of(desktop, "mousepad", "opened-by-e2b.txt")
    assert any("opened-by-e2b.txt" in title for title in titles), titles
