"""The audit trail of a real sandbox (docs/audit.md): its commands, its file writes and a refused
egress attempt to an address of the fake internet (a namespace the test made) that its allowlist does
not admit, in order, with their kinds; and a secret passed through env appears nowhere in the export.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.network.conftest import create, sh
from tests.network.internet import FakeInternet

pytestmark = [pytest.mark.root, pytest.mark.slow]

SECRET = "s3cr3t-7c41e0-never-in-the-trail"


def export(api: httpx.Client, sandbox_id: str) -> tuple[str, list[dict[str, Any]]]:
    resp = api.get(f"/v1/sandboxes/{sandbox_id}/audit", params={"format": "jsonl"})
    assert resp.status_code == 200, resp.text
    return resp.text, [json.loads(line) for line in resp.text.splitlines()]


def test_a_sandboxs_trail_lists_its_commands_files_and_refused_egress(
    api: httpx.Client, internet: FakeInternet
) -> None:
    allowed, refused = internet.address("api.example.test"), internet.address("raw-c")
    sandbox = create(api, egress=[f"{allowed}:80"], envs={"API_TOKEN": "unset"})
    sid = sandbox["id"]
    put = api.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/notes.txt"}, content=b"twelve bytes")
    assert put.status_code == 200, put.text
    # The attempt comes a second into the command: the host counts an attempt's time in whole seconds.
    tried = sh(api, sid, f"sleep 1.5; curl -sS --max-time 3 http://{refused}:80/ >/dev/null; echo rc=$?")
    assert tried["stdout"].strip() not in ("rc=0", ""), "the allowlist refuses that address"
    reached = sh(api, sid, f"sleep 1.5; curl -sS --max-time 3 http://{allowed}:80/")
    assert reached["stdout"] == "api.example.test:80"
    # A secret given through env, used by name in the command line.
    secret_run = api.post(
        f"/v1/sandboxes/{sid}/exec",
        json={
            "cmd": "bash",
            "args": ["-c", 'test -n "$API_TOKEN" && echo set'],
            "env": {"API_TOKEN": SECRET},
        },
    )
    assert secret_run.json()["data"]["result"]["stdout"] == "set\n"

    deadline = time.monotonic() + 20  # the hosts are polled for attempts every 2 s
    while True:
        text, events = export(api, sid)
        egress = [e for e in events if e["kind"] == "egress"]
        if any(e["verdict"] == "refused" for e in egress) and any(e["verdict"] == "allowed" for e in egress):
            break
        assert time.monotonic() < deadline, f"no refused and allowed egress attempts in {events}"
        time.sleep(0.5)

    story = [
        (
            e["kind"],
            e.get("argv", [None])[-1] if e["kind"] == "command" else e.get("path") or e.get("address"),
        )
        for e in events
        if e["kind"] != "api"
    ]
    curl_refused = f"sleep 1.5; curl -sS --max-time 3 http://{refused}:80/ >/dev/null; echo rc=$?"
    assert story == [
        ("file", "/tmp/notes.txt"),
        ("command", curl_refused),
        ("egress", refused),
        ("command", f"sleep 1.5; curl -sS --max-time 3 http://{allowed}:80/"),
        ("egress", allowed),
        ("command", 'test -n "$API_TOKEN" && echo set'),
    ], story
    attempt = next(e for e in events if e["kind"] == "egress" and e["address"] == refused)
    assert attempt["verdict"] == "refused" and attempt["port"] == 80 and attempt["protocol"] == "tcp"
    written = next(e for e in events if e["kind"] == "file")
    assert written["direction"] == "write" and written["bytes"] == 12
    assert [e["route"] for e in events if e["kind"] == "api"] == [
        "/v1/sandboxes/{sandbox_id}/files",
        "/v1/sandboxes/{sandbox_id}/exec",
        "/v1/sandboxes/{sandbox_id}/exec",
        "/v1/sandboxes/{sandbox_id}/exec",
    ]
    assert SECRET not in text, "an env value is never recorded"
    assert api.headers["X-Api-Key"] not in text
    kinds = api.get(f"/v1/sandboxes/{sid}/audit", params={"kind": "egress"}).json()["data"]["items"]
    assert {e["kind"] for e in kinds} == {"egress"} and len(kinds) == len(egress)
