"""The web console in a real headless Chromium (Debian's), against a live platform: sign in with an API
key, create a sandbox and see it running with its metrics chart, type into the in-browser terminal, and
upload a file through the file browser. Each browser test saves a screenshot and checks it has content.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.console.support import (
    click,
    open_sandbox,
    press_enter,
    save_screenshot,
    sign_in,
    type_text,
    wait_for,
)
from tests.desktop.browser import Page
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-1gb"


@pytest.fixture(scope="module")
def sandbox(live: LivePlatform, api_key: str) -> Iterator[dict[str, Any]]:
    """A running sandbox made through the API, for the terminal and file tests."""
    with live.http(api_key) as http:
        answer = http.post("/v1/sandboxes", json={"shape": SHAPE, "name": f"console-{secrets.token_hex(3)}"})
        assert answer.status_code == 200, answer.text
        made = answer.json()["data"]
        try:
            yield made
        finally:
            http.delete(f"/v1/sandboxes/{made['id']}")


def test_the_console_is_served_with_a_strict_content_security_policy(live: LivePlatform) -> None:
    root = httpx.get(live.url + "/", follow_redirects=False, timeout=10)
    assert root.status_code == 307 and root.headers["location"] == "/console"
    page = httpx.get(live.url + "/console", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert "<script>" not in page.text  # no inline script: every script is a file from this origin
    for asset in ("console.js", "vendor/xterm.js", "vendor/addon-fit.js", "vendor/xterm.css"):
        served = httpx.get(f"{live.url}/console/assets/{asset}", timeout=10)
        assert served.status_code == 200, f"{asset}: {served.status_code} (make console-assets)"
    refused = httpx.get(live.url + "/console/assets/../../app.py", timeout=10)
    assert refused.status_code == 404


def test_sign_in_and_create_a_sandbox_and_see_it_running_with_a_chart(
    live: LivePlatform, api_key: str, page: Page, screenshots: Path
) -> None:
    sign_in(page, live, api_key)
    name = f"made-in-browser-{secrets.token_hex(3)}"
    wait_for(page, "document.querySelectorAll('#create-shape option').length > 0", 30, "the shape list")
    assert (
        page.evaluate(
            f"(() => {{ const s = document.getElementById('create-shape'); s.value = '{SHAPE}'; return s.value; }})()"
        )
        == SHAPE
    )
    type_text(page, "#create-name", name)
    type_text(page, "#create-metadata", "team=console")
    click(page, "#create-submit")
    sandbox_id = wait_for(
        page,
        "(() => { const m = location.hash.match(/^#\\/sandboxes\\/(.+)$/); return m ? decodeURIComponent(m[1]) : ''; })()",
        180,
        "the new sandbox's page",
    )
    try:
        wait_for(
            page, "document.querySelector('#sandbox-state [data-state=running]')", 60, "the running state"
        )
        # The chart area is drawn, with either the samples' summary or "no metrics yet" (never an error).
        assert page.evaluate(
            "!!document.getElementById('chart-cpu') && !!document.getElementById('chart-mem')"
        )
        status = wait_for(
            page,
            "(() => { const t = document.getElementById('metrics-status').textContent; return t === 'Loading metrics…' ? '' : t; })()",
            20,
            "the metrics status",
        )
        assert status == "no metrics yet" or status.startswith("CPU "), status
        text = page.evaluate("document.body.innerText")
        assert name in text and "running" in text and "team=console" in text
        save_screenshot(page, screenshots, "created-sandbox")
        with live.http(api_key) as http:
            seen = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]
        assert seen["name"] == name and seen["status"] == "running" and seen["shape"] == SHAPE
        assert seen.get("metadata") == {"team": "console"}
        # The list shows it too, filtered by state.
        page.evaluate("location.hash = '#/sandboxes'")
        wait_for(
            page, f"document.querySelector('#sandboxes tr[data-id=\"{sandbox_id}\"]')", 20, "the list row"
        )
        page.evaluate(
            "(() => { const s = document.getElementById('state-filter'); s.value = 'paused'; s.dispatchEvent(new Event('change')); })()"
        )
        wait_for(
            page, f"!document.querySelector('#sandboxes tr[data-id=\"{sandbox_id}\"]')", 20, "the filter"
        )
    finally:
        with live.http(api_key) as http:
            http.delete(f"/v1/sandboxes/{sandbox_id}")


def test_echo_hi_in_the_browser_terminal(
    live: LivePlatform, api_key: str, sandbox: dict[str, Any], page: Page, screenshots: Path
) -> None:
    open_sandbox(page, live, api_key, sandbox["id"])
    wait_for(
        page, "document.getElementById('terminal-status').textContent === 'connected'", 30, "the terminal"
    )
    rows = "[...document.querySelectorAll('#terminal .xterm-rows > div')].map(d => d.textContent.trim())"
    wait_for(page, f"{rows}.some(r => /[#$] *$/.test(r))", 30, "the shell prompt")
    type_text(page, "#terminal .xterm-helper-textarea", "echo hi")
    press_enter(page)
    wait_for(page, f"{rows}.includes('hi')", 30, "'hi' on its own line in the terminal")
    shown = page.evaluate(rows)
    assert any(r.endswith("echo hi") for r in shown), shown  # the typed command echoed by the shell
    page.evaluate("document.getElementById('terminal').scrollIntoView()")
    save_screenshot(page, screenshots, "terminal-echo-hi")


def test_upload_a_file_and_see_it_listed(
    live: LivePlatform, api_key: str, sandbox: dict[str, Any], page: Page, screenshots: Path, tmp_path: Path
) -> None:
    name = f"from-browser-{secrets.token_hex(3)}.txt"
    local = tmp_path / name
    content = f"uploaded through the console {secrets.token_hex(8)}\n".encode()
    local.write_bytes(content)
    open_sandbox(page, live, api_key, sandbox["id"])
    wait_for(page, "document.querySelector('#file-list tbody tr')", 30, "the /tmp listing")
    document = page.call("DOM.getDocument")
    picker = page.call("DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#upload-file")
    page.call("DOM.setFileInputFiles", files=[str(local)], nodeId=picker["nodeId"])
    click(page, "#upload")
    wait_for(
        page, f"document.querySelector('#file-list tr[data-name=\"{name}\"]')", 30, "the uploaded file's row"
    )
    row = page.evaluate(f"document.querySelector('#file-list tr[data-name=\"{name}\"]').innerText")
    assert f"{len(content)} B" in row, row
    assert page.evaluate("document.getElementById('files-status').textContent") == f"uploaded {name}"
    page.evaluate("document.getElementById('files').scrollIntoView()")
    save_screenshot(page, screenshots, "file-uploaded")
    with live.http(api_key) as http:
        stored = http.get(f"/v1/sandboxes/{sandbox['id']}/files", params={"path": f"/tmp/{name}"})
    assert stored.status_code == 200 and stored.content == content


def test_the_terminal_socket_refuses_a_wrong_key_another_origin_and_a_silent_client(
    live: LivePlatform, sandbox: dict[str, Any]
) -> None:
    """The browser's socket takes the key in its first message; what a wrong one, another site's page
    or a client that never sends it gets is an error frame and a 44xx close, never a shell."""
    url = live.url.replace("http://", "ws://") + f"/console/shell-ws/{sandbox['id']}"
    host = live.url.removeprefix("http://")
    with connect(url, additional_headers={"Origin": f"http://{host}"}, open_timeout=10) as socket:
        socket.send(json.dumps({"type": "auth", "api_key": "pdk_not-a-real-key"}))
        frame = json.loads(socket.recv(timeout=10))
        assert frame["type"] == "error" and frame["status"] == 401, frame
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    with pytest.raises(InvalidStatus) as refused:  # before the upgrade: a page on another site
        connect(url, additional_headers={"Origin": "http://evil.example"}, open_timeout=10)
    assert refused.value.response.status_code == 403
    with connect(url, open_timeout=10) as socket:
        socket.send(b"ls\n")  # keystrokes before any auth message
        frame = json.loads(socket.recv(timeout=10))
        assert frame["type"] == "error" and frame["status"] == 400, frame


def test_the_account_pages_show_usage_hosts_networks_and_webhooks(
    live: LivePlatform, api_key: str, page: Page, screenshots: Path
) -> None:
    network_name = f"console-net-{secrets.token_hex(3)}"
    hook_url = f"http://127.0.0.1:9/console-hook-{secrets.token_hex(3)}"
    with live.http(api_key) as http:
        me = http.get("/v1/whoami").json()["data"]
        host_ids = [h["id"] for h in http.get("/v1/hosts").json()["data"]["data"]]
        network = http.post("/v1/networks", json={"name": network_name})
        assert network.status_code == 200, network.text
        hook = http.post("/v1/webhook-endpoints", json={"url": hook_url, "events": ["sandbox.create"]})
        assert hook.status_code == 200, hook.text
        hook_id = hook.json()["data"]["id"]
    try:
        sign_in(page, live, api_key)
        page.evaluate("location.hash = '#/usage'")
        usage = wait_for(
            page,
            "(() => { const u = document.getElementById('usage'); return u && u.innerText.includes('Credits left') ? u.innerText : ''; })()",
            20,
            "the usage page",
        )
        assert me["user_id"] in usage and "Credits spent" in usage, usage
        page.evaluate("location.hash = '#/hosts'")
        hosts = wait_for(
            page,
            "document.querySelector('#list tbody').innerText.includes('active') && document.querySelector('#list tbody').innerText",
            20,
            "the hosts",
        )
        assert host_ids and all(host_id in hosts for host_id in host_ids), hosts
        page.evaluate("location.hash = '#/networks'")
        wait_for(
            page,
            f"document.querySelector('#list tbody').innerText.includes('{network_name}')",
            20,
            "the network",
        )
        page.evaluate("location.hash = '#/webhooks'")
        wait_for(
            page,
            f"document.querySelector('#list tbody').innerText.includes('{hook_url}')",
            20,
            "the endpoint",
        )
        click(page, f"#list a[href='#/webhooks/{hook_id}']")
        detail = wait_for(
            page,
            "(() => { const t = document.getElementById('view').innerText; return t.includes('sandbox.create') && t.includes('Recent deliveries') ? t : ''; })()",
            20,
            "the endpoint's page",
        )
        assert hook_url in detail and "secret" not in detail.lower(), detail
        save_screenshot(page, screenshots, "webhook-endpoint")
    finally:
        with live.http(api_key) as http:
            http.delete(f"/v1/webhook-endpoints/{hook_id}")
            http.delete(f"/v1/networks/{network.json()['data']['id']}")


def metrics_answer(sandbox_id: str) -> dict[str, Any]:
    """A metrics answer in the contract's shape (the route's JSend data), rising CPU and memory."""
    samples = [
        {
            "at": f"2026-01-01T00:{minute:02d}:00Z",
            "cpu_pct": 10.0 * (minute + 1),
            "mem_used_bytes": (100 + 40 * minute) << 20,
            "mem_limit_bytes": 1 << 30,
            "disk_used_bytes": 300 << 20,
            "disk_limit_bytes": 10 << 30,
            "net_rx_bytes": 2048 * minute,
            "net_tx_bytes": 1024 * minute,
        }
        for minute in range(9)
    ]
    data = {"sandbox_id": sandbox_id, "interval_s": 60, "latest": samples[-1], "samples": samples}
    return {"status": "success", "data": data}


def test_the_chart_draws_the_metrics_routes_samples(
    live: LivePlatform, api_key: str, sandbox: dict[str, Any], page: Page, screenshots: Path
) -> None:
    """The chart against an answer in the metrics route's contract shape, served to the page by the
    browser itself (CDP's Fetch domain) as a seam: the route is another change's; the chart's
    "no metrics yet" against the real control plane is in the creation test above."""
    body = base64.b64encode(json.dumps(metrics_answer(sandbox["id"])).encode()).decode()
    page.call("Fetch.enable", patterns=[{"urlPattern": "*/metrics?window_s=*", "requestStage": "Request"}])
    served: set[str] = set()

    def serve_paused() -> None:
        for event in list(page.events):
            if event.get("method") != "Fetch.requestPaused":
                continue
            request_id = event["params"]["requestId"]
            if request_id in served:
                continue
            served.add(request_id)
            page.call(
                "Fetch.fulfillRequest",
                requestId=request_id,
                responseCode=200,
                responseHeaders=[{"name": "Content-Type", "value": "application/json"}],
                body=body,
            )

    open_sandbox(page, live, api_key, sandbox["id"])
    deadline = time.monotonic() + 30
    status = ""
    while not status.startswith("CPU 90.0%") and time.monotonic() < deadline:
        serve_paused()
        status = page.evaluate("document.getElementById('metrics-status').textContent")
        time.sleep(0.2)
    assert status.startswith("CPU 90.0% · memory 420.0 MiB of 1.0 GiB"), status
    assert served, "the page asked for no metrics"
    # The lines are drawn: the CPU line in the chart's blue, the memory limit in red.
    coloured = """(id, r, g, b) => { const c = document.getElementById(id); const d = c.getContext('2d')
        .getImageData(0, 0, c.width, c.height).data; let n = 0;
        for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i] - r) < 40 && Math.abs(d[i + 1] - g) < 40
          && Math.abs(d[i + 2] - b) < 40 && d[i + 3] > 200) n++; return n; }"""
    assert page.evaluate(f"({coloured})('chart-cpu', 47, 111, 222)") > 200
    assert page.evaluate(f"({coloured})('chart-mem', 47, 111, 222)") > 200
    assert page.evaluate(f"({coloured})('chart-mem', 192, 57, 43)") > 100
    page.evaluate("document.getElementById('metrics').scrollIntoView()")
    save_screenshot(page, screenshots, "metrics-chart")
