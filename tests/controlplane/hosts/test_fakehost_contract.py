"""The control plane's host fake is held to the interface the real host link implements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_fake_host_link_type_checks_against_the_host_link_interface() -> None:
    # fakehost.py ends with ``_: hostlink.HostLinkAPI = FakeHostLink()``: a fake that drifts from the
    # interface (a parameter added, a return type changed) fails here, not silently in some test.
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "tests/controlplane/fakehost.py",
            "src/paddock_controlplane/hosts/hostlink.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
