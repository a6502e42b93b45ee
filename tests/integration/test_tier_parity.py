"""What a sandbox does on one tier it does on the others: a terminal (PTY) process starts and takes
typed input, and a fork keeps the files under ``/tmp`` as it keeps those under ``/root``.

Both failed on the gVisor tier: runsc fails ``TIOCSCTTY`` on a terminal that opening it already made
the session's controlling one (Linux lets that pass), so every PTY process answered 400 ``Invalid
argument``; and runsc mounts a tmpfs inside its sentry at ``/tmp`` unless the spec mounts one, so a
fork's ``/tmp`` came up empty. Run under every tier (``-k gvisor`` for one).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.live import LivePlatform

pytestmark = pytest.mark.root

BODY = {"shape": "s-1vcpu-256mb", "disk_mib": 2048}


@pytest.fixture
def api(platform: LivePlatform) -> Iterator[httpx.Client]:
    with platform.http(platform.api_key(), timeout=60) as client:
        made: list[str] = []
        client.made = made  # type: ignore[attr-defined]
        try:
            yield client
        finally:
            for sandbox_id in made:
                client.delete(f"/v1/sandboxes/{sandbox_id}")


def data(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()["data"]


def created(api: httpx.Client) -> str:
    sandbox = data(api.post("/v1/sandboxes", json=BODY))
    api.made.append(sandbox["id"])  # type: ignore[attr-defined]
    assert sandbox["status"] == "running", sandbox
    return str(sandbox["id"])


def sh(api: httpx.Client, sandbox_id: str, script: str) -> str:
    body = {"cmd": "bash", "args": ["-c", script]}
    result = data(api.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body))["result"]
    assert result["exit_code"] == 0, result
    return str(result["stdout"])


def test_a_pty_process_starts_and_takes_typed_input(api: httpx.Client) -> None:
    sid = created(api)
    for cmd in ("bash", "sh"):
        started = api.post(
            f"/v1/sandboxes/{sid}/processes", json={"cmd": cmd, "pty": {"rows": 24, "cols": 80}}
        )
        proc = data(started)
        assert proc["kind"] == "pty" and proc["state"] == "running", proc
        url = f"/v1/sandboxes/{sid}/processes/{proc['process_id']}"
        typed = base64.b64encode(b"tty; stty size; echo done-$((40+2))\n").decode()
        data(api.post(f"{url}/input", json={"data_base64": typed}))
        seen = read_until(api, url, b"done-42")
        assert b"/dev/pts/" in seen and b"24 80" in seen, seen
        data(api.post(f"{url}/input", json={"data_base64": base64.b64encode(b"exit 7\n").decode()}))
        done = data(api.get(f"{url}/wait", params={"scope": "leader", "timeout_ms": 10000}))
        assert done["state"] == "exited" and done["exit_code"] == 7, done


def test_a_fork_keeps_the_files_under_tmp(api: httpx.Client) -> None:
    sid = created(api)
    sh(api, sid, "echo kept-tmp > /tmp/k; mkdir -p /tmp/d; echo deep > /tmp/d/f; echo kept-root > /root/k")
    # bash's own test (stat(2)): coreutils' statx fails on gVisor's 2022 build (docs/isolation.md).
    assert sh(api, sid, "[ -d /tmp ] && [ -k /tmp ] && [ -w /tmp ] && echo sticky").strip() == "sticky"
    child = data(api.post(f"/v1/sandboxes/{sid}/fork"))
    api.made.append(child["id"])  # type: ignore[attr-defined]
    child = wait_running(api, child["id"])
    assert sh(api, child["id"], "cat /tmp/k /tmp/d/f /root/k").split() == ["kept-tmp", "deep", "kept-root"]
    # The fork's /tmp is its own: a write there does not reach its source's.
    sh(api, child["id"], "echo child > /tmp/k")
    assert sh(api, sid, "cat /tmp/k").strip() == "kept-tmp"


def wait_running(api: httpx.Client, sandbox_id: str) -> dict[str, Any]:
    sandbox = data(api.get(f"/v1/sandboxes/{sandbox_id}", params={"wait_for": "running", "wait_ms": 30000}))
    assert sandbox["status"] == "running", sandbox
    return dict(sandbox)


def read_until(api: httpx.Client, url: str, needle: bytes) -> bytes:
    seen = b""
    deadline = time.monotonic() + 20
    with api.stream("GET", f"{url}/connect") as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            frame = json.loads(line)
            if frame["type"] == "data":
                seen += base64.b64decode(frame["data_base64"], validate=True)
                if needle in seen:
                    return seen
            if frame["type"] == "exit" or time.monotonic() > deadline:
                break
    raise AssertionError(f"{needle!r} not in {seen!r}")
