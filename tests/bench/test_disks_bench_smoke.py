"""``bench/disks_bench.py`` cannot rot: one small round measures every row. Never asserts a time."""

from __future__ import annotations

import os

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes, FUSE mounts)")
def test_disks_bench_prints_every_row() -> None:
    done = run_bench("disks_bench", "--size-mib", "4", "--rounds", "1", timeout=600)
    rows = [line.rsplit(None, 5) for line in done.stdout.splitlines()[1:]]
    assert len(rows) == 5, done.stdout
    assert all(float(row[1]) > 0 for row in rows), done.stdout
