"""``bench/agent_growth.py`` cannot rot: a short run makes its creates at 1 live and beside a few, on a
real host agent, and writes both marks with their ratio (never judged)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_agent_growth_bench_measures_both_marks(tmp_path: Path) -> None:
    done = run_bench("agent_growth", "--live", "3", "--creates", "2", "--out", str(tmp_path), timeout=300)
    rows = re.findall(r"^\| (1 live|3 live) \| (\d+\.\d\d) \| (\d+\.\d\d) \|$", done.stdout, re.M)
    assert [mark for mark, *_ in rows] == ["1 live", "3 live"], done.stdout
    assert all(float(p50) > 0 for _, p50, _ in rows), done.stdout
    assert re.search(r"^\| ratio \(goal ≤ 1\.3× / ≤ 2×\) \| \d+\.\d\d× \| \d+\.\d\d× \|$", done.stdout, re.M)
    [kept] = tmp_path.glob("agent-growth-*.json")
    results = json.loads(kept.read_text())
    assert results["at_one"]["n"] == 2 and results["at_many"]["n"] == 2
