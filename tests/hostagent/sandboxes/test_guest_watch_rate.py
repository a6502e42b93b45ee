"""The self-signal watcher beside 1,000 sandboxes (issue #36): it asks each running guest for a new
self-signal (spec 12.4) every ``guest_poll_interval_s``, but never more than ``GUEST_POLLS_PER_S`` guests
a second on average. Asking 1,000 guests every second took ~11 % of the agent's event loop at 1,000 idle
sandboxes; a few hundred sandboxes are still asked every interval, and a self-signal is still acted on.

The guest is the unit seam; tests/integration and tests/isolation send real self-signals on every tier."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord
from paddock_hostagent.guest.client import GuestInfo
from paddock_hostagent.sandboxes.heartbeat import GUEST_POLLS_PER_S, Heartbeat, guest_poll_pause_s
from paddock_hostagent.sandboxes.registry import Entry, Registry
from paddock_hostagent.settings import HostAgentSettings

INTERVAL_S = 0.05


class _Guests:
    """Every sandbox's guest: counts the INFOs it is asked, and has a self-signal for the ones told to."""

    name = "oci"

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.signal: dict[str, str] = {}

    def guest(self, record: SandboxRecord) -> Any:
        async def info() -> GuestInfo:
            self.asked[record.id] = self.asked.get(record.id, 0) + 1
            action = self.signal.get(record.id)
            return GuestInfo(
                last_activity_at=0.0,
                active_requests=0,
                version=1,
                self_seq=1 if action else 0,
                self_action=action,
                self_reason="done" if action else "",
            )

        return SimpleNamespace(info=info)


class _Records:
    def __init__(self) -> None:
        self.saved: list[str] = []

    def save(self, record: SandboxRecord) -> None:
        self.saved.append(record.id)


def _watcher(tmp_path: Path, live: int) -> tuple[Heartbeat, _Guests, _Records]:
    guests, records = _Guests(), _Records()
    settings = HostAgentSettings(
        state_dir=tmp_path, total_mib=64 * 1024, memory_overcommit=16, guest_poll_interval_s=INTERVAL_S
    )
    registry = Registry(settings, guests, images=None, records=records)  # type: ignore[arg-type]
    for n in range(live):
        record = SandboxRecord(
            id=f"sb-{n:05d}", name=f"s{n}", image="debian:13", vcpu=1, mem_mib=16, disk_mib=2048,
            cpu_quota_pct=None, ip="", state=RuntimeState.RUNNING, driver="oci", driver_state={},
        )  # fmt: skip
        registry.entries[record.id] = Entry(record)
    return Heartbeat(registry, traffic=None, disks=None), guests, records  # type: ignore[arg-type]


async def _watch_for(heartbeat: Heartbeat, seconds: float) -> None:
    task = asyncio.create_task(heartbeat.watch_guests())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_the_pause_after_a_pass_bounds_the_guests_asked_a_second() -> None:
    assert guest_poll_pause_s(1.0, 10, 0.001) == 1.0  # few sandboxes: the configured interval
    assert guest_poll_pause_s(1.0, 10, 3.0) == 3.0  # a pass slower than that: as long as the pass
    # 1,000 sandboxes: a pass and its pause take 1,000 / GUEST_POLLS_PER_S seconds together.
    assert guest_poll_pause_s(1.0, 1000, 0.1) + 0.1 == pytest.approx(1000 / GUEST_POLLS_PER_S)


async def test_beside_a_thousand_sandboxes_each_guest_is_asked_once_in_a_pause_not_every_interval(
    tmp_path: Path,
) -> None:
    heartbeat, guests, _ = _watcher(tmp_path, 1000)
    await _watch_for(heartbeat, 1.0)  # twenty intervals: asking every interval is 20 INFOs a guest
    assert len(guests.asked) == 1000, "the first pass asks every running guest"
    assert max(guests.asked.values()) == 1, "a guest was asked again before 1,000 / 250 s had passed"


async def test_beside_a_few_sandboxes_each_guest_is_still_asked_every_interval(tmp_path: Path) -> None:
    heartbeat, guests, _ = _watcher(tmp_path, 10)
    await _watch_for(heartbeat, 1.0)
    assert len(guests.asked) == 10
    # One second at a 0.05 s interval: ~20 passes, fewer on a loaded box, never the one of a cap.
    assert min(guests.asked.values()) >= 5, guests.asked


async def test_a_self_signal_is_still_taken_up_beside_a_thousand_sandboxes(tmp_path: Path) -> None:
    heartbeat, guests, records = _watcher(tmp_path, 1000)
    guests.signal["sb-00999"] = "pause"
    await _watch_for(heartbeat, 0.5)
    request = heartbeat.registry.entries["sb-00999"].record.self_request
    assert request == {"action": "pause", "reason": "done", "seq": 1}
    assert records.saved == ["sb-00999"]
