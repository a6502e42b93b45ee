"""Machine facts recorded next to every result: CPU, kernel, memory, runtime versions, git sha, load."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _first_line(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0] if out else None


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def git_sha() -> str:
    sha = _first_line(["git", "-C", str(REPO), "rev-parse", "HEAD"]) or "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return sha + ("-dirty" if dirty else "")


def facts() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "mem_total_mib": meminfo_kib("MemTotal") // 1024,
        "kernel": platform.release(),
        "os": _first_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "python": sys.version.split()[0],
        "runc": _first_line(["runc", "--version"]),
        "crun": _first_line(["crun", "--version"]),
        "podman": _first_line(["podman", "--version"]),
        "wrk": _first_line(["sh", "-c", "wrk -v 2>&1 | head -1 | cut -d' ' -f1-2"]),
        "git_sha": git_sha(),
        "load_average_start": load_average(),
    }
