"""``paddock sandbox exec --user`` on the live platform (issue #32): the command runs as that user of
the sandbox, before SANDBOX, after it or between it and ``--``; an unknown user is a usage error naming
``user`` and runs nothing."""

from __future__ import annotations

import pytest

from tests.cli.test_sandbox_cli import Cli, cli  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_exec_as_a_user(cli: Cli) -> None:  # noqa: F811
    made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048")
    assert isinstance(made, dict)
    box = made["id"]
    try:
        streamed = cli("sandbox", "exec", "--user", "nobody", box, "id", "-un")
        assert (streamed.returncode, streamed.stdout) == (0, b"nobody\n"), streamed.stderr.decode()
        between = cli("sandbox", "exec", box, "-u", "65534", "--json", "--", "id", "-u")
        assert between.returncode == 0, between.stderr.decode()
        assert b'"stdout": "65534\\n"' in between.stdout.replace(b'":"', b'": "'), between.stdout
        written = cli("sandbox", "exec", box, "--user=nobody", "--", "sh", "-c", "echo x > /tmp/mine")
        assert written.returncode == 0, written.stderr.decode()
        owner = cli("sandbox", "exec", box, "find", "/tmp/mine", "-printf", "%u")
        assert owner.stdout == b"nobody"
        assert cli("sandbox", "exec", box, "id", "-un").stdout == b"root\n"
        unknown = cli("sandbox", "exec", box, "--user", "no-such-user", "--json", "--", "touch", "/tmp/ran")
        assert unknown.returncode != 0 and b"user" in unknown.stderr and b"no-such-user" in unknown.stderr
        assert cli("sandbox", "exec", box, "test", "-e", "/tmp/ran").returncode == 1, "nothing ran"
    finally:
        cli("sandbox", "rm", box)
