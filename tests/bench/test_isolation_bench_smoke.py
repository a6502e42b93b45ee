"""``bench/isolation_bench.py`` cannot rot: one round per tier measures every operation and its floor.

Asserts that the harness works (each tier ran, every operation has its sample, the raw runtime's too,
the host advertised the tier), never a time.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]

TIERS = {"crun": ("crun", "container"), "gvisor": ("runsc", "gvisor")}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes)")
@pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc is not installed")
def test_isolation_bench_measures_each_tier_against_its_raw_runtime(tmp_path: Path) -> None:
    out = tmp_path / "isolation.json"
    argv = ["--runs", "1", "--warmup", "0", "--tiers", ",".join(TIERS), "--json", str(out)]
    done = run_bench("isolation_bench", *argv, timeout=280)
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    for tier, (runtime, isolation) in TIERS.items():
        data = result["tiers"][tier]
        assert data["runtime"] == runtime
        assert data["labels"]["paddock.io/isolation"] == isolation, data["labels"]
        for op in ("create", "exec", "pause", "resume", "fork", "destroy"):
            assert data["paddock"][op]["n"] >= 1 and data["paddock"][op]["p50"] > 0, (tier, op)
        for op in ("create", "exec", "pause", "resume", "destroy"):
            assert data["floor"][op]["n"] >= 1 and data["floor"][op]["p50"] > 0, (tier, op)
    assert "| gvisor (runsc) | create |" in done.stdout
