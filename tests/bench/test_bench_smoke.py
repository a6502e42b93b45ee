"""The benchmark harness cannot rot: its smoke mode runs every section end to end and writes a full table.

Asserts only that the harness works (every section ran, every row has its samples, the files exist),
never a time: benchmarks do not fail a build on a number.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]

LIFECYCLE_OPS = ("create", "exec", "first_frame", "file_1mb", "file_big", "pause", "resume", "destroy")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes, mounts, cgroups)")
def test_smoke_run_measures_every_section_against_its_floor(tmp_path: Path) -> None:
    run_bench("run", "--smoke", "--out", str(tmp_path), timeout=280)
    [result_json] = tmp_path.glob("*.json")
    [result_md] = tmp_path.glob("*.md")
    results = json.loads(result_json.read_text())
    assert results["mode"] == "smoke" and results["errors"] == {}
    assert results["machine"]["git_sha"] and results["machine"]["kernel"]

    life = results["sections"]["lifecycle"]
    for system in ("paddock", "hostagent", "runc", "crun", "podman"):
        for op in LIFECYCLE_OPS:
            expected = 3 * (3 if op == "exec" else 1)
            assert life[system][op]["n"] >= expected, (system, op, life[system][op])
            assert life[system][op]["p50"] > 0
    for system in ("paddock", "hostagent", "runc", "crun"):  # podman has no live fork
        assert life[system]["fork"]["n"] == 3

    forks = results["sections"]["fork"]
    for op in ("fork_settled_8", "fork_settled_32", "fork_fresh_8", "fork_files_500"):
        assert forks[op]["n"] == 1 and forks[op]["p50"] > 0, (op, forks)

    density = results["sections"]["density"]
    assert density["created"] == 3 and density["guest_agent_rss_mib"]["n"] == 3
    throughput = results["sections"]["throughput"]
    assert throughput["paddock"]["rps"] > 0 and throughput["floor"]["rps"] > 0
    assert throughput["paddock"]["non_2xx"] == 0
    hooks = results["sections"]["webhooks"]
    assert hooks["burst"]["n"] == 50 and hooks["steady"]["p99"] is not None
    gateway = results["sections"]["gateway"]
    assert gateway["quote"]["paddock"]["n"] == 10 and "pay_to" in gateway["quote"]["quote_fields"]
    assert gateway["verify"]["paddock"]["per_second"] > 0

    table = result_md.read_text()
    assert "## Headline: Paddock against the floor, same run" in table
    assert "| create → running (p50) |" in table and "Sections that failed" not in table
    assert "fork right after creating 500 files (fresh)" in table
