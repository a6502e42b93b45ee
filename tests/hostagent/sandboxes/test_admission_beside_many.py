"""Admission beside 1,000 sandboxes (issue #36): every create counts what each sandbox here promised and
uses, and making those 2,000 promises anew was most of what an admission cost there. A sandbox's
promises are made again only when its limit or its use changed, and what admission counts follows
every such change (a heartbeat's reading of its use, a resize)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent import capacity, errors
from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord
from paddock_hostagent.sandboxes import registry as registry_module
from paddock_hostagent.sandboxes.registry import Entry, Registry
from paddock_hostagent.settings import HostAgentSettings

LIVE = 1000
MIB = 1 << 20


class _Runtime:
    """The unit seam: the driver's answers admission reads (tests/hostagent/test_overcommit.py admits
    on a real agent)."""

    name = "oci"

    def disk_free_bytes(self) -> int:
        return 4 << 40  # 4 TiB: disk never limits here


def _record(n: int) -> SandboxRecord:
    return SandboxRecord(
        id=f"sb-{n:05d}", name=f"s{n}", image="debian:13", vcpu=1, mem_mib=16, disk_mib=2048,
        cpu_quota_pct=None, ip="", state=RuntimeState.RUNNING, driver="oci", driver_state={},
    )  # fmt: skip


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    settings = HostAgentSettings(
        state_dir=tmp_path, total_mib=64 * 1024, memory_overcommit=16, disk_overcommit=40
    )
    made = Registry(settings, _Runtime(), images=None, records=None)  # type: ignore[arg-type]
    for n in range(LIVE):
        entry = Entry(_record(n))
        entry.mem_used_bytes, entry.disk_used_bytes = MIB, 3 * MIB
        made.entries[entry.record.id] = entry
    return made


def test_a_create_beside_1000_sandboxes_makes_no_promise_anew(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.reserve("sb-first", 16, 2048)
    registry.release("sb-first")
    made: list[tuple[int, int]] = []

    class Counted(capacity.Promise):
        def __init__(self, limit_mib: int, used_bytes: int) -> None:
            made.append((limit_mib, used_bytes))
            super().__init__(limit_mib, used_bytes)

    monkeypatch.setattr(registry_module, "Promise", Counted)
    registry.reserve("sb-second", 16, 2048)
    registry.release("sb-second")
    assert made == [], f"{len(made)} promises made for one admission beside {LIVE} sandboxes"


def test_what_admission_counts_follows_each_sandboxs_use_and_size(registry: Registry) -> None:
    def counted(view: Any) -> tuple[int, int, int]:
        return (
            len(view.promises),
            sum(p.limit_mib for p in view.promises),
            sum(p.used_bytes for p in view.promises),
        )

    assert counted(registry.memory_view()) == (LIVE, LIVE * 16, LIVE * MIB)
    disk = registry.disk_view()
    assert disk is not None and counted(disk) == (LIVE, LIVE * 2048, LIVE * 3 * MIB)
    grown = registry.entries["sb-00007"]
    grown.mem_used_bytes = 9 * MIB  # a heartbeat's reading
    grown.disk_used_bytes = 100 * MIB
    grown.record.disk_mib = 4096  # a resize
    registry.entries["sb-00008"].stopped = True  # its init died: it holds no memory
    assert counted(registry.memory_view()) == (LIVE - 1, (LIVE - 1) * 16, (LIVE - 2) * MIB + 9 * MIB)
    disk = registry.disk_view()
    assert disk is not None
    assert counted(disk) == (LIVE, (LIVE - 1) * 2048 + 4096, (LIVE - 1) * 3 * MIB + 100 * MIB)
    # And the promises still decide: a budget of 64 GiB × 16 holds 1,000 × 16 MiB and not 1 TiB more.
    with pytest.raises(errors.InsufficientCapacity, match="MiB requested"):
        registry.reserve("sb-huge", 1024 * 1024, 2048)
