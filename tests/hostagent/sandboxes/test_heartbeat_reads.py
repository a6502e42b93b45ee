"""A heartbeat beside 1,000 sandboxes (issue #36): whether each sandbox still runs and its OOM kills are
read off the event loop before the beat, with its memory and disk use, instead of three file reads a
sandbox on the loop (~200 ms a beat there, during which no exec or create was served). What the beat
reports stays true: a stop is never reported from a stale read, and a sandbox not read yet is read.

The runtime is the unit seam; tests/integration/test_sandboxes.py sees a real sandbox's OOM kill and
stop reported through the heartbeat on every tier."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord
from paddock_hostagent.sandboxes.heartbeat import Heartbeat
from paddock_hostagent.sandboxes.registry import Entry, Registry
from paddock_hostagent.settings import HostAgentSettings

LIVE = 1000


class _Runtime:
    """Answers as a driver would, noting which thread asked (the loop's is the one that matters)."""

    name = "oci"

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.oom: dict[str, int] = {}
        self.on_loop: list[str] = []
        self.loop_thread = threading.get_ident()

    def _asked(self, what: str) -> None:
        if threading.get_ident() == self.loop_thread:
            self.on_loop.append(what)

    def probe(self, record: SandboxRecord) -> RuntimeState:
        self._asked(f"probe {record.id}")
        return RuntimeState.STOPPED if record.id in self.dead else RuntimeState.RUNNING

    def oom_kills(self, record: SandboxRecord) -> int:
        self._asked(f"oom_kills {record.id}")
        return self.oom.get(record.id, 0)

    def memory_usage_bytes(self, record: SandboxRecord) -> int:
        return 1 << 20

    def disk_usage_bytes(self, record: SandboxRecord) -> int:
        return 3 << 20


def _record(n: int) -> SandboxRecord:
    return SandboxRecord(
        id=f"sb-{n:05d}", name=f"s{n}", image="debian:13", vcpu=1, mem_mib=16, disk_mib=2048,
        cpu_quota_pct=None, ip="", state=RuntimeState.RUNNING, driver="oci", driver_state={},
    )  # fmt: skip


async def _no_counters() -> None:
    return None


@pytest.fixture
def beat(tmp_path: Path) -> tuple[Heartbeat, _Runtime]:
    runtime = _Runtime()
    settings = HostAgentSettings(state_dir=tmp_path, total_mib=64 * 1024, memory_overcommit=16)
    registry = Registry(settings, runtime, images=None, records=None)  # type: ignore[arg-type]
    for n in range(LIVE):
        registry.entries[f"sb-{n:05d}"] = Entry(_record(n))
    traffic: Any = SimpleNamespace(usage={}, egress=None, read_counters=_no_counters)
    return Heartbeat(registry, traffic, disks=None), runtime  # type: ignore[arg-type]


def _by_id(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {report["id"]: report for report in reports}


async def test_a_beat_after_the_read_reads_no_sandbox_on_the_loop(beat: tuple[Heartbeat, _Runtime]) -> None:
    heartbeat, runtime = beat
    runtime.oom["sb-00042"] = 3
    await heartbeat.refresh_usage()
    reports = _by_id(heartbeat.sandboxes())
    assert runtime.on_loop == [], f"{len(runtime.on_loop)} reads on the loop, e.g. {runtime.on_loop[:3]}"
    assert len(reports) == LIVE
    assert reports["sb-00042"]["oom_kills"] == 3 and reports["sb-00042"]["status"] == "running"
    assert heartbeat.registry.entries["sb-00042"].mem_used_bytes == 1 << 20


async def test_a_stop_the_read_saw_is_checked_on_the_loop_before_it_is_reported(
    beat: tuple[Heartbeat, _Runtime],
) -> None:
    heartbeat, runtime = beat
    runtime.dead = {"sb-00001", "sb-00002"}
    await heartbeat.refresh_usage()
    runtime.dead = {"sb-00001"}  # sb-00002's read was stale (its process seen between two states)
    reports = _by_id(heartbeat.sandboxes())
    assert sorted(runtime.on_loop) == [
        "oom_kills sb-00001", "oom_kills sb-00002", "probe sb-00001", "probe sb-00002",
    ]  # fmt: skip
    assert reports["sb-00001"]["status"] == "stopped"
    assert reports["sb-00002"]["status"] == "running"
    entries = heartbeat.registry.entries
    assert entries["sb-00001"].stopped and not entries["sb-00002"].stopped


async def test_a_sandbox_that_dies_after_the_read_is_reported_stopped_by_the_next_beat(
    beat: tuple[Heartbeat, _Runtime],
) -> None:
    heartbeat, runtime = beat
    await heartbeat.refresh_usage()
    runtime.dead = {"sb-00009"}
    assert _by_id(heartbeat.sandboxes())["sb-00009"]["status"] == "running"  # as read before the beat
    await heartbeat.refresh_usage()
    assert _by_id(heartbeat.sandboxes())["sb-00009"]["status"] == "stopped"


async def test_a_sandbox_created_since_the_read_is_read_on_the_loop(beat: tuple[Heartbeat, _Runtime]) -> None:
    heartbeat, runtime = beat
    await heartbeat.refresh_usage()
    new = _record(LIVE)
    heartbeat.registry.entries[new.id] = Entry(new)
    runtime.oom[new.id] = 1
    reports = _by_id(heartbeat.sandboxes())
    assert runtime.on_loop == [f"probe {new.id}", f"oom_kills {new.id}"]
    assert reports[new.id]["oom_kills"] == 1 and reports[new.id]["status"] == "running"
