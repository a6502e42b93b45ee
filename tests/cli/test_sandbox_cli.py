"""``paddock sandbox …`` and ``paddock webhook …`` as a user runs them: a subprocess against the real
platform (control plane + host agent processes, runc sandboxes), configured by the environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


class Cli:
    def __init__(self, url: str, api_key: str) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
        self.env.update({"PADDOCK_BASE_URL": url, "PADDOCK_API_KEY": api_key})

    def __call__(
        self, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "paddock_cli.main", *args],
            env={**self.env, **(env or {})},
            input=stdin,
            capture_output=True,
            timeout=180,
        )

    def json(self, *args: str) -> object:
        ran = self(*args, "--json")
        assert ran.returncode == 0, ran.stderr.decode()
        return json.loads(ran.stdout)


@pytest.fixture
def cli(live: LivePlatform) -> Cli:
    return Cli(live.url, live.api_key())


def test_create_exec_cp_pause_fork_rm(cli: Cli, tmp_path: Path) -> None:
    made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048",
                    "--name", "cli-box", "--env", "GREETING=hello")  # fmt: skip
    assert made["status"] == "running" and made["name"] == "cli-box" and made["id"].startswith("sb-")
    sid = made["id"]

    listed = cli.json("sandbox", "ls")
    assert [s["id"] for s in listed] == [sid]
    table = cli("sandbox", "ls")
    assert table.returncode == 0 and b"cli-box" in table.stdout and b"running" in table.stdout
    assert cli.json("sandbox", "get", "cli-box")["id"] == sid  # by name or by id

    # exec streams output and exits with the command's own exit code
    ran = cli("sandbox", "exec", "cli-box", "sh", "-c", 'echo "$GREETING"; echo to-err >&2; exit 7')
    assert (ran.returncode, ran.stdout, ran.stderr) == (7, b"hello\n", b"to-err\n")
    assert cli("sandbox", "exec", sid, "true").returncode == 0
    piped = cli("sandbox", "exec", "-i", sid, "tr", "a-z", "A-Z", stdin=b"shout")
    assert piped.returncode == 0 and piped.stdout == b"SHOUT"
    missing = cli("sandbox", "exec", sid, "no-such-binary")
    assert missing.returncode == 127 and b"error:" in missing.stderr
    buffered = cli("sandbox", "exec", "--json", sid, "sh", "-c", "echo out; exit 3")
    assert buffered.returncode == 3
    assert json.loads(buffered.stdout)["stdout"] == "out\n"

    # cp streams both ways, byte-exact; `-` is stdin/stdout
    payload = os.urandom(4 * 1024 * 1024 + 7)
    (tmp_path / "up.bin").write_bytes(payload)
    assert cli("sandbox", "cp", str(tmp_path / "up.bin"), "cli-box:/root/up.bin").returncode == 0
    sha = cli("sandbox", "exec", sid, "sha256sum", "/root/up.bin").stdout.split()[0].decode()
    import hashlib

    assert sha == hashlib.sha256(payload).hexdigest()
    down = cli("sandbox", "cp", f"{sid}:/root/up.bin", str(tmp_path))
    assert down.returncode == 0 and (tmp_path / "up.bin").read_bytes() == payload
    assert cli("sandbox", "cp", "-", "cli-box:/root/piped", stdin=b"from a pipe").returncode == 0
    assert cli("sandbox", "cp", "cli-box:/root/piped", "-").stdout == b"from a pipe"
    absent = cli("sandbox", "cp", "cli-box:/root/absent", str(tmp_path / "x"))
    assert absent.returncode == 4 and b"error:" in absent.stderr

    # pause / resume / fork / rm
    assert cli.json("sandbox", "pause", sid) == [{"id": sid, "status": "paused"}]
    refused = cli("sandbox", "exec", sid, "true")
    assert refused.returncode == 1 and b"INVALID_STATE" in refused.stderr
    assert cli.json("sandbox", "resume", "cli-box") == [{"id": sid, "status": "running"}]
    child = cli.json("sandbox", "fork", sid)
    assert child["status"] == "running" and child["forked_from"] == sid
    assert cli("sandbox", "exec", child["id"], "cat", "/root/piped").stdout == b"from a pipe"
    removed = cli.json("sandbox", "rm", "--wait", child["id"], sid)
    assert removed == [{"id": child["id"], "status": "destroyed"}, {"id": sid, "status": "destroyed"}]
    assert cli.json("sandbox", "ls") == []
    assert {s["status"] for s in cli.json("sandbox", "ls", "--all")} == {"destroyed"}
    assert cli("sandbox", "get", "cli-box").returncode == 4  # names resolve to live sandboxes only


def test_scripts_get_bare_ids_and_commands_get_their_flags(cli: Cli) -> None:
    """`id=$(paddock sandbox create)`, `ls` with whole ids, and `exec ID -- cmd -flags` as docker/kubectl."""
    created = cli("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "-e", "K=declared")
    assert created.returncode == 0, created.stderr.decode()
    sid = created.stdout.decode().strip()
    assert created.stdout.decode() == sid + "\n" and re.fullmatch(r"sb-[0-9a-z]{26}", sid)

    table = cli("sandbox", "ls", env={"COLUMNS": "40"}).stdout.decode().splitlines()
    assert table[0].split()[0] == "ID" and [line.split()[0] for line in table[1:]] == [sid]

    argv = ["sh", "-c", 'printf "%s|" "$@"', "sh", "-la", "--json", "-e", "--"]
    for before in ([], ["--"], ["-e", "K=override", "--"]):
        ran = cli("sandbox", "exec", sid, *before, *argv)
        assert (ran.returncode, ran.stdout) == (0, b"-la|--json|-e|--|"), ran.stderr.decode()
    shown = cli("sandbox", "exec", sid, "-e", "K=override", "--", "sh", "-c", 'echo "$K"')
    assert shown.stdout == b"override\n"
    as_json = cli("sandbox", "exec", sid, "--json", "--", "ls", "-d", "/root")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["stdout"] == "/root\n"
    assert (
        cli("sandbox", "exec", sid, "echo", "--", "-n").stdout == b"-- -n\n"
    )  # a later `--` is the command's
    nothing = cli("sandbox", "exec", sid, "--")
    assert nothing.returncode == 2 and b"a command is required" in nothing.stderr

    child = cli("sandbox", "fork", sid).stdout.decode().strip()
    assert re.fullmatch(r"sb-[0-9a-z]{26}", child) and child != sid
    assert cli("sandbox", "rm", "--wait", child, sid).returncode == 0


def test_exit_codes_for_scripts(cli: Cli, live: LivePlatform) -> None:
    unknown = cli("sandbox", "get", "sb-01jzzzzzzzzzzzzzzzzzzzzzzz")
    assert unknown.returncode == 4 and unknown.stderr == b"error: sandbox not found\n"
    bad_key = cli("sandbox", "ls", env={"PADDOCK_API_KEY": "pdk_wrong"})
    assert bad_key.returncode == 1 and b"401 UNAUTHORIZED" in bad_key.stderr
    unreachable = cli("--url", "http://127.0.0.1:9", "sandbox", "ls")
    assert unreachable.returncode == 3 and b"cannot reach the server" in unreachable.stderr
    usage = cli("sandbox", "create", "--disk-mib", "lots")
    assert usage.returncode == 2
    bad_env = cli("sandbox", "create", "--env", "NOEQUALS")
    assert bad_env.returncode == 2 and b"KEY=VALUE" in bad_env.stderr
    invalid = cli("sandbox", "create", "--shape", "s-64vcpu-1tb")
    assert invalid.returncode == 1 and b"shape:" in invalid.stderr
    both_local = cli("sandbox", "cp", "a", "b")
    assert both_local.returncode == 2


def test_webhook_commands(cli: Cli) -> None:
    actions = cli.json("webhook", "actions")
    assert "sandbox.create" in actions
    made = cli.json("webhook", "create", "https://hooks.example.com/p", "-e", "sandbox.create")
    assert made["secret"].startswith("whsec_") and made["events"] == ["sandbox.create"]
    shown = cli("webhook", "create", "https://hooks.example.com/q")
    assert shown.returncode == 0 and b"whsec_" in shown.stdout  # the secret is printed, once
    listed = cli.json("webhook", "ls")
    assert [e["url"] for e in listed] == ["https://hooks.example.com/p", "https://hooks.example.com/q"]
    assert all("secret" not in e for e in listed)
    assert cli.json("webhook", "suspend", made["id"])["active"] is False
    assert cli.json("webhook", "resume", made["id"])["active"] is True
    detail = cli.json("webhook", "get", made["id"])
    assert detail["id"] == made["id"] and detail["deliveries"] == [] and "secret" not in detail
    assert cli("webhook", "rm", *[e["id"] for e in listed]).returncode == 0
    assert cli.json("webhook", "ls") == []
    assert cli("webhook", "get", made["id"]).returncode == 4
    bad = cli("webhook", "create", "not-a-url")
    assert bad.returncode == 1 and b"url:" in bad.stderr
