"""``bench/terminal_bench.py`` cannot rot: a short run echoes keystrokes through all three paths.

Asserts that the harness works (every keystroke came back on every path), never a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes)")
def test_terminal_bench_echoes_through_shell_ws_ssh_and_crun(tmp_path: Path) -> None:
    out = tmp_path / "terminal.json"
    done = run_bench("terminal_bench", "--keystrokes", "10", "--json", str(out), timeout=280)
    results = json.loads(out.read_text())
    assert set(results) == {"shell-ws", "ssh", "crun exec -t"}
    assert all(row["n"] == 10 for row in results.values()), results
    assert "| shell-ws | 10 |" in done.stdout
