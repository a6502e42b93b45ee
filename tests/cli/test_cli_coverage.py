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
