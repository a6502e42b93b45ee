"""``bench/heartbeat_cost.py`` cannot rot: a short run builds the agent's beat both ways and folds a
beat on both engines, and prints every row with its ratio (never judged)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = pytest.mark.db


def test_heartbeat_bench_measures_both_sides(tmp_path: Path) -> None:
    done = run_bench(
        "heartbeat_cost", "--sandboxes", "50", "--beats", "2", "--out", str(tmp_path), timeout=240
    )
    rows = re.findall(r"^\| (agent|control plane): ([^|]+?) \| (\d+\.\d) \| (\d+\.\d) \|", done.stdout, re.M)
    assert [f"{side}: {what}" for side, what, *_ in rows] == [
        "agent: beat list, reads on the loop (before)",
        "agent: beat list after the off-loop read (now)",
        "agent: the read, in its thread (off the loop)",
        "control plane: fold, sqlite",
        "control plane: fold, postgresql",
    ], done.stdout
    assert all(float(p50) > 0 for *_, p50, _ in rows), done.stdout
    [kept] = tmp_path.glob("heartbeat-*.json")
    results = json.loads(kept.read_text())["results"]
    assert results["fold"]["postgresql"]["fold_ms"]["n"] == 2
