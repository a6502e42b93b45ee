"""Per-sandbox metrics in the control plane (issue #35) on both engines: the samples' window, the
one-minute rollups and the retention (records/sandbox_metrics.py), and the routes over them with the
worker's pull from a host (the fake host as the seam; tests/observability/test_sandbox_metrics_live.py
pulls real sandboxes' stats from a real host agent)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.records import sandbox_metrics
from paddock_controlplane.records.sandbox_metrics import MINUTE, RAW, SandboxMetricSample
from paddock_controlplane.workers.sandbox_metrics import MetricsWorker
from paddock_core.db import make_engine, make_sessionmaker, transaction, upgrade
from paddock_core.timeutil import as_utc
from paddock_hostagent.schemas import HostStats, SandboxStats
from tests.controlplane.conftest import Clocked, user_client

pytestmark = pytest.mark.db

T = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
GIB = 1 << 30


def raw(sandbox_id: str, at: dt.datetime, cpu_pct: float, **values: int) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox_id,
        "at": at,
        "user_id": "usr_metrics",
        "vcpu": values.get("vcpu", 2),
        "cpu_pct": cpu_pct,
        "mem_used_bytes": values.get("mem", 100),
        "mem_limit_bytes": GIB,
        "disk_used_bytes": values.get("disk", 1000),
        "disk_limit_bytes": 10 * GIB,
        "net_rx_bytes": values.get("rx", 0),
        "net_tx_bytes": values.get("tx", 0),
    }


@pytest.fixture
async def sessions(cp_database_url: str) -> AsyncIterator[Any]:
    await upgrade(MIGRATIONS, cp_database_url)
    engine = make_engine(cp_database_url)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


async def test_raw_samples_roll_up_by_minute_and_expire(sessions: Any) -> None:
    # Two hours of samples every 10 s, ending at T: CPU counts 0..59 in each minute's six samples
    # (0,10,...,50 + the minute), memory rises by one per sample, the counters grow.
    start = T - dt.timedelta(hours=2)
    rows = []
    for i in range(2 * 360 + 1):
        at = start + dt.timedelta(seconds=10 * i)
        rows.append(raw("sb_a", at, float(at.second), mem=i, disk=2 * i, rx=100 * i, tx=7 * i))
    async with transaction(sessions) as session:
        await sandbox_metrics.store(session, rows)
        # Another process's pull of the same instant is skipped, not a second row or an error.
        await sandbox_metrics.store(session, [raw("sb_a", T, 99.0, mem=-1)])
        written = await sandbox_metrics.roll_up(session, T, settle_s=15)
        again = await sandbox_metrics.roll_up(session, T, settle_s=15)
        await sandbox_metrics.prune(session, T)

    # Minutes that ended 15 s before T at the latest: 11:59 ended at T, so 10:00 to 11:58.
    assert written == 119 and again == 0
    async with sessions() as session:
        interval, latest, samples = await sandbox_metrics.window(session, "sb_a", T, 300, 10.0)
        raw_left = await session.scalar(select(func.count()).where(SandboxMetricSample.bucket_s == RAW))
        oldest_raw = await session.scalar(
            select(func.min(SandboxMetricSample.at)).where(SandboxMetricSample.bucket_s == RAW)
        )
        minute = (
            await session.scalars(
                select(SandboxMetricSample).where(
                    SandboxMetricSample.bucket_s == MINUTE,
                    SandboxMetricSample.at == dt.datetime(2026, 3, 1, 10, 30, tzinfo=dt.UTC),
                )
            )
        ).one()
        day_interval, _, day = await sandbox_metrics.window(session, "sb_a", T, 86400, 10.0)

    assert interval == 10.0
    assert [as_utc(s.at) for s in samples] == [T - dt.timedelta(seconds=s) for s in range(290, -10, -10)]
    assert latest is not None and latest.mem_used_bytes == 720, "the first sample at T stayed"
    # An hour of raw samples is kept (at T - 1 h and later), older ones are deleted.
    assert raw_left == 361
    assert sandbox_metrics.snap(oldest_raw, 1) == T - dt.timedelta(hours=1)
    # 10:30 holds the samples of 10:30:00..10:30:50 (i = 180..185): gauges averaged, counters last.
    assert minute.samples == 6
    assert minute.cpu_pct == 25.0
    assert minute.mem_used_bytes == round(sum(range(180, 186)) / 6)
    assert minute.disk_used_bytes == round(sum(range(360, 372, 2)) / 6)
    assert (minute.net_rx_bytes, minute.net_tx_bytes) == (100 * 185, 7 * 185)
    assert minute.mem_limit_bytes == GIB and minute.vcpu == 2
    # Past an hour the window reads the rollups: one a minute, oldest first.
    assert day_interval == 60.0
    assert len(day) == 119 and day[0].at < day[-1].at and all(s.bucket_s == MINUTE for s in day)

    # A day later the rollups are gone too.
    async with transaction(sessions) as session:
        await sandbox_metrics.prune(session, T + dt.timedelta(hours=25))
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(SandboxMetricSample)) == 0


async def test_the_account_series_sums_its_sandboxes_at_each_instant(sessions: Any) -> None:
    async with transaction(sessions) as session:
        await sandbox_metrics.store(
            session,
            [
                raw("sb_a", T - dt.timedelta(seconds=20), 50.0, vcpu=1, mem=10),
                raw("sb_a", T - dt.timedelta(seconds=10), 100.0, vcpu=1, mem=20),
                raw("sb_b", T - dt.timedelta(seconds=10), 25.0, vcpu=3, mem=5),
                raw("sb_b", T - dt.timedelta(seconds=400), 25.0, vcpu=3, mem=5),  # outside the window
            ],
        )
    async with sessions() as session:
        interval, points = await sandbox_metrics.account_series(session, "usr_metrics", T, 300, 10.0)
        now = await sandbox_metrics.account_now(session, "usr_metrics", ["sb_a", "sb_b"], T, 30)
        alone = await sandbox_metrics.account_now(session, "usr_metrics", ["sb_b"], T, 30)
    assert interval == 10.0
    assert [(p["sandboxes"], p["vcpu"], p["mem_used_bytes"]) for p in points] == [(1, 1, 10), (2, 4, 25)]
    # 1 vCPU at 100% and 3 at 25%: 1.75 of 4 CPUs.
    assert points[1]["cpu_pct"] == 43.75
    assert now["sandboxes"] == 2 and now["cpu_pct"] == 43.75 and now["mem_used_bytes"] == 25
    assert now["at"] == "2026-03-01T11:59:50.000Z"
    assert alone["sandboxes"] == 1 and alone["running_sandboxes"] == 1 and alone["cpu_pct"] == 25.0


# -- the worker and the routes ---------------------------------------------------------------------


@pytest.fixture
def _no_background_pulls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests drive the worker's passes themselves, at instants of the fake clock."""
    monkeypatch.setattr(MetricsWorker, "start", lambda self: None)


def host_stats(sandbox_id: str, cpu_pct: float | None, mem: int) -> HostStats:
    sample = SandboxStats(
        id=sandbox_id,
        status="running",
        vcpu=1,
        cpu_usage_ns=0,
        cpu_pct=cpu_pct,
        mem_used_bytes=mem,
        mem_limit_bytes=GIB,
        disk_used_bytes=5 << 20,
        disk_limit_bytes=10 * GIB,
        net_rx_bytes=1234,
        net_tx_bytes=567,
    )
    other = sample.model_copy(update={"id": "sb_not_placed_here"})  # the host's, not in the database
    return HostStats(at=0.0, took_ms=0.1, sandboxes=[sample, other])


@pytest.mark.usefixtures("_no_background_pulls")
async def test_the_worker_pulls_and_the_routes_answer(
    clocked: Clocked, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, http = await user_client(clocked)
    _, stranger = await user_client(clocked)
    async with http, stranger:
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        readings = iter([host_stats(sid, None, 1), host_stats(sid, 10.0, 100), host_stats(sid, 90.0, 300)])

        async def stats() -> HostStats:
            return next(readings)

        monkeypatch.setattr(clocked.host, "stats", stats, raising=False)
        worker = MetricsWorker(clocked.services)
        empty = (await http.get(f"/v1/sandboxes/{sid}/metrics")).json()["data"]
        assert empty == {"sandbox_id": sid, "interval_s": 10, "latest": None, "samples": []}
        stored = []
        for _ in range(3):
            stored.append(await worker.run_once())
            clocked.clock.advance(10)
        # The first reading has no CPU interval yet and is not stored; another host's sandbox never is.
        assert stored == [0, 1, 1]

        answer = await http.get(f"/v1/sandboxes/{sid}/metrics", params={"window_s": 60})
        assert answer.status_code == 200
        body = answer.json()
        assert body["status"] == "success"
        data = body["data"]
        assert data["sandbox_id"] == sid and data["interval_s"] == 10
        assert [s["cpu_pct"] for s in data["samples"]] == [10.0, 90.0]
        assert data["latest"] == data["samples"][-1]
        assert data["latest"] == {
            "at": data["latest"]["at"],
            "cpu_pct": 90.0,
            "mem_used_bytes": 300,
            "mem_limit_bytes": GIB,
            "disk_used_bytes": 5 << 20,
            "disk_limit_bytes": 10 * GIB,
            "net_rx_bytes": 1234,
            "net_tx_bytes": 567,
        }
        first, second = (dt.datetime.fromisoformat(s["at"]) for s in data["samples"])
        assert (second - first).total_seconds() == 10

        # A window that no longer reaches the samples has none, but still the latest.
        clocked.clock.advance(600)
        later = (await http.get(f"/v1/sandboxes/{sid}/metrics")).json()["data"]
        assert later["samples"] == [] and later["latest"]["cpu_pct"] == 90.0
        clocked.clock.advance(-600)

        for bad in ("0", "86401", "abc", "-5", "1.5"):
            refused = await http.get(f"/v1/sandboxes/{sid}/metrics", params={"window_s": bad})
            assert refused.status_code == 400, bad
            assert refused.json()["status"] == "fail" and "window_s" in refused.json()["data"], bad
        assert (await http.get("/v1/metrics/timeseries", params={"window_s": "0"})).status_code == 400

        # Another account's key cannot see the sandbox's metrics, nor tell it exists.
        hidden = await stranger.get(f"/v1/sandboxes/{sid}/metrics")
        assert hidden.status_code == 404
        assert (await http.get("/v1/sandboxes/sb_nonexistent/metrics")).status_code == 404

        # The sandbox's access token reads its metrics; a token of another sandbox gets 404, and the
        # account-level routes are not a token's (403).
        other = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        tokens = []
        for owner in (sid, other):
            issued = await http.post(f"/v1/sandboxes/{owner}/access-token")
            assert issued.status_code == 200, issued.text
            tokens.append({"X-Api-Key": issued.json()["data"]["token"]})
        own = await http.get(f"/v1/sandboxes/{sid}/metrics", params={"window_s": 60}, headers=tokens[0])
        assert own.status_code == 200 and own.json()["data"]["samples"] == data["samples"]
        assert (await http.get(f"/v1/sandboxes/{sid}/metrics", headers=tokens[1])).status_code == 404
        assert (await http.get("/v1/metrics", headers=tokens[0])).status_code == 403

        # The account: its one running sandbox's newest sample, and its series.
        totals = (await http.get("/v1/metrics")).json()["data"]
        assert totals["running_sandboxes"] == 2 and totals["sandboxes"] == 1
        assert totals["cpu_pct"] == 90.0 and totals["mem_used_bytes"] == 300 and totals["vcpu"] == 1
        series = (await http.get("/v1/metrics/timeseries", params={"window_s": 600})).json()["data"]
        assert series["interval_s"] == 10
        assert [p["mem_used_bytes"] for p in series["samples"]] == [100, 300]
        nothing = (await stranger.get("/v1/metrics")).json()["data"]
        assert nothing["running_sandboxes"] == 0 and nothing["sandboxes"] == 0 and nothing["at"] is None
        assert (await stranger.get("/v1/metrics/timeseries")).json()["data"]["samples"] == []
