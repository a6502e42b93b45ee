"""Probes at the template builder itself (issue #29): not what a RUN step can do (tests/templates/
test_build_isolation.py), but what buildah does *for* a Dockerfile, which the control plane's Dockerfile
check cannot hold, since buildah parses the file its own way (``# escape=`` is a directive to buildah and
a comment to the check; ``ADD ${U}`` hides its URL behind an ARG).

- ``ADD <url>`` is fetched from the build's network namespace, under its guard: it reaches no listener
  of the host, on the host's address or on loopback;
- ``COPY --from=<image id prefix>`` finds no other account's image (each account's builder storage is
  its own);
- a RUN step sees its builder filesystem's size as its disk and gets ENOSPC past it;
- a failed or cancelled build leaves no mount and no loop device on the host;
- a build that prints without end keeps the head and tail of its log and says how much was cut.

Every target is a listener or directory these tests own; the platform runs with a 2 GiB builder
filesystem per account (``PADDOCK_CP_TEMPLATE_BUILD_DISK_MIB``).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_hostagent.images import slug
from tests.hostagent.conftest import guest_binary_dir, image_cache
from tests.live import LivePlatform, start_platform
from tests.security.network_support import HostListener
from tests.security.test_network_probes import listeners
from tests.templates.test_live_templates import frames_of, wait_done
from tests.templates.test_templates_api import tar_b64

__all__ = ["guest_binary_dir", "listeners"]

# serial: the host's free space on / and every loop device are read (scripts/run-tests.sh).
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.serial]

DISK_MIB = 2048


@pytest.fixture(scope="module")
def live(guest_binary_dir: Path) -> Iterator[LivePlatform]:
    platform = start_platform(guest_binary_dir, cp_env={"PADDOCK_CP_TEMPLATE_BUILD_DISK_MIB": str(DISK_MIB)})
    try:
        yield platform
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def http(live: LivePlatform) -> Iterator[httpx.Client]:
    with live.http(live.api_key("pro"), timeout=600) as client:
        yield client


def submit(http: httpx.Client, name: str, dockerfile: str, **extra: Any) -> str:
    created = http.post("/v1/templates", json={"name": name, "dockerfile": dockerfile, **extra})
    assert created.status_code == 200, created.text  # the control plane's check let it through
    return str(created.json()["data"]["id"])


def log_lines(http: httpx.Client, template_id: str) -> list[str]:
    text = http.get(f"/v1/templates/{template_id}/logs").text
    return [frame.get("line", "") for frame in frames_of(text)]


def builder_mounts(live: LivePlatform) -> list[str]:
    """Mounts and loop devices of the agent's builder (its state dir's ``buildah``)."""
    root = str(live.agents[0].state_dir / "buildah")
    with open("/proc/self/mountinfo") as mountinfo:
        found = [line.split()[4] for line in mountinfo if line.split()[4].startswith(root)]
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    return found + [line for line in loops.splitlines() if root in line]


def test_add_urls_hidden_from_the_check_reach_no_host_listener(
    http: httpx.Client, listeners: dict[str, HostListener]
) -> None:
    """``ADD`` hidden by ``# escape=`` (to the host's address) and by an ARG (to loopback): buildah fetched
    them on the host's network; now from the build's namespace, where the guard refuses the host and
    127.0.0.1 is the namespace's own."""
    host_ip = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()[0]
    port = listeners["any4"].port
    escaped = f"# escape=`\nFROM debian:13\nRUN true #\\\nADD http://{host_ip}:{port}/healthz /fetched\n"
    by_arg = f"FROM debian:13\nARG U=http://127.0.0.1:{port}/readyz\nADD ${{U}} /fetched\n"
    ids = [
        submit(http, "add-escaped", escaped),
        submit(http, "add-arg", by_arg, context=tar_b64({"unused.txt": b"x"})),
    ]
    try:
        statuses = {template_id: wait_done(http, template_id)["status"] for template_id in ids}
        assert {name: item.accepted for name, item in listeners.items()} == {name: [] for name in listeners}
        assert set(statuses.values()) == {"failed"}, [log_lines(http, template_id) for template_id in ids]
    finally:
        for template_id in ids:
            http.delete(f"/v1/templates/{template_id}")


def test_copy_from_an_image_id_prefix_finds_no_other_accounts_image(
    http: httpx.Client, live: LivePlatform
) -> None:
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    victim = submit(http, "victim", f"FROM debian:13\nRUN echo {secret} > /secret.txt\n")
    try:
        assert wait_done(http, victim)["status"] == "ready"
        meta = json.loads((image_cache() / slug(victim) / "image.json").read_text())
        prefix = meta["image_id"].removeprefix("sha256:")[:12]
        with live.http(live.api_key("pro"), timeout=600) as thief:
            stolen = (
                f"# escape=`\nFROM debian:13\nRUN true #\\\nCOPY --from={prefix} /secret.txt /stolen.txt\n"
                "RUN cat /stolen.txt\n"
            )
            thief_id = submit(thief, "thief", stolen)
            try:
                done = wait_done(thief, thief_id)
                lines = log_lines(thief, thief_id)
                assert not any(secret in line for line in lines), lines
                assert done["status"] == "failed", lines
            finally:
                thief.delete(f"/v1/templates/{thief_id}")
    finally:
        http.delete(f"/v1/templates/{victim}")


def test_a_run_step_sees_its_capped_disk_and_gets_enospc_past_it(
    http: httpx.Client, live: LivePlatform
) -> None:
    host_free_before = _host_free_bytes()
    script = (
        'df -B1M --output=size / | tail -1 | sed "s/^ */disk_mib=/"; '
        f'fallocate -l {DISK_MIB + 1024}M /big 2>&1; echo "fallocate=$?"; rm -f /big'
    )
    template_id = submit(http, "filler", f"FROM debian:13\nRUN {script}\n")
    try:
        assert wait_done(http, template_id)["status"] == "ready"
        lines = log_lines(http, template_id)
        found = dict(line.split("=", 1) for line in lines if line.startswith(("disk_mib=", "fallocate=")))
        assert 0 < int(found["disk_mib"]) <= DISK_MIB, lines
        assert found["fallocate"] != "0" and any("No space left" in line for line in lines), lines
        assert _host_free_bytes() > host_free_before - 1024 * 1024 * 1024
    finally:
        http.delete(f"/v1/templates/{template_id}")


def _host_free_bytes() -> int:
    stats = os.statvfs("/")
    return int(stats.f_bavail * stats.f_frsize)


def test_failed_and_cancelled_builds_leave_no_mount_or_loop_device(
    http: httpx.Client, live: LivePlatform
) -> None:
    failed = submit(http, "fails", "FROM debian:13\nRUN echo partial > /p && false\n")
    running = submit(http, "cancelled", "FROM debian:13\nRUN echo started-sleeping && sleep 600\n")
    try:
        assert wait_done(http, failed)["status"] == "failed"
        deadline = time.monotonic() + 300
        while not any("started-sleeping" in line for line in log_lines(http, running)):
            assert time.monotonic() < deadline, log_lines(http, running)
            time.sleep(0.5)
    finally:
        http.delete(f"/v1/templates/{failed}")
        http.delete(f"/v1/templates/{running}")
    deadline = time.monotonic() + 60
    while builder_mounts(live):
        assert time.monotonic() < deadline, builder_mounts(live)
        time.sleep(0.5)


def test_an_endless_build_log_keeps_its_head_and_tail(http: httpx.Client) -> None:
    template_id = submit(http, "chatty", "FROM debian:13\nRUN seq 1 200000\n")
    try:
        assert wait_done(http, template_id)["status"] == "ready"
        lines = log_lines(http, template_id)
        assert len(lines) < 3200, len(lines)
        assert "1" in lines and "200000" in lines, lines[-20:]
        assert any(line.startswith("[log cut: ") for line in lines), lines[-20:]
    finally:
        http.delete(f"/v1/templates/{template_id}")
