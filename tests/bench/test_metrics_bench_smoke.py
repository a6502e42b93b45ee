"""``bench/metrics_bench.py`` cannot rot: a short run times both routes on both sides (metrics on and
off, each side checked to serve or not serve ``/metrics``) and prints the ratios (never judged)."""

from __future__ import annotations

import re

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_metrics_bench_compares_on_and_off() -> None:
    done = run_bench("metrics_bench", "--requests", "20", "--warmup", "5", timeout=240)
    rows = re.findall(
        r"^(GET .+?)\s+(\d+\.\d+) /\s+\d+\.\d+\s+(\d+\.\d+) /\s+\d+\.\d+\s+(\d+\.\d+)×$", done.stdout, re.M
    )
    assert [label for label, *_ in rows] == ["GET /v1/whoami", "GET /v1/sandboxes/{id} (fast lane)"], (
        done.stdout
    )
    assert all(float(on) > 0 and float(off) > 0 and float(ratio) > 0 for _, on, off, ratio in rows), (
        done.stdout
    )
    assert re.search(r"the middleware alone, in process: \d+\.\d µs → \d+\.\d µs", done.stdout), done.stdout
