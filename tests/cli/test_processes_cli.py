"""Managed processes from the shell, as a user runs them against the real platform: ``exec -d`` starts
one in the background and prints its id, ``ps`` lists it, ``logs`` prints its output, ``wait`` exits with
its code, ``kill`` ends it (or sends one signal); and ``bandwidth``, ``ssh-key`` and ``hosts``."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli_json import SSH_KEY
from tests.cli.test_sandbox_cli import Cli
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def cli(live: LivePlatform) -> Cli:
    return Cli(live.url, live.api_key())


def detached(cli: Cli, *command: str) -> dict[str, object]:
    """``exec ps-box -d --json -- COMMAND``: the started process (``cli.json`` puts --json last, which
    would be the command's)."""
    ran = cli("sandbox", "exec", "ps-box", "-d", "--json", "--", *command)
    assert ran.returncode == 0, ran.stderr.decode()
    started = json.loads(ran.stdout)
    assert isinstance(started, dict) and started["cmd"] == command[0]
    return started


def test_detach_ps_logs_wait_kill(cli: Cli) -> None:
    made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "--name", "ps-box")
    assert isinstance(made, dict)
    try:
        # -d before the sandbox's name, as docker exec -d; prints only the id
        started = cli(
            "sandbox", "exec", "-d", "ps-box", "sh", "-c", "echo one; echo two >&2; sleep 1; exit 3"
        )
        assert started.returncode == 0, started.stderr.decode()
        job = started.stdout.decode().strip()
        assert job and "\n" not in job

        waited = cli("sandbox", "wait", "ps-box", job)
        assert waited.returncode == 3, waited.stderr.decode()  # the process's own exit code
        logs = cli("sandbox", "logs", "ps-box", job)
        assert logs.returncode == 0
        assert logs.stdout == b"one\n" and logs.stderr == b"two\n"

        sleeper = detached(cli, "sleep", "300")
        assert sleeper["state"] == "running"
        listed = cli("sandbox", "ps", "ps-box")
        assert listed.returncode == 0 and str(sleeper["process_id"]).encode() in listed.stdout
        rows = cli.json("sandbox", "ps", "ps-box")
        assert isinstance(rows, list)
        states = {p["process_id"]: p["state"] for p in rows}
        assert states[sleeper["process_id"]] == "running" and states[job] != "running", rows

        early = cli("sandbox", "wait", "ps-box", str(sleeper["process_id"]), "--timeout", "1")
        assert early.returncode == 5 and b"still running" in early.stderr  # it runs on

        signalled = cli("sandbox", "kill", "ps-box", str(sleeper["process_id"]), "--signal", "usr1")
        assert signalled.returncode == 0, signalled.stderr.decode()
        ended = cli("sandbox", "wait", "ps-box", str(sleeper["process_id"]), "--json")
        assert ended.returncode == 128 + 10, ended.stderr.decode()  # SIGUSR1 is 10 on Linux
        assert json.loads(ended.stdout)["signal"] == "SIGUSR1"

        follower = cli.json(
            "sandbox", "exec", "ps-box", "-d", "--json", "--", "sh", "-c", "sleep 1; echo late"
        )
        assert isinstance(follower, dict)
        followed = cli("sandbox", "logs", "ps-box", follower["process_id"], "--follow")
        assert followed.returncode == 0 and followed.stdout == b"late\n"  # waited for output to come

        third = detached(cli, "sleep", "300")
        killed = cli.json("sandbox", "kill", "ps-box", str(third["process_id"]))
        assert isinstance(killed, dict) and killed["process_id"] == third["process_id"]
        assert cli("sandbox", "wait", "ps-box", killed["process_id"]).returncode == 128 + 15  # TERM

        refused = cli("sandbox", "exec", "ps-box", "-d", "-i", "--", "cat")
        assert refused.returncode == 2 and b"stdin" in refused.stderr
    finally:
        cli("sandbox", "rm", "ps-box")


def test_bandwidth_ssh_key_and_hosts(cli: Cli) -> None:
    made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "--name", "bw-box")
    assert isinstance(made, dict)
    try:
        shown = cli.json("sandbox", "bandwidth", "bw-box")
        assert isinstance(shown, dict) and shown["id"] == made["id"]
        assert {"quota_bytes", "used_bytes", "remaining_bytes", "capped"} <= set(shown)
        text = cli("sandbox", "bandwidth", "bw-box")
        assert text.returncode == 0 and b"used_bytes" in text.stdout
        grown = cli.json("sandbox", "bandwidth", "bw-box", "--recharge", "1048576")
        assert isinstance(grown, dict)
        assert shown["quota_bytes"] > 0  # metered: the default quota (5 GiB)
        assert grown["quota_bytes"] == shown["quota_bytes"] + 1048576

        assert cli.json("sandbox", "ssh-key", "bw-box", SSH_KEY) == {"count": 1}
        again = cli("sandbox", "ssh-key", "bw-box", SSH_KEY)  # duplicates are removed
        assert again.returncode == 0 and again.stdout == b"1 keys\n"
        bad = cli("sandbox", "ssh-key", "bw-box", "not a key")
        assert bad.returncode == 1 and b"keys" in bad.stderr  # the 400 names the field

        hosts = cli.json("hosts")
        assert isinstance(hosts, list) and len(hosts) == 1 and hosts[0]["status"] == "active"
        assert hosts[0]["vm_count"] >= 1
        table = cli("hosts")
        assert table.returncode == 0 and hosts[0]["id"].encode() in table.stdout
    finally:
        cli("sandbox", "rm", "bw-box")
