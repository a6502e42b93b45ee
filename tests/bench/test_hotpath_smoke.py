"""``bench/hotpath.py`` cannot rot: a short run times every layer and prints every row (never a time)."""

from __future__ import annotations

import re

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_hotpath_bench_times_every_layer() -> None:
    done = run_bench("hotpath", "--requests", "10", timeout=240)
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
