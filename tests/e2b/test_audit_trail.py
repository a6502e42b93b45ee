"""An agent on E2B's SDK leaves the same audit trail as one on ``/v1`` (docs/audit.md): its calls on the
E2B API under its key's id, its envd calls under the sandbox's access token (or a signed URL's), the
processes it started and the files it wrote and read, and never a secret it passed as env. Before, a sandbox driven only
through E2B's SDK had an empty trail but for its egress."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx

from e2b import Sandbox
from tests.e2b.conftest import E2bPlatform


def _trail(e2b_env: E2bPlatform, sandbox_id: str) -> tuple[str, list[dict[str, Any]]]:
    with e2b_env.platform.http(e2b_env.api_key) as http:
        resp = http.get(f"/v1/sandboxes/{sandbox_id}/audit", params={"format": "jsonl"})
    assert resp.status_code == 200, resp.text
    return resp.text, [json.loads(line) for line in resp.text.splitlines()]


def _calls(events: list[dict[str, Any]], actor: str) -> set[tuple[str, str, int]]:
    return {
        (e["method"], e["route"], e["status"]) for e in events if e["kind"] == "api" and e["actor"] == actor
    }


def test_an_e2b_agents_calls_processes_and_files_are_in_the_trail(e2b_env: E2bPlatform) -> None:
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    sandbox = Sandbox.create(timeout=120)
    sandbox_id = sandbox.sandbox_id
    try:
        with e2b_env.platform.http(e2b_env.api_key) as http:  # a /v1 call: its event names the key's id
            assert http.get(f"/v1/sandboxes/{sandbox_id}").status_code == 200
        sandbox.set_timeout(90)
        ran = sandbox.commands.run('test -n "$AUDIT_TOKEN" && echo audited', envs={"AUDIT_TOKEN": secret})
        assert ran.stdout == "audited\n"
        sandbox.files.write("/tmp/audited.txt", "twelve bytes")
        assert sandbox.files.read("/tmp/audited.txt") == "twelve bytes"
        signed = sandbox.download_url("/tmp/audited.txt", use_signature_expiration=60)
        to_the_sandbox = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}  # E2B_SANDBOX_URL mode
        assert httpx.get(signed, headers=to_the_sandbox, timeout=30).text == "twelve bytes"
        sandbox.files.remove("/tmp/audited.txt")
        background = sandbox.commands.run("sleep 30", background=True)
        # A background process's event is there while it still runs, not only once its stream ends.
        _, running = _trail(e2b_env, sandbox_id)
        assert any(e["kind"] == "process" and e["argv"][-1] == "sleep 30" for e in running), running
        background.kill()
    finally:
        sandbox.kill()

    text, events = _trail(e2b_env, sandbox_id)
    assert secret not in text
    key_id = next(e["actor"] for e in events if e["kind"] == "api" and e["route"].startswith("/v1/"))
    assert key_id.startswith("key_")
    assert {
        ("POST", "/sandboxes/{sandbox_id}/timeout", 204),
        ("DELETE", "/sandboxes/{sandbox_id}", 204),
    } <= _calls(events, key_id)
    envd = _calls(events, "envd")
    assert {
        ("POST", "/process.Process/Start", 200),
        ("POST", "/files", 200),
        ("GET", "/files", 200),
        ("POST", "/filesystem.Filesystem/Remove", 200),
        ("POST", "/process.Process/SendSignal", 200),
    } <= envd, envd
    processes = [e for e in events if e["kind"] == "process"]
    assert [e["argv"] for e in processes] == [
        ["/bin/bash", "-l", "-c", 'test -n "$AUDIT_TOKEN" && echo audited'],
        ["/bin/bash", "-l", "-c", "sleep 30"],
    ]
    assert all(e["actor"] == "envd" and e["process_id"] for e in processes)
    assert _calls(events, "signed_url") == {("GET", "/files", 200)}
    files = [(e["path"], e["bytes"], e["direction"], e["actor"]) for e in events if e["kind"] == "file"]
    assert files == [
        ("/tmp/audited.txt", 12, "write", "envd"),
        ("/tmp/audited.txt", 12, "read", "envd"),
        ("/tmp/audited.txt", 12, "read", "signed_url"),
    ]
