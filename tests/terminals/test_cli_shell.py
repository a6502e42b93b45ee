"""``paddock sandbox shell NAME`` as a user runs it: a subprocess on a real terminal (a pty the test
holds), typing into a shell in the sandbox, resizing the window, and getting the exit code back."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time

import httpx
import pytest

from tests.live import LivePlatform

pytestmark = pytest.mark.root


def test_shell_types_resizes_and_passes_the_exit_code(live: LivePlatform) -> None:
    key = live.api_key()
    with httpx.Client(base_url=live.url, headers={"X-Api-Key": key}, timeout=60) as api:
        created = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "shell-box"})
        assert created.status_code == 200, created.text
        sid = created.json()["data"]["id"]
        # COLUMNS/LINES would win over the terminal's size (shutil.get_terminal_size reads them first);
        # a test run may have them set, and a full two-worker run once saw the shell start at 24x80.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PADDOCK_") and k not in ("COLUMNS", "LINES")
        }
        env.update({"PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": key})
        leader, follower = os.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 25, 85, 0, 0))
        cli = subprocess.Popen(
            [sys.executable, "-m", "paddock_cli.main", "sandbox", "shell", "shell-box"],
            stdin=follower, stdout=follower, stderr=follower, env=env, start_new_session=True,
            # the pty is the CLI's controlling terminal, as a real one is: window changes send SIGWINCH
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )  # fmt: skip
        os.close(follower)
        seen = b""

        def read_until(needle: bytes) -> None:
            nonlocal seen
            deadline = time.monotonic() + 30
            while needle not in seen:
                assert time.monotonic() < deadline, seen
                if select.select([leader], [], [], 0.5)[0]:
                    with contextlib.suppress(OSError):
                        seen += os.read(leader, 65536)

        try:
            read_until(b"# ")  # the shell's prompt: the CLI is in raw mode by now
            os.write(leader, b"stty size; echo cli-$((5*5))\r")
            read_until(b"cli-25")
            assert b"25 85" in seen
            fcntl.ioctl(leader, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))  # SIGWINCH to the CLI
            deadline = time.monotonic() + 20
            while b"40 100" not in seen:
                assert time.monotonic() < deadline, seen
                os.write(leader, b"stty size\r")
                time.sleep(0.3)
                read_until(b"\n")
                with contextlib.suppress(OSError):
                    if select.select([leader], [], [], 0.3)[0]:
                        seen += os.read(leader, 65536)
            os.write(leader, b"exit 12\r")
            assert cli.wait(timeout=30) == 12
        finally:
            cli.kill()
            cli.wait()
            os.close(leader)
            api.delete(f"/v1/sandboxes/{sid}")
