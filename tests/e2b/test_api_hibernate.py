"""E2B's filesystem-only auto-pause (``lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}``,
``autoPauseMemory: false`` on the wire) is Paddock's ``on_timeout: hibernate``, through the unmodified
``e2b`` SDK configured only by the three variables: at its timeout the sandbox is paused with only its
disk kept (``/v1`` shows it hibernated), and the connect that wakes it finds its files and none of its
processes. Before, the create was a 501."""

from __future__ import annotations

import time

import pytest

from e2b import Sandbox, SandboxState
from tests.e2b.conftest import E2bPlatform
from tests.e2b.test_api_snapshots import SLEEPS, container_tier, start_sleep

__all__ = ["container_tier"]

pytestmark = pytest.mark.root


def test_a_filesystem_auto_pause_hibernates_at_the_timeout(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}, timeout=300)
    try:
        with e2b_env.platform.http(e2b_env.api_key) as native:
            view = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
            assert view["on_timeout"] == "hibernate" and view["timeout_s"] == 300, view
            sandbox.files.write("/var/tmp/kept.txt", "on the disk\n")
            start_sleep(sandbox)

            sandbox.set_timeout(2)  # the SDK's own call; the expiry pass hibernates it at the end
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                view = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
                if view["status"] == "paused":
                    break
                time.sleep(0.5)
            assert view["status"] == "paused" and view.get("hibernated") is True, view
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED

        woken = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        assert woken.files.read("/var/tmp/kept.txt") == "on the disk\n"
        assert woken.commands.run(SLEEPS).stdout.strip() == "0"  # its processes started afresh
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_a_frozen_auto_pause_is_unchanged(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(lifecycle={"on_timeout": "pause"}, timeout=300)
    try:
        with e2b_env.platform.http(e2b_env.api_key) as native:
            view = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
        assert view["on_timeout"] == "pause", view
    finally:
        sandbox.kill()
