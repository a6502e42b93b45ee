"""``paddock sandbox token …`` as a user runs it (a subprocess configured by the environment) against a
real control plane on 127.0.0.1 (host seam faked), and the token used as the CLI's own API key."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tests.cli.test_sandbox_cli import Cli
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import fake_host

__all__ = ["fake_host"]

pytestmark = pytest.mark.db


async def test_token_commands_and_a_token_driven_cli(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user()
    owner = Cli(controlplane.url, key)

    def work() -> None:
        sid = owner("sandbox", "create").stdout.decode().strip()
        other = owner("sandbox", "create").stdout.decode().strip()
        created = owner("sandbox", "token", "create", sid)
        assert created.returncode == 0, created.stderr.decode()
        token = created.stdout.decode().strip()
        assert re.fullmatch(r"sbt_[A-Za-z0-9_-]{43}", token)
        again = owner("sandbox", "token", "create", sid)
        assert again.returncode == 1 and b"rotate" in again.stderr

        shown = owner("sandbox", "token", "show", sid).stdout.decode()
        assert "enabled     true" in shown and f"sbt_…{token[-4:]}" in shown and token not in shown

        agent = Cli(controlplane.url, token)
        ran = agent("sandbox", "exec", sid, "--", "echo", "hi")  # the fake host streams one, two, exit 3
        assert (ran.returncode, ran.stdout, ran.stderr) == (3, b"one\n", b"two\n")
        assert agent("sandbox", "get", other).returncode == 4  # not found, as if it did not exist
        refused = agent("sandbox", "ls")
        assert refused.returncode == 1 and b"access token" in refused.stderr

        rotated = json.loads(owner("sandbox", "token", "rotate", sid, "--expires-in", "600", "--json").stdout)
        assert rotated["token"] != token and rotated["expires_at"] and rotated["enabled"] is True
        assert agent("sandbox", "exec", sid, "--", "true").returncode == 1  # 401: the old token is gone
        disabled = owner("sandbox", "token", "disable", sid)
        assert disabled.returncode == 0 and "enabled     false" in disabled.stdout.decode()
        assert Cli(controlplane.url, rotated["token"])("sandbox", "exec", sid, "--", "true").returncode == 1

    await asyncio.to_thread(work)
