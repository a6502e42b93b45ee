"""``bench/hotpath.py`` cannot rot: a short run times every layer and prints every row (never a time)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_hotpath_bench_times_every_layer() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.hotpath", "--requests", "10"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(
        r"^(exec `true`: .+?|pause \+ resume: .+?|GET .+?)\s+(\d+\.\d+) /\s+(\d+\.\d+)$", done.stdout, re.M
    )
    assert [label for label, _, _ in rows] == [
        "exec `true`: guest agent socket",
        "exec `true`: host agent internal API",
        "exec `true`: host agent kept channel",
        "exec `true`: public API, httpx",
        "exec `true`: SDK `sandbox.run`",
        "pause + resume: host agent internal API",
        "pause + resume: public API, httpx",
        "GET /v1/sandboxes/{id}",
        "GET /healthz (one HTTP hop)",
    ], done.stdout
    assert all(float(p50) > 0 for _, p50, _ in rows), done.stdout
