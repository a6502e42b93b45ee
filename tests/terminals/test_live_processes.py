"""Managed processes through the public API of a live platform, in the reference client's call shapes.

The Python reference client sends ``POST /processes {cmd, args, cwd, env, pty: {rows, cols}}``, reads
``connect?after=N`` as NDJSON with base64 data, and long-polls ``wait?scope=…&timeout_ms=…``.
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


@pytest.fixture(scope="module")
def api(live: LivePlatform) -> Iterator[httpx.Client]:
    with live.http(live.api_key(), timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sid(api: httpx.Client) -> Iterator[str]:
    created = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "debian:13"})
    assert created.status_code == 200, created.text
    sandbox_id = str(created.json()["data"]["id"])
    try:
        yield sandbox_id
    finally:
        api.delete(f"/v1/sandboxes/{sandbox_id}")


def data(resp: httpx.Response) -> Any:
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


def read_until(
    api: httpx.Client, url: str, needle: bytes, after: int = 0
) -> tuple[bytes, list[dict[str, Any]]]:
    """Connects, collects frames until ``needle`` shows up, then goes away (the process stays)."""
    seen, frames = b"", []
    deadline = time.monotonic() + 15
    with api.stream("GET", f"{url}/connect", params={"after": after}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            frame = json.loads(line)
            frames.append(frame)
            if frame["type"] == "data":
                seen += base64.b64decode(frame["data_base64"], validate=True)
                if needle in seen:
                    return seen, frames
            if frame["type"] == "exit" or time.monotonic() > deadline:
                break
    raise AssertionError(f"{needle!r} not in {seen!r}")


def test_a_pty_bash_takes_typed_input_and_resizes(api: httpx.Client, sid: str) -> None:
    proc = data(
        api.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "bash", "pty": {"rows": 24, "cols": 80}})
    )
    assert proc["kind"] == "pty" and proc["state"] == "running"
    url = f"/v1/sandboxes/{sid}/processes/{proc['process_id']}"
    typed = base64.b64encode(b"stty size; echo done-$((40+2))\n").decode()
    assert isinstance(data(api.post(f"{url}/input", json={"data_base64": typed}))["input_seq"], int)
    seen, _ = read_until(api, url, b"done-42")
    assert b"24 80" in seen
    resized = data(api.post(f"{url}/resize", json={"rows": 33, "cols": 111}))
    api.post(f"{url}/input", json={"data_base64": base64.b64encode(b"stty size\n").decode()})
    seen, _ = read_until(api, url, b"33 111", after=resized["output"]["newest_seq"])
    api.post(f"{url}/input", json={"data_base64": base64.b64encode(b"exit 9\n").decode()})
    done = data(api.get(f"{url}/wait", params={"scope": "leader", "timeout_ms": 10000}))
    assert done["state"] == "exited" and done["exit_code"] == 9 and done["leader_exited"] is True


def test_a_server_is_reconnected_to_and_its_earlier_output_replayed(api: httpx.Client, sid: str) -> None:
    script = 'echo "listening on :8000"; i=0; while sleep 0.1; do i=$((i+1)); echo "request $i"; done'
    proc = data(api.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "bash", "args": ["-c", script]}))
    url = f"/v1/sandboxes/{sid}/processes/{proc['process_id']}"
    first, frames = read_until(api, url, b"request 3")  # a client that then goes away
    assert first.startswith(b"listening on :8000\n")
    time.sleep(0.5)
    assert data(api.get(url))["state"] == "running"  # leaving did not kill it
    replayed, _ = read_until(api, url, b"request 6")  # a new client, from the start
    assert replayed.startswith(b"listening on :8000\nrequest 1\n")
    last_seq = max(frame["seq"] for frame in frames if frame["type"] == "data")
    later, later_frames = read_until(api, url, b"request", after=last_seq)
    assert later_frames[0]["seq"] == last_seq + 1 and not later.startswith(b"listening")
    listed = data(api.get(f"/v1/sandboxes/{sid}/processes"))["processes"]
    assert proc["process_id"] in [p["process_id"] for p in listed]
    killed = data(api.delete(url, params={"grace_ms": 2000}))
    assert killed["state"] in ("terminating", "exited")
    done = data(api.get(f"{url}/wait", params={"scope": "tree", "timeout_ms": 10000}))
    assert done["tree_exited"] is True and done["signal"] == "SIGTERM"


def test_wait_returns_the_exit_code_and_signals_work(api: httpx.Client, sid: str) -> None:
    base = f"/v1/sandboxes/{sid}/processes"
    quick = data(api.post(base, json={"cmd": "bash", "args": ["-c", "echo hi; exit 3"], "cwd": "/tmp"}))
    done = data(api.get(f"{base}/{quick['process_id']}/wait", params={"timeout_ms": 10000}))
    assert done["exit_code"] == 3 and done["cwd"] == "/tmp"
    with api.stream("GET", f"{base}/{quick['process_id']}/connect") as resp:
        frames = [json.loads(line) for line in resp.iter_lines()]
    assert [f["type"] for f in frames] == ["data", "exit"] and frames[-1]["exit_code"] == 3
    sleeper = data(api.post(base, json={"cmd": "sleep", "args": ["300"]}))
    url = f"{base}/{sleeper['process_id']}"
    still = data(api.get(f"{url}/wait", params={"timeout_ms": 200}))
    assert still["state"] == "running"
    data(api.post(f"{url}/signal", json={"signal": "SIGINT"}))
    done = data(api.get(f"{url}/wait", params={"timeout_ms": 10000}))
    assert done["signal"] == "SIGINT" and done["exit_code"] == 130
    cat = data(api.post(base, json={"cmd": "cat"}))
    url = f"{base}/{cat['process_id']}"
    data(api.post(f"{url}/input", json={"data_base64": base64.b64encode(b"echoed\n").decode()}))
    assert data(api.post(f"{url}/stdin/close")) == {"ok": True}
    assert data(api.get(f"{url}/wait", params={"timeout_ms": 10000}))["exit_code"] == 0
    assert api.get(f"{base}/proc_0000000000000000").status_code == 404
    assert api.post(f"{url}/resize", json={"rows": 5}).status_code == 409
    missing = api.post(base, json={"cmd": "no-such-binary"})
    assert missing.status_code == 400 and "no-such-binary" in missing.text
