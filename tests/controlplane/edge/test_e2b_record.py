"""E2B's ``SandboxRecord`` of a run (``schemas.record``): when it ended, and which of its data are still
kept. The live test (tests/e2b/test_api_sandboxes.py) reads it through SDK 2.64's generated client."""

from __future__ import annotations

import datetime as dt

import pytest

from paddock_controlplane.edge.e2b.schemas import record
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.settings import ControlPlaneSettings

CREATED = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
RUNNING = CREATED + dt.timedelta(seconds=1)
ENDED = CREATED + dt.timedelta(hours=1)
WEEK = dt.timedelta(days=7)
DAY = dt.timedelta(days=1)
KEPT = {"monitoring_kept": DAY, "events_kept": WEEK}


def a_run(status: SandboxStatus, destroyed_at: dt.datetime | None = None) -> Sandbox:
    return Sandbox(
        id="sb-01jrecord",
        status=status,
        vcpu=2,
        mem_mib=2048,
        disk_mib=10240,
        created_at=CREATED,
        running_at=RUNNING,
        destroyed_at=destroyed_at,
    )


@pytest.mark.parametrize("status", [SandboxStatus.RUNNING, SandboxStatus.PAUSED, SandboxStatus.CREATING])
def test_a_run_not_ended_keeps_everything(status: SandboxStatus) -> None:
    view = record(a_run(status), "base", ControlPlaneSettings(), ENDED + 2 * WEEK, **KEPT)
    assert view["stoppedAt"] is None and view["startedAt"] == "2026-12-01T10:00:01.000Z"
    assert (view["retentionExpired"], view["eventsRetentionExpired"]) == (False, False)
    assert (view["cpuCount"], view["memoryMB"], view["diskSizeMB"]) == (2, 2048, 10240)
    assert view["templateID"] == view["alias"] == "base" and view["sandboxID"] == "sb-01jrecord"


def test_an_ended_run_keeps_its_metrics_a_day_and_its_events_for_the_audit_trails_retention() -> None:
    killed = a_run(SandboxStatus.DESTROYED, ENDED)

    def kept_at(now: dt.datetime) -> tuple[bool, bool]:
        view = record(killed, "base", ControlPlaneSettings(), now, **KEPT)
        assert view["stoppedAt"] == "2026-12-01T11:00:00.000Z"
        return view["retentionExpired"], view["eventsRetentionExpired"]

    assert kept_at(ENDED + DAY - dt.timedelta(minutes=1)) == (False, False)
    assert kept_at(ENDED + DAY + dt.timedelta(minutes=1)) == (True, False)
    assert kept_at(ENDED + WEEK - dt.timedelta(minutes=1)) == (True, False)
    assert kept_at(ENDED + WEEK + dt.timedelta(minutes=1)) == (True, True)


@pytest.mark.parametrize("status", [SandboxStatus.FAILED, SandboxStatus.ERROR, SandboxStatus.DESTROYING])
def test_a_run_that_failed_or_is_going_has_ended_even_without_a_destroy_time(status: SandboxStatus) -> None:
    view = record(
        a_run(status), "base", ControlPlaneSettings(), RUNNING + DAY + dt.timedelta(minutes=1), **KEPT
    )
    assert view["stoppedAt"] == "2026-12-01T10:00:01.000Z" and view["retentionExpired"] is True
