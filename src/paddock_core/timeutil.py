"""UTC clocks and RFC 3339 rendering used on every wire."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; treat them as the UTC they were stored as."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def rfc3339(value: dt.datetime, *, digits: int = 3) -> str:
    """``2026-01-01T00:00:00.123Z`` — 3 (or 6) fractional digits, ``Z`` suffix, as the contract asks."""
    value = as_utc(value)
    if digits == 0:
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    frac = f"{value.microsecond:06d}"[:digits]
    return value.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac}Z"


def start_of_utc_day(value: dt.datetime) -> dt.datetime:
    value = as_utc(value)
    return value.replace(hour=0, minute=0, second=0, microsecond=0)
