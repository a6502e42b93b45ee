"""Percentiles and the per-operation sample sets every section records."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no samples."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else math.nan,
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


class Samples:
    """Millisecond samples per operation; ``recording`` is off during warm-up rounds."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.recording = True

    @contextmanager
    def time(self, op: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.add(op, (time.perf_counter() - started) * 1000)

    def add(self, op: str, ms: float) -> None:
        if self.recording:
            self.values.setdefault(op, []).append(ms)

    def summary(self) -> dict[str, dict[str, Any]]:
        return {op: summarize(values) for op, values in self.values.items()}
