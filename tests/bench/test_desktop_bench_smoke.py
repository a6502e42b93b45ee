"""``bench/desktop_bench.py`` cannot rot: a short run takes screenshots and waits for a click to show.

Asserts that the harness works (every sample was taken), never a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes)")
def test_desktop_bench_times_screenshots_and_clicks(tmp_path: Path) -> None:
    out = tmp_path / "desktop.json"
    done = run_bench("desktop_bench", "--runs", "3", "--json", str(out), timeout=400)
    results = json.loads(out.read_text())
    assert set(results["ops"]) == {"screenshot", "click → changed", "exec true", "grab in sandbox"}
    assert all(row["n"] == 3 for row in results["ops"].values()), results
    assert "| screenshot | 3 |" in done.stdout
