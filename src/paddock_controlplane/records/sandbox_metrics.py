"""The table of per-sandbox metric samples (issue #35), on the control plane's declarative ``Base``.

One row per sandbox, resolution and instant: ``bucket_s`` 0 is a raw sample as the metrics worker
pulled it from the sandbox's host (kept ``RAW_RETENTION_S``), ``bucket_s`` 60 a one-minute rollup of the
raw samples of that minute (kept ``ROLLUP_RETENTION_S``): CPU, memory and disk used averaged, limits and
the cumulative network counters at their last value, ``samples`` the number of raw samples it covers.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import BigInteger, Float, Index, Integer, String, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base
from paddock_core.timeutil import as_utc, rfc3339

RAW = 0
MINUTE = 60
#: Raw samples are kept an hour, one-minute rollups a day; older rows are deleted by the worker.
RAW_RETENTION_S = 3600
ROLLUP_RETENTION_S = 86400
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class SandboxMetricSample(Base):
    __tablename__ = "sandbox_metric_samples"
    __table_args__ = (
        Index("ix_sandbox_metric_samples_user", "user_id", "bucket_s", "at"),
        Index("ix_sandbox_metric_samples_age", "bucket_s", "at"),
    )

    sandbox_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    bucket_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(String(40))
    samples: Mapped[int] = mapped_column(Integer)
    vcpu: Mapped[int] = mapped_column(Integer)
    cpu_pct: Mapped[float] = mapped_column(Float)
    mem_used_bytes: Mapped[int] = mapped_column(BigInteger)
    mem_limit_bytes: Mapped[int] = mapped_column(BigInteger)
    disk_used_bytes: Mapped[int] = mapped_column(BigInteger)
    disk_limit_bytes: Mapped[int] = mapped_column(BigInteger)
    net_rx_bytes: Mapped[int] = mapped_column(BigInteger)
    net_tx_bytes: Mapped[int] = mapped_column(BigInteger)


#: The columns of a sample as the API shows them (``Sample`` in docs/observability.md).
GAUGES = ("cpu_pct", "mem_used_bytes", "disk_used_bytes")
LAST_VALUES = ("vcpu", "mem_limit_bytes", "disk_limit_bytes", "net_rx_bytes", "net_tx_bytes")
SAMPLE_FIELDS = (
    "cpu_pct",
    "mem_used_bytes",
    "mem_limit_bytes",
    "disk_used_bytes",
    "disk_limit_bytes",
    "net_rx_bytes",
    "net_tx_bytes",
)


def fresh_s(interval_s: float) -> float:
    """How old a sandbox's newest sample may be and still say what it uses now: three missed pulls, or
    30 s (a host's stats call can take seconds under load)."""
    return max(3 * interval_s, 30.0)


def snap(at: dt.datetime, interval_s: float) -> dt.datetime:
    """``at`` down to the ``interval_s`` grid (whole microseconds since the epoch), so that samples
    pulled in one pass share one instant and two processes pulling in the same interval write one row."""
    step = max(int(interval_s * 1_000_000), 1)
    micros = int(as_utc(at).timestamp() * 1_000_000) // step * step
    return EPOCH + dt.timedelta(microseconds=micros)


def minute_of(at: dt.datetime) -> dt.datetime:
    return as_utc(at).replace(second=0, microsecond=0)


async def _insert_ignoring_duplicates(session: AsyncSession, rows: list[dict[str, Any]]) -> None:
    """One statement with the rows as its parameter sets (compiled once and cached), not a statement
    with every row in its VALUES: at 1,000 sandboxes that was compiled anew at each pass, 0.2-0.4 s of
    the event loop's time and 1.3-2 s with SQLite's write lock held, every 10 s (a create arriving then
    waited that long)."""
    if not rows:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    await session.execute(dialect.insert(SandboxMetricSample).on_conflict_do_nothing(), rows)


async def store(session: AsyncSession, rows: list[dict[str, Any]]) -> None:
    """Inserts raw samples (dicts of the table's columns but ``bucket_s`` and ``samples``); a sample of
    a sandbox already recorded at that instant (another process's pull) is skipped."""
    await _insert_ignoring_duplicates(session, [{**row, "bucket_s": RAW, "samples": 1} for row in rows])


async def roll_up(session: AsyncSession, now: dt.datetime, settle_s: float) -> int:
    """Writes the one-minute rollups of every minute that ended at least ``settle_s`` ago and has none
    yet (those after the newest rollup), from the raw samples; returns how many rows it wrote. Gauges
    are averaged, limits and cumulative counters take the minute's last value."""
    newest = await session.scalar(
        select(func.max(SandboxMetricSample.at)).where(SandboxMetricSample.bucket_s == MINUTE)
    )
    until = minute_of(now - dt.timedelta(seconds=settle_s))
    since = as_utc(newest) + dt.timedelta(seconds=MINUTE) if newest is not None else None
    query = select(SandboxMetricSample).where(
        SandboxMetricSample.bucket_s == RAW, SandboxMetricSample.at < until
    )
    if since is not None:
        if since >= until:
            return 0
        query = query.where(SandboxMetricSample.at >= since)
    groups: dict[tuple[str, dt.datetime], list[SandboxMetricSample]] = {}
    for row in (await session.scalars(query.order_by(SandboxMetricSample.at))).all():
        groups.setdefault((row.sandbox_id, minute_of(row.at)), []).append(row)
    rollups = []
    for (sandbox_id, minute), rows in groups.items():
        last = rows[-1]
        rollup: dict[str, Any] = {
            "sandbox_id": sandbox_id,
            "bucket_s": MINUTE,
            "at": minute,
            "user_id": last.user_id,
            "samples": len(rows),
            "cpu_pct": round(sum(row.cpu_pct for row in rows) / len(rows), 2),
        }
        for name in ("mem_used_bytes", "disk_used_bytes"):
            rollup[name] = round(sum(getattr(row, name) for row in rows) / len(rows))
        for name in LAST_VALUES:
            rollup[name] = getattr(last, name)
        rollups.append(rollup)
    for start in range(0, len(rollups), 500):  # bounded batches whatever the number of sandboxes
        await _insert_ignoring_duplicates(session, rollups[start : start + 500])
    return len(rollups)


async def prune(session: AsyncSession, now: dt.datetime) -> None:
    """Deletes raw samples older than ``RAW_RETENTION_S`` and rollups older than ``ROLLUP_RETENTION_S``."""
    for bucket, keep_s in ((RAW, RAW_RETENTION_S), (MINUTE, ROLLUP_RETENTION_S)):
        await session.execute(
            delete(SandboxMetricSample).where(
                SandboxMetricSample.bucket_s == bucket,
                SandboxMetricSample.at < now - dt.timedelta(seconds=keep_s),
            )
        )


def resolution(window_s: int, interval_s: float) -> tuple[int, float]:
    """The rows a window is answered from: raw samples (every ``interval_s``) for up to an hour, else
    the one-minute rollups. Returns (bucket_s, interval_s of the answer)."""
    if window_s <= RAW_RETENTION_S:
        return RAW, interval_s
    return MINUTE, float(MINUTE)


def sample_view(row: SandboxMetricSample) -> dict[str, Any]:
    view: dict[str, Any] = {"at": rfc3339(as_utc(row.at))}
    for name in SAMPLE_FIELDS:
        view[name] = getattr(row, name)
    return view


async def window(
    session: AsyncSession, sandbox_id: str, now: dt.datetime, window_s: int, interval_s: float
) -> tuple[float, SandboxMetricSample | None, list[SandboxMetricSample]]:
    """(interval_s, the newest sample kept, the samples of the last ``window_s`` oldest first)."""
    bucket, step = resolution(window_s, interval_s)
    rows = (
        await session.scalars(
            select(SandboxMetricSample)
            .where(
                SandboxMetricSample.sandbox_id == sandbox_id,
                SandboxMetricSample.bucket_s == bucket,
                SandboxMetricSample.at > now - dt.timedelta(seconds=window_s),
            )
            .order_by(SandboxMetricSample.at)
        )
    ).all()
    latest = None
    for newest_of in (RAW, MINUTE):
        latest = (
            await session.scalars(
                select(SandboxMetricSample)
                .where(
                    SandboxMetricSample.sandbox_id == sandbox_id, SandboxMetricSample.bucket_s == newest_of
                )
                .order_by(SandboxMetricSample.at.desc())
                .limit(1)
            )
        ).first()
        if latest is not None:
            break
    return step, latest, list(rows)


async def between(
    session: AsyncSession, sandbox_id: str, start: dt.datetime, end: dt.datetime, now: dt.datetime
) -> list[SandboxMetricSample]:
    """The samples of ``[start, end]``, oldest first: raw ones when the raw samples still cover
    ``start``, else the one-minute rollups."""
    recent = as_utc(start) >= now - dt.timedelta(seconds=RAW_RETENTION_S)
    rows = await session.scalars(
        select(SandboxMetricSample)
        .where(
            SandboxMetricSample.sandbox_id == sandbox_id,
            SandboxMetricSample.bucket_s == (RAW if recent else MINUTE),
            SandboxMetricSample.at >= start,
            SandboxMetricSample.at <= end,
        )
        .order_by(SandboxMetricSample.at)
    )
    return list(rows.all())


def _total(rows: list[SandboxMetricSample]) -> dict[str, Any]:
    """Sums over several sandboxes' samples; ``cpu_pct`` is of their CPUs together."""
    vcpu = sum(row.vcpu for row in rows)
    used_cpus = sum(row.cpu_pct * row.vcpu for row in rows)
    total: dict[str, Any] = {
        "sandboxes": len(rows),
        "vcpu": vcpu,
        "cpu_pct": round(used_cpus / vcpu, 2) if vcpu else 0.0,
    }
    for name in SAMPLE_FIELDS[1:]:
        total[name] = sum(getattr(row, name) for row in rows)
    return total


async def newest(
    session: AsyncSession, user_id: str, sandbox_ids: list[str], since: dt.datetime
) -> dict[str, SandboxMetricSample]:
    """Each of ``sandbox_ids``' newest raw sample taken since ``since``, by sandbox; a sandbox with none
    is left out. One grouped query, so its cost is the ids', not the hour of raw samples they hold."""
    if not sandbox_ids:
        return {}
    raw = SandboxMetricSample
    latest = (
        select(raw.sandbox_id, func.max(raw.at).label("at"))
        .where(raw.user_id == user_id, raw.bucket_s == RAW, raw.sandbox_id.in_(sandbox_ids), raw.at >= since)
        .group_by(raw.sandbox_id)
        .subquery()
    )
    rows = await session.scalars(
        select(raw)
        .join(latest, (raw.sandbox_id == latest.c.sandbox_id) & (raw.at == latest.c.at))
        .where(raw.bucket_s == RAW)
    )
    return {row.sandbox_id: row for row in rows.all()}


async def account_now(
    session: AsyncSession, user_id: str, running_ids: list[str], now: dt.datetime, fresh_s: float
) -> dict[str, Any]:
    """The account's totals over its running sandboxes' newest samples no older than ``fresh_s``."""
    latest = await newest(session, user_id, running_ids, now - dt.timedelta(seconds=fresh_s))
    at = max((as_utc(row.at) for row in latest.values()), default=None)
    return {
        "at": rfc3339(at) if at else None,
        "running_sandboxes": len(running_ids),
        **_total(list(latest.values())),
    }


async def account_series(
    session: AsyncSession, user_id: str, now: dt.datetime, window_s: int, interval_s: float
) -> tuple[float, list[dict[str, Any]]]:
    """The account's sums at each instant of the window (every sandbox sampled then), oldest first."""
    bucket, step = resolution(window_s, interval_s)
    rows = await session.scalars(
        select(SandboxMetricSample)
        .where(
            SandboxMetricSample.user_id == user_id,
            SandboxMetricSample.bucket_s == bucket,
            SandboxMetricSample.at > now - dt.timedelta(seconds=window_s),
        )
        .order_by(SandboxMetricSample.at)
    )
    instants: dict[dt.datetime, list[SandboxMetricSample]] = {}
    for row in rows.all():
        instants.setdefault(as_utc(row.at), []).append(row)
    return step, [{"at": rfc3339(at), **_total(group)} for at, group in instants.items()]
