"""``--json`` on every command, as the README promises: each command that prints a result takes it (the
whole command tree is walked, lazy groups loaded), and run against the real platform each prints one
valid JSON document on stdout and nothing else there. Options after the sandbox's name work too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from paddock_cli import main
from tests.cli.test_cli_startup import registered
from tests.cli.test_sandbox_cli import Cli
from tests.live import LivePlatform

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGf7Ji5tGZ9kUMmCqkx0cDsuGDLvKQ6v7NGfZ5h3yQmQ cli@test"

#: Commands that print no result to take --json for, and why.
NO_RESULT = {
    "mcp": "serves MCP until stopped",
    "serve": "runs the services until stopped",
    "controlplane": "runs the service until stopped",
    "hostagent": "runs the service until stopped",
    "gateway": "runs the service until stopped",
    "sandbox shell": "an interactive terminal",
}

#: Commands that take --json (checked by the walk) but need more than the live platform here to run:
#: where their --json output is parsed instead.
RUN_ELSEWHERE = {
    "deploy dir": "tests/cli/test_deploy_cli.py (the payment gateway and a devchain)",
    "deploy ls": "tests/cli/test_deploy_cli.py",
    "deploy status": "tests/cli/test_deploy_cli.py",
    "deploy rm": "tests/cli/test_deploy_cli.py",
    "wallet-sandbox create": "tests/gateway/test_live_wallet_sandbox_sdk.py (a gateway on a devchain)",
    "wallet-sandbox ls": "tests/gateway/test_live_wallet_sandbox_sdk.py",
    "wallet-sandbox pause": "tests/gateway/test_live_wallet_sandbox_sdk.py",
    "wallet-sandbox resume": "tests/gateway/test_live_wallet_sandbox_sdk.py",
    "wallet-sandbox rm": "tests/gateway/test_live_wallet_sandbox_sdk.py",
    "admin host list": "tests/cli/test_admin_cli.py (a host heartbeating)",
    "admin host drain": "tests/cli/test_admin_cli.py",
    "admin host undrain": "tests/cli/test_admin_cli.py",
    "disk create": "tests/integration/test_disks.py (an S3 server); here --help only",
    "disk get": "an S3 disk; here --help only",
    "disk rotate": "an S3 disk; here --help only",
    "disk rm": "an S3 disk; here --help only",
    "disk attach": "tests/integration/test_disks.py (an S3 server)",
    "disk detach": "an S3 disk; here --help only",
    "template build": "a template build (minutes): tests/templates; here --help only",
    "template get": "a built template; here --help only",
    "template logs": "a built template; here --help only",
    "template rm": "a built template; here --help only",
    "volume create": "tests/volumes/test_volume_clients.py (its own platform, with the SDK's volume tests)",
    "volume ls": "tests/volumes/test_volume_clients.py",
    "volume get": "tests/volumes/test_volume_clients.py",
    "volume resize": "tests/volumes/test_volume_clients.py",
    "volume rm": "tests/volumes/test_volume_clients.py",
    "volume cp": "tests/volumes/test_volume_clients.py",
    "volume files": "tests/volumes/test_volume_clients.py",
    "sandbox run-code": "the code-interpreter image: tests/sdk/test_code_interpreter.py; here --help only",
    "sandbox screenshot": "the desktop image: tests/desktop; here --help only",
    "sandbox view": "the desktop image: tests/desktop; here --help only",
}


def leaves(command: Any, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every runnable command under ``command`` by its words (``"sandbox token create"``)."""
    found: dict[str, Any] = {}
    for name, sub in command.commands.items():
        if isinstance(sub, main.Listed):
            sub = main.load(name)
        if hasattr(sub, "commands"):
            found.update(leaves(sub, (*path, name)))
        else:
            found[" ".join((*path, name))] = sub
    return found


def every_leaf() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, command in registered().items():
        if hasattr(command, "commands"):
            found.update(leaves(command, (name,)))
        else:
            found[name] = command
    return found


def test_every_command_that_prints_a_result_takes_json() -> None:
    tree = every_leaf()
    assert len(tree) > 60  # the walk reached into the lazy groups (and the sandbox token subgroup)
    assert {"network create", "network attach", "sandbox token create", "admin key revoke"} <= set(tree)
    assert set(NO_RESULT) <= set(tree) and set(RUN_ELSEWHERE) <= set(tree)  # neither list is stale
    missing = sorted(
        words
        for words, command in tree.items()
        if words not in NO_RESULT
        and "--json" not in {o for p in command.params for o in getattr(p, "opts", [])}
    )
    assert missing == []
    runner = CliRunner()
    for words in sorted(set(tree) - set(NO_RESULT)):
        shown = runner.invoke(main.app, [*words.split(), "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (words, shown.output)
        assert "--json" in shown.output, words


class Recorder:
    """Runs ``paddock WORDS ARGS… --json`` (or with the ``--json`` ARGS place) and parses its stdout;
    remembers which commands it ran."""

    def __init__(self, cli: Cli) -> None:
        self.cli = cli
        self.ran: set[str] = set()

    def __call__(self, words: str, *args: str, code: int = 0) -> Any:
        flag = () if "--json" in args else ("--json",)  # placed by the caller, or last
        done = self.cli(*words.split(), *args, *flag)
        assert done.returncode == code, (words, done.stderr.decode())
        self.ran.add(words)
        return json.loads(done.stdout)  # the whole of stdout is one JSON document


def admin(data_dir: Path, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env["PADDOCK_CP_DATA_DIR"] = str(data_dir)
    done = subprocess.run(
        [sys.executable, "-m", "paddock_cli.main", "admin", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


def test_admin_accounts_commands_print_json(tmp_path: Path) -> None:
    """On a fresh database (migrated by the first command); the host commands need a host."""
    admin_commands = {w for w in every_leaf() if w.startswith("admin ")}
    here = {
        "admin user create",
        "admin user set-plan",
        "admin key create",
        "admin key revoke",
        "admin key list",
    }
    assert admin_commands == here | {w for w in RUN_ELSEWHERE if w.startswith("admin ")}
    user = admin(tmp_path, "user", "create", "--plan", "beginner")
    assert user["plan"] == "beginner" and user["api_key"]
    assert admin(tmp_path, "user", "set-plan", user["user_id"], "pro") == {
        "user_id": user["user_id"],
        "plan": "pro",
    }
    second = admin(tmp_path, "key", "create", user["user_id"])
    assert second["user_id"] == user["user_id"] and second["key_id"] != user["key_id"] and second["api_key"]
    assert admin(tmp_path, "key", "revoke", second["key_id"]) == {"key_id": second["key_id"], "revoked": True}
    keys = {k["id"]: k["revoked"] for k in admin(tmp_path, "key", "list")}
    assert keys == {user["key_id"]: False, second["key_id"]: True}


@pytest.mark.root
@pytest.mark.slow
def test_every_client_command_prints_json_against_the_platform(live: LivePlatform, tmp_path: Path) -> None:
    key = live.api_key()
    run = Recorder(Cli(live.url, key))
    assert run("whoami")["user_id"].startswith("usr_")
    assert "s-1vcpu-256mb" in [s["id"] for s in run("shapes")]
    assert run("rootfs")["default"]

    # options after the sandbox's name throughout
    box = run("sandbox create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "--name", "json-box")
    assert box["status"] == "running"
    try:
        assert [s["id"] for s in run("sandbox ls")] == [box["id"]]
        assert run("sandbox get", "json-box")["id"] == box["id"]
        assert run("sandbox timeout", "json-box", "600")["end_at"]
        ran = run("sandbox exec", "json-box", "--json", "--", "sh", "-c", "echo hi")  # before the command
        assert ran["stdout"] == "hi\n" and ran["exit_code"] == 0
        assert run("sandbox egress", "json-box", "example.com") == ["example.com"]
        assert run("sandbox resize", "json-box", "3072") == {"disk_mib": 3072}
        assert run("sandbox set", "json-box", "--auto-pause", "600")["auto_pause_after_seconds"] == 600

        shout = run("sandbox exec", "json-box", "-d", "--json", "--", "sh", "-c", "echo out; echo err >&2")
        assert shout["process_id"] and shout["cmd"] == "sh"
        done = run("sandbox wait", "json-box", shout["process_id"])
        assert done["exit_code"] == 0 and done["leader_exited"] is True
        told = run("sandbox logs", "json-box", shout["process_id"])
        assert told == {
            "process_id": shout["process_id"],
            "stdout": "out\n",
            "stderr": "err\n",
            "exit_code": 0,
        }
        sleeper = run("sandbox exec", "json-box", "--json", "--detach", "--", "sleep", "300")["process_id"]
        assert sleeper in [p["process_id"] for p in run("sandbox ps", "json-box")]
        assert run("sandbox kill", "json-box", sleeper)["process_id"] == sleeper
        assert run("sandbox bandwidth", "json-box")["id"] == box["id"]
        used = run("sandbox metrics", "json-box", "--window", "60")
        assert used["sandbox_id"] == box["id"] and isinstance(used["samples"], list)
        assert any("paddock:" in line for line in run("sandbox boot-log", "json-box", "--tail", "5")["lines"])
        trail = run("sandbox audit", "json-box", "--kind", "command")
        assert [event["argv"] for event in trail] == [["sh", "-c", "echo hi"]] and trail[0]["exit_code"] == 0
        newest = run("sandbox audit", "json-box", "--tail", "2")
        assert [event["id"] for event in newest] == sorted(event["id"] for event in newest) and len(
            newest
        ) == 2
        assert run("metrics")["running_sandboxes"] == 1
        assert run("sandbox ssh-key", "json-box", SSH_KEY) == {"count": 1}
        assert [h["status"] for h in run("hosts")] == ["active"]

        local = tmp_path / "note.txt"
        local.write_text("hello\n")
        copied = run("sandbox cp", str(local), "json-box:/root/")
        assert copied == {"source": str(local), "destination": f"{box['id']}:/root/note.txt", "bytes": 6}
        back = tmp_path / "back.txt"
        assert run("sandbox cp", "json-box:/root/note.txt", str(back))["bytes"] == 6
        shared = run("sandbox link", "json-box", "/root/note.txt", "--expires-in", "60")
        assert shared["method"] == "GET" and httpx.get(shared["url"], timeout=30).content == b"hello\n"
        drop = run("sandbox link", "json-box", "/root/drop.txt", "--write")
        assert (
            drop["method"] == "PUT"
            and httpx.put(drop["url"], content=b"dropped", timeout=30).status_code == 200
        )
        printed = run.cli("sandbox", "link", "json-box", "/root/drop.txt")
        assert (
            printed.returncode == 0
            and httpx.get(printed.stdout.decode().strip(), timeout=30).text == "dropped"
        )
        assert back.read_text() == "hello\n"
        refused = run.cli("sandbox", "cp", "json-box:/root/note.txt", "-", "--json")
        assert refused.returncode == 2 and refused.stdout == b""  # the file and JSON would mix

        assert run("sandbox token create", "json-box")["token"]
        assert run("sandbox token rotate", "json-box")["token"]
        assert run("sandbox token show", "json-box")["enabled"] is True
        assert run("sandbox token disable", "json-box")["enabled"] is False

        network = run("network create", "json-net")
        assert [m["sandbox_id"] for m in run("network attach", "json-net", "json-box")] == [box["id"]]
        assert [n["id"] for n in run("network ls")] == [network["id"]]
        assert run("network get", "json-net")["members"][0]["sandbox_id"] == box["id"]
        assert run("network detach", "json-net", "json-box")[0]["detached"] is True
        assert run("network rm", "json-net") == [{"id": network["id"], "deleted": True}]

        assert run("disk ls") == [] and run("disk mounts", "json-box") == []
        assert run("template ls") == []

        assert "sandbox.create" in run("webhook actions")
        hook = run("webhook create", "http://127.0.0.1:9/hook", "--event", "sandbox.create")
        assert [h["id"] for h in run("webhook ls")] == [hook["id"]]
        assert run("webhook get", hook["id"])["id"] == hook["id"]
        assert run("webhook suspend", hook["id"])["active"] is False
        assert run("webhook resume", hook["id"])["active"] is True
        assert run("webhook rm", hook["id"]) == [{"id": hook["id"], "deleted": True}]

        assert run("sandbox pause", "json-box") == [{"id": box["id"], "status": "paused"}]
        assert run("sandbox resume", "json-box") == [{"id": box["id"], "status": "running"}]
        snap = run("sandbox snapshot", "json-box", "--name", "json-snap")
        assert snap["status"] == "ready" and snap["name"] == "json-snap" and snap["id"]
        child = run("sandbox fork", "json-box")
        assert child["forked_from"] == box["id"]
        gone = run("sandbox rm", child["id"], "json-box", "--wait")
        assert gone == [{"id": child["id"], "status": "destroyed"}, {"id": box["id"], "status": "destroyed"}]
        # The trail outlives the sandbox; without --json it is a table saying what each event was.
        table = run.cli("sandbox", "audit", box["id"], "--kind", "command,process")
        assert table.returncode == 0, table.stderr
        assert b"command exited 0: sh -c 'echo hi'" in table.stdout
        assert b"started: sleep 300" in table.stdout
    finally:
        run.cli("sandbox", "rm", "json-box")

    tree = every_leaf()
    client_commands = {w for w in tree if not w.startswith("admin ")} - set(NO_RESULT) - set(RUN_ELSEWHERE)
    assert sorted(client_commands - run.ran) == []  # every client command was run with --json here
