"""An agent on E2B's SDK leaves the same audit trail as one on ``/v1`` (docs/audit.md): its calls on the
E2B API under its key's id, its envd calls under the sandbox's access token (or a signed URL's), the
processes it started and the files it wrote and read, and never a secret it passed as env. Before, a sandbox driven only
through E2B's SDK had an empty trail but for its egress."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
from e2b.api.client.api.sandboxes import get_sandboxes_sandbox_id_logs, get_v_2_sandboxes_sandbox_id_logs
from e2b.api.client.models import LogLevel, LogsDirection, SandboxLogs, SandboxLogsV2Response
from e2b.api.client_sync import get_api_client

from e2b import ConnectionConfig, Sandbox
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


def test_a_killed_sandboxs_logs_are_its_trail(e2b_env: E2bPlatform) -> None:
    """E2B's logs routes answer for a killed sandbox from its audit trail (the boot log went with it):
    what it ran and who asked, newest first or filtered, as E2B keeps its logs after a sandbox ends.
    Before, a killed sandbox's logs were a 404."""
    sandbox = Sandbox.create(timeout=120)
    sandbox_id = sandbox.sandbox_id
    try:
        assert sandbox.commands.run("echo first").stdout == "first\n"
        assert sandbox.commands.run("echo second").stdout == "second\n"
    finally:
        sandbox.kill()

    api = get_api_client(ConnectionConfig())
    started = get_v_2_sandboxes_sandbox_id_logs.sync(sandbox_id, client=api, search="started", limit=10)
    assert isinstance(started, SandboxLogsV2Response), started
    assert [(entry.message.split(" started: ")[1], entry.level) for entry in started.logs] == [
        ("/bin/bash -l -c 'echo first'", LogLevel.INFO),
        ("/bin/bash -l -c 'echo second'", LogLevel.INFO),
    ]
    assert {entry.fields.additional_properties["actor"] for entry in started.logs} == {"envd"}
    newest = get_v_2_sandboxes_sandbox_id_logs.sync(
        sandbox_id, client=api, direction=LogsDirection.BACKWARD, limit=1
    )
    assert isinstance(newest, SandboxLogsV2Response)
    assert [entry.message.split(" answered ")[0] for entry in newest.logs] == [
        "DELETE /sandboxes/{sandbox_id}"
    ]
    first = get_sandboxes_sandbox_id_logs.sync(sandbox_id, client=api, limit=1000)
    assert isinstance(first, SandboxLogs)
    lines = [json.loads(log.line) for log in first.logs]
    assert sum(line["logger"] == "paddock-audit" and line["kind"] == "process" for line in lines) == 2
    assert not any(line["logger"] == "paddock-boot" for line in lines)  # it went with the sandbox

    other = get_api_client(ConnectionConfig(api_key=e2b_env.platform.api_key()))
    theirs = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(sandbox_id, client=other)
    assert theirs.status_code == 404


def test_a_sandbox_access_token_reads_its_boot_log_but_not_its_trail(e2b_env: E2bPlatform) -> None:
    """The trail is the owner's account's to read (``/v1``'s audit route answers a token 403), so E2B's
    logs read with the sandbox's own access token hold its boot log and none of the trail."""
    sandbox = Sandbox.create(timeout=120)
    try:
        assert sandbox.commands.run("echo secret-work").stdout == "secret-work\n"
        with e2b_env.platform.http(e2b_env.api_key) as http:
            made = http.post(f"/v1/sandboxes/{sandbox.sandbox_id}/access-token")
            assert made.status_code == 200, made.text
            token = made.json()["data"]["token"]
            refused = http.get(f"/v1/sandboxes/{sandbox.sandbox_id}/audit", headers={"X-API-Key": token})
            assert refused.status_code == 403, refused.text
        as_token = get_api_client(ConnectionConfig(api_key=token))
        seen = get_v_2_sandboxes_sandbox_id_logs.sync(sandbox.sandbox_id, client=as_token)
        assert isinstance(seen, SandboxLogsV2Response)
        loggers = {entry.fields.additional_properties["logger"] for entry in seen.logs}
        assert loggers == {"paddock-boot"}, loggers
        as_owner = get_v_2_sandboxes_sandbox_id_logs.sync(
            sandbox.sandbox_id, client=get_api_client(ConnectionConfig())
        )
        assert isinstance(as_owner, SandboxLogsV2Response)
        assert {"paddock-boot", "paddock-audit"} <= {
            e.fields.additional_properties["logger"] for e in as_owner.logs
        }
    finally:
        sandbox.kill()
