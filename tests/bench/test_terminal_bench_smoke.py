"""``bench/terminal_bench.py`` cannot rot: a short run echoes keystrokes through all three paths.

Asserts that the harness works (every keystroke came back on every path), never a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes)")
def test_terminal_bench_echoes_through_shell_ws_ssh_and_crun(tmp_path: Path) -> None:
    out = tmp_path / "terminal.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.terminal_bench", "--keystrokes", "10", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results) == {"shell-ws", "ssh", "crun exec -t"}
    assert all(row["n"] == 10 for row in results.values()), results
    assert "| shell-ws | 10 |" in done.stdout
