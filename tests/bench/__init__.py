"""The benches' smoke tests: each runs its bench briefly, as a user would, and reads what it printed
and wrote (never judging a time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_bench(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench.<module> <args>`` from the repository; it must exit 0 (else the tails of what it
    printed are the failure's message)."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done
