"""What a sandbox does on one tier it does on the others: a terminal (PTY) process starts and takes
typed input, and a fork keeps the files under ``/tmp`` as it keeps those under ``/root``.

Both failed on the gVisor tier: runsc fails ``TIOCSCTTY`` on a terminal that opening it already made
the session's controlling one (Linux lets that pass), so every PTY process answered 400 ``Invalid
argument``; and runsc mounts a tmpfs inside its sentry at ``/tmp`` unless the spec mounts one, so a
fork's ``/tmp`` came up empty. Run under every tier (``-k gvisor`` for one).

The API's file operations (``/v1`` upload and download through the guest agent's ``stat``/``fstat``, and
the E2B edge's stat and list, ``find -printf`` run through exec) work on gVisor's 2022 sentry, which
refuses only ``statx`` with ``AT_NO_AUTOMOUNT``: ``ls -l`` and ``stat`` inside a Debian 13 sandbox fail
there with "Invalid argument" (docs/isolation.md), and the test says so.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from paddock_controlplane.sandboxes import sandbox_fs
from tests.integration.conftest import platform_tier
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


def test_files_are_written_read_stated_and_listed_through_the_api(
    platform: LivePlatform, api: httpx.Client
) -> None:
    sid = created(api)
    payload = bytes(range(256)) * 40
    for path in ("/tmp/up/deep/a.bin", "/root/up/deep/a.bin"):  # /tmp is a mount of its own on gVisor
        put = api.put(f"/v1/sandboxes/{sid}/files", params={"path": path}, content=payload)
        assert put.status_code == 200, put.text
        got = api.get(f"/v1/sandboxes/{sid}/files", params={"path": path})
        assert got.status_code == 200 and got.content == payload, got.status_code
        # What the E2B edge's Filesystem.Stat and ListDir run in the sandbox, parsed as the edge does.
        stat = edge(api, sid, sandbox_fs.STAT, path, sandbox_fs.PRINTF)
        assert [(e["path"], e["type"], e["size"]) for e in stat] == [(path, "FILE_TYPE_FILE", "10240")]
        top = path.rsplit("/deep/", 1)[0]
        listed = edge(
            api, sid, sandbox_fs.LIST, *sandbox_fs.list_args(top, 2, 65536), read=sandbox_fs.listing
        )
        assert sorted((e["name"], e["type"]) for e in listed) == [
            ("a.bin", "FILE_TYPE_FILE"),
            ("deep", "FILE_TYPE_DIRECTORY"),
        ], listed
        assert {(e["owner"], e["group"]) for e in listed} == {("root", "root")}, listed
    missing = api.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/up/none"})
    assert missing.status_code == 404 and missing.json()["status"] == "fail", missing.text
    # Inside, coreutils' statx is what gVisor's 2022 sentry refuses; elsewhere ls -l works.
    body = {"cmd": "ls", "args": ["-l", "/root/up/deep/a.bin"]}
    ls = data(api.post(f"/v1/sandboxes/{sid}/exec", json=body))["result"]
    if platform_tier(platform) == "gvisor":
        assert ls["exit_code"] != 0 and "Invalid argument" in ls["stderr"], ls
    else:
        assert ls["exit_code"] == 0 and " 10240 " in ls["stdout"], ls


def edge(
    api: httpx.Client,
    sandbox_id: str,
    script: str,
    *args: str,
    read: Callable[[bytes], list[dict[str, Any]]] = sandbox_fs.entries,
) -> list[dict[str, Any]]:
    body = {"cmd": "/bin/sh", "args": ["-c", script, "sh", *args]}
    result = data(api.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body))["result"]
    assert result["exit_code"] == 0, result
    return list(read(result["stdout"].encode("utf-8", "surrogateescape")))


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
