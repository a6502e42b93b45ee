"""Seeing a sandbox, on one live platform whose control plane samples metrics every second: its boot log
through ``GET /v1/sandboxes/{id}/logs`` (readable, bounded by ``tail``, bad values a 400 naming the
field), and, in Debian's headless Chromium, the console's audit panel listing a command run through the
API, its logs panel, and its metrics chart drawn from real samples.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.conftest import console_platform
from tests.console.support import open_sandbox, save_screenshot, wait_for
from tests.desktop.browser import Page
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-1gb"


@pytest.fixture(scope="module")
def live(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    # PADDOCK_CP_METRICS_INTERVAL_S (settings.metrics_interval_s): a sample a second, not every 10 s.
    with console_platform(guest_binary_dir, {"PADDOCK_CP_METRICS_INTERVAL_S": "1"}) as platform:
        yield platform


@pytest.fixture(scope="module")
def http(live: LivePlatform, api_key: str) -> Iterator[httpx.Client]:
    with live.http(api_key) as client:
        yield client


@pytest.fixture(scope="module")
def sandbox(http: httpx.Client) -> Iterator[dict[str, Any]]:
    answer = http.post("/v1/sandboxes", json={"shape": SHAPE, "name": f"seen-{secrets.token_hex(3)}"})
    assert answer.status_code == 200, answer.text
    made: dict[str, Any] = answer.json()["data"]
    try:
        yield made
    finally:
        http.delete(f"/v1/sandboxes/{made['id']}")


def test_a_new_sandboxs_boot_log_is_readable_and_bounded(http: httpx.Client, sandbox: dict[str, Any]) -> None:
    sid = sandbox["id"]
    answer = http.get(f"/v1/sandboxes/{sid}/logs", params={"source": "boot", "tail": 50})
    assert answer.status_code == 200, answer.text
    log = answer.json()["data"]
    assert log["sandbox_id"] == sid and log["source"] == "boot"
    # The host agent's own lines say how the boot went, whatever the runtime printed (usually nothing).
    assert any("paddock: starting the sandbox with" in line for line in log["lines"]), log
    assert any("paddock: the guest agent answered; booted in" in line for line in log["lines"]), log
    assert len(log["lines"]) <= 50

    one = http.get(f"/v1/sandboxes/{sid}/logs", params={"tail": 1}).json()["data"]  # source defaults to boot
    assert one["lines"] == log["lines"][-1:] and one["truncated"] is True

    # The sandbox's own writes to its init's stderr after the boot go nowhere on the host.
    run = http.post(
        f"/v1/sandboxes/{sid}/exec",
        json={"cmd": "sh", "args": ["-c", "echo tenant-line >/proc/1/fd/2; true"]},
    )
    assert run.status_code == 200, run.text
    again = http.get(f"/v1/sandboxes/{sid}/logs", params={"tail": 1000}).json()["data"]
    assert not any("tenant-line" in line for line in again["lines"])

    for params, field in (
        ({"tail": 1001}, "tail"),
        ({"tail": 0}, "tail"),
        ({"tail": "many"}, "tail"),
        ({"source": "kernel"}, "source"),
    ):
        bad = http.get(f"/v1/sandboxes/{sid}/logs", params=params)
        assert bad.status_code == 400, (params, bad.text)
        assert field in bad.text, (params, bad.text)

    # A container has no kernel console of its own: the guest source is refused, naming the tier.
    guest = http.get(f"/v1/sandboxes/{sid}/logs", params={"source": "guest"})
    assert guest.status_code == 409, guest.text
    assert "guest console" in guest.text

    other = http.get(f"/v1/sandboxes/sbx-{secrets.token_hex(6)}/logs")
    assert other.status_code == 404, other.text


def test_the_audit_panel_lists_a_command_run_through_the_api_newest_first(
    live: LivePlatform,
    api_key: str,
    http: httpx.Client,
    sandbox: dict[str, Any],
    page: Page,
    screenshots: Path,
) -> None:
    sid, marker = sandbox["id"], secrets.token_hex(4)
    for word in ("first", "second"):
        ran = http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": [f"{word}-{marker}"]})
        assert ran.status_code == 200, ran.text
    open_sandbox(page, live, api_key, sid)
    rows = "[...document.querySelectorAll('#audit-events tr[data-kind]')]"
    wait_for(
        page, f"{rows}.some((r) => r.textContent.includes('echo second-{marker}'))", 30, "the command's event"
    )
    texts: list[str] = page.evaluate(f"{rows}.map((r) => r.textContent)")
    first = next(i for i, t in enumerate(texts) if f"echo first-{marker}" in t)
    second = next(i for i, t in enumerate(texts) if f"echo second-{marker}" in t)
    assert second < first, texts  # newest first
    assert "→ exit 0" in texts[second]
    # The API call that ran it is there too, with its route template.
    assert any("POST /v1/sandboxes/{sandbox_id}/exec → 200" in t for t in texts), texts

    # The kind filter narrows the panel to commands.
    page.evaluate(
        "(() => { const s = document.getElementById('audit-kind'); s.value = 'command';"
        " s.dispatchEvent(new Event('change')); return true; })()"
    )
    wait_for(
        page,
        f"{rows}.length > 0 && {rows}.every((r) => r.dataset.kind === 'command')",
        15,
        "only command events after filtering",
    )
    kinds = page.evaluate(f"{rows}.map((r) => r.dataset.kind)")
    commands = page.evaluate(f"{rows}.map((r) => r.textContent)")
    assert set(kinds) == {"command"} and f"echo second-{marker}" in commands[0], commands

    # The logs panel shows the boot log the route serves.
    wait_for(
        page,
        "document.getElementById('logs-lines').textContent.includes('paddock: the guest agent answered')",
        15,
        "the boot log in the logs panel",
    )
    page.evaluate("document.getElementById('audit').scrollIntoView()")
    save_screenshot(page, screenshots, "audit-panel")


def test_the_metrics_chart_draws_the_sandboxs_real_samples(
    live: LivePlatform,
    api_key: str,
    http: httpx.Client,
    sandbox: dict[str, Any],
    page: Page,
    screenshots: Path,
) -> None:
    sid = sandbox["id"]
    deadline = time.monotonic() + 60
    while True:
        samples = http.get(f"/v1/sandboxes/{sid}/metrics", params={"window_s": 600}).json()["data"]["samples"]
        if len(samples) >= 2:
            break
        assert time.monotonic() < deadline, f"fewer than 2 samples after 60 s at one a second: {samples}"
        time.sleep(0.5)

    open_sandbox(page, live, api_key, sid)
    wait_for(page, "Number(document.getElementById('chart-cpu').dataset.points) >= 2", 30, "two points drawn")
    drawn_at = page.evaluate("JSON.parse(document.getElementById('chart-cpu').dataset.at)")
    drawn = page.evaluate("JSON.parse(document.getElementById('chart-cpu').dataset.values)")
    # Every point drawn is one of the sandbox's samples, with its value (read after the page drew them).
    stored = {
        s["at"]: s["cpu_pct"]
        for s in http.get(f"/v1/sandboxes/{sid}/metrics", params={"window_s": 600}).json()["data"]["samples"]
    }
    assert len(drawn_at) == len(drawn) >= 2
    assert all(at in stored for at in drawn_at), (drawn_at, sorted(stored))
    assert drawn == [stored[at] for at in drawn_at]
    # And the line is on the canvas: pixels in its colour (#2f6fde) inside the plot area.
    blue = page.evaluate(
        """(() => {
          const c = document.getElementById('chart-cpu');
          const px = c.getContext('2d').getImageData(60, 0, c.width - 60, c.height).data;
          let n = 0;
          for (let i = 0; i < px.length; i += 4)
            if (px[i] < 110 && px[i + 1] > 80 && px[i + 1] < 150 && px[i + 2] > 180 && px[i + 3] > 200) n++;
          return n;
        })()"""
    )
    assert blue >= 100, f"only {blue} pixels of the CPU line on the chart"
    page.evaluate("document.getElementById('metrics').scrollIntoView()")
    save_screenshot(page, screenshots, "metrics-chart")
