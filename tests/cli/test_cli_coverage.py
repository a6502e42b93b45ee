"""``paddock sandbox cp`` as ``cp`` behaves (a file into a directory, ``-r`` both ways) and the README's
token example, as a user runs them: a subprocess against the real platform (control plane and host
agent processes, runc sandboxes), configured by the environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.test_sandbox_cli import Cli
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def cli(live: LivePlatform) -> Cli:
    return Cli(live.url, live.api_key())


def _ok(ran: object) -> None:
    assert getattr(ran, "returncode") == 0, getattr(ran, "stderr").decode()  # noqa: B009


def test_cp_into_a_directory_and_recursive_both_ways(cli: Cli, tmp_path: Path) -> None:
    made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "--name", "cp-box")
    assert isinstance(made, dict)
    try:
        data = tmp_path / "data.csv"
        data.write_text("a,b\n1,2\n")
        # a destination that is a directory receives the file under its own name, as cp does
        _ok(cli("sandbox", "cp", str(data), "cp-box:/root"))
        _ok(cli("sandbox", "cp", str(data), "cp-box:/tmp/"))
        listed = cli("sandbox", "exec", "cp-box", "--", "cat", "/root/data.csv", "/tmp/data.csv")
        assert listed.stdout == b"a,b\n1,2\n" * 2

        tree = tmp_path / "src"
        (tree / "pkg").mkdir(parents=True)
        (tree / "pkg" / "mod.py").write_text("print('hi')\n")
        blob = os.urandom(1 << 20)
        (tree / "blob.bin").write_bytes(blob)
        refused = cli("sandbox", "cp", str(tree), "cp-box:/root/app")
        assert refused.returncode != 0 and b"-r" in refused.stderr  # a directory without -r
        _ok(cli("sandbox", "cp", "-r", str(tree), "cp-box:/root/app"))  # new: the contents as /root/app
        _ok(cli("sandbox", "cp", "-r", str(tree), "cp-box:/root/app"))  # exists: into it, as src/
        ran = cli("sandbox", "exec", "cp-box", "--", "cat", "/root/app/pkg/mod.py")
        assert ran.stdout == b"print('hi')\n", ran.stderr
        assert (
            cli("sandbox", "exec", "cp-box", "--", "cat", "/root/app/src/pkg/mod.py").stdout
            == b"print('hi')\n"
        )

        back = tmp_path / "back"
        _ok(cli("sandbox", "cp", "-r", "cp-box:/root/app", str(back)))
        assert (back / "blob.bin").read_bytes() == blob
        assert (back / "pkg" / "mod.py").read_text() == "print('hi')\n"
        assert (back / "src" / "blob.bin").read_bytes() == blob
    finally:
        cli("sandbox", "rm", "cp-box")


def test_the_readme_token_example_names_the_sandbox(live: LivePlatform, cli: Cli) -> None:
    made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "--name", "demo")
    assert isinstance(made, dict)
    try:
        created = cli("sandbox", "token", "create", "demo")  # token=$(paddock sandbox token create demo)
        _ok(created)
        agent = Cli(live.url, created.stdout.decode().strip())
        ran = agent("sandbox", "exec", "demo", "--", "ls", "/")  # PADDOCK_API_KEY=$token … exec demo -- ls
        assert ran.returncode == 0, ran.stderr.decode()  # was 403: the name needed the account's list
        assert b"etc" in ran.stdout.split()
        assert agent("sandbox", "get", "no-such").returncode == 4  # not found
    finally:
        cli("sandbox", "rm", "demo")


def test_account_and_sandbox_settings_commands_with_json_after_the_name(cli: Cli) -> None:
    who = cli.json("whoami")
    assert isinstance(who, dict) and who["user_id"].startswith("usr_")
    shapes = cli.json("shapes")
    assert isinstance(shapes, list) and "s-1vcpu-256mb" in [s["id"] for s in shapes]
    table = cli("shapes")
    assert table.returncode == 0 and b"s-1vcpu-256mb" in table.stdout
    images = cli.json("rootfs")
    assert isinstance(images, dict) and images["default"]

    made = cli.json(
        "sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "--name", "set-box"
    )
    assert isinstance(made, dict)
    try:
        # options after the sandbox's name, --json on each
        assert cli.json("sandbox", "egress", "set-box") == []
        ran = cli("sandbox", "egress", "set-box", "example.com", "10.0.0.0/8:443", "--json")
        assert ran.returncode == 0, ran.stderr
        assert cli.json("sandbox", "egress", "set-box") == ["example.com", "10.0.0.0/8:443"]
        assert cli.json("sandbox", "egress", "set-box", "--clear") == []

        patched = cli.json(
            "sandbox", "set", "set-box", "--ingress", "--auto-pause", "600", "--on-idle", "hibernate"
        )
        assert isinstance(patched, dict)
        assert patched["ingress_enabled"] is True and patched["auto_pause_after_seconds"] == 600
        assert patched["on_idle"] == "hibernate"
        ported = cli.json(
            "sandbox",
            "set",
            "set-box",
            "--ingress-host-header",
            "${PORT}.app.test",
            "--ingress-https-port",
            "8443",
            "--ingress-https-port",
            "9443",
        )
        assert isinstance(ported, dict)
        assert (ported["ingress_host_header"], ported["ingress_https_ports"]) == (
            "${PORT}.app.test",
            [8443, 9443],
        )
        shown = cli("sandbox", "get", "set-box")
        assert b"ingress_https_ports  8443, 9443" in shown.stdout, shown.stdout
        cleared = cli.json(
            "sandbox", "set", "set-box", "--ingress-host-header", "", "--no-ingress-https-ports"
        )
        assert isinstance(cleared, dict)
        assert "ingress_host_header" not in cleared and cleared["ingress_https_ports"] == [], cleared
        assert cli.json("sandbox", "resize", "set-box", "3072") == {"disk_mib": 3072}
        assert cli.json("sandbox", "ps", "set-box") == []
    finally:
        cli("sandbox", "rm", "set-box")
