"""``bench/private_networks_bench.py`` cannot rot: one round measures every row. Never asserts a time."""

from __future__ import annotations

import os

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes, bridges)")
def test_private_networks_bench_prints_every_row() -> None:
    done = run_bench("private_networks_bench", "--rounds", "1", "--warmup", "0", timeout=600)
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert len(rows) == 6, done.stdout
    assert all(float(row[-3]) > 0 and row[-1] == "1" for row in rows), done.stdout
