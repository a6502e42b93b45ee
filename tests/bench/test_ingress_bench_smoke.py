"""``bench/ingress_bench.py`` cannot rot: a short run measures both paths and writes every row.

Asserts that the harness works (both paths answered every request, the download and upload arrived whole), never a
time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.bench import run_bench

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sandboxes)")
def test_ingress_bench_measures_the_proxy_against_direct(tmp_path: Path) -> None:
    out = tmp_path / "ingress.json"
    done = run_bench(
        "ingress_bench", "--requests", "20", "--transfer-mib", "2", "--json", str(out), timeout=280
    )
    results = json.loads(out.read_text())
    for path in ("direct", "proxy"):
        assert results[f"keep-alive GET, {path}"]["n"] == 20
        assert results[f"new connection GET, {path}"]["n"] == 50
        assert results[f"upload 2 MiB, {path}"]["mib_per_s"] > 0
        assert results[f"download 2 MiB, {path}"]["mib_per_s"] > 0
    assert "added by the proxy, keep-alive GET: p50" in done.stdout
