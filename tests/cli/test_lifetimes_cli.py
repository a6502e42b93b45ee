"""The CLI's lifetime and label flags on the live platform (issue #32): create --timeout/--metadata,
ls --metadata, sandbox timeout, and exec --json's 127 for a command that cannot start."""

from __future__ import annotations

import secrets
import time

import pytest

from tests.cli.test_sandbox_cli import Cli, cli  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_timeout_metadata_and_a_command_that_cannot_start(cli: Cli) -> None:  # noqa: F811
    run = secrets.token_hex(4)
    made = cli.json(
        "sandbox", "create", "--shape", "s-1vcpu-256mb", "--timeout", "5", "--metadata", f"run={run}-short"
    )
    kept = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--timeout", "5", "-m", f"run={run}")
    assert isinstance(made, dict) and isinstance(kept, dict)
    try:
        assert made["metadata"] == {"run": f"{run}-short"} and made["timeout_s"] == 5 and made["end_at"]
        extended = cli.json("sandbox", "timeout", kept["id"], "300")
        assert isinstance(extended, dict) and extended["end_at"] > made["end_at"]
        # --all: the short one may be gone already on a loaded machine; the filter still tells them apart.
        listed = cli.json("sandbox", "ls", "--all", "--metadata", f"run={run}")
        assert isinstance(listed, list) and [row["id"] for row in listed] == [kept["id"]]
        short = cli.json("sandbox", "ls", "--all", "-m", f"run={run}-short")
        assert isinstance(short, list) and [row["id"] for row in short] == [made["id"]]
        assert cli.json("sandbox", "ls", "--all", "--metadata", f"run=x{run}") == []
        missing = cli("sandbox", "exec", kept["id"], "--json", "--", "no-such-binary")
        assert missing.returncode == 127, missing.stderr.decode()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = cli.json("sandbox", "get", made["id"])
            if isinstance(status, dict) and status["status"] in ("destroying", "destroyed"):
                break
            time.sleep(1)
        assert isinstance(status, dict) and status["status"] in ("destroying", "destroyed"), status
        kept_now = cli.json("sandbox", "get", kept["id"])
        assert isinstance(kept_now, dict) and kept_now["status"] == "running"
    finally:
        cli("sandbox", "rm", made["id"])
        cli("sandbox", "rm", kept["id"])
