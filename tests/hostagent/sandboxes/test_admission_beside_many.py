"""Admission beside 1,000 sandboxes (issue #36): every create counts what the sandboxes here promised and
use. Walking the 1,000 for it was all an agent's create grew by from 1 to 1,000 live (1.7 ms), so the
sums are kept and made again only after a change, and what admission counts follows every change (a
heartbeat's reading of a use, a resize, a stop, a create, a destroy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paddock_hostagent import errors
from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord
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


def test_a_create_beside_1000_sandboxes_walks_none_of_them_when_none_changed(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.reserve("sb-first", 16, 2048)
    registry.release("sb-first")
    reads: list[str] = []
    used = vars(Entry)["mem_used_bytes"]  # the field's descriptor itself

    def counted(entry: Entry) -> int:
        reads.append(entry.record.id)
        return int(used.__get__(entry))

    monkeypatch.setattr(Entry, "mem_used_bytes", property(counted, used.__set__))
    registry.reserve("sb-second", 16, 2048)
    registry.release("sb-second")
    assert reads == [], f"{len(reads)} sandboxes read for one admission beside {LIVE} unchanged ones"
    registry.entries["sb-00003"].mem_used_bytes = 2 * MIB  # a change: the next admission sums again
    registry.reserve("sb-third", 16, 2048)
    registry.release("sb-third")
    assert len(reads) == LIVE


def test_what_admission_counts_follows_each_sandboxs_use_size_stop_and_presence(registry: Registry) -> None:
    """Each change alone, then the views: a change that noted nothing would leave the old sums."""
    mem = [LIVE, LIVE * 16, LIVE]  # count, limits (MiB), use (MiB)
    disk = [LIVE, LIVE * 2048, LIVE * 3]

    def expect() -> None:
        memory_view, disk_view = registry.memory_view(), registry.disk_view()
        assert disk_view is not None
        for view, sums in ((memory_view, mem), (disk_view, disk)):
            assert [view.promised.count, view.promised.limit_mib, view.promised.used_mib] == sums

    expect()
    grown = registry.entries["sb-00007"]
    grown.mem_used_bytes = 9 * MIB  # a heartbeat's reading
    mem[2] += 8
    expect()
    grown.disk_used_bytes = 100 * MIB
    disk[2] += 97
    expect()
    grown.resized(4096)  # a resize
    disk[1] += 2048
    expect()
    registry.entries["sb-00008"].stopped = True  # its init died: it holds no memory, its disk stays
    mem[0], mem[1], mem[2] = mem[0] - 1, mem[1] - 16, mem[2] - 1
    expect()
    del registry.entries["sb-00009"]  # a destroy
    mem[0], mem[1], mem[2] = mem[0] - 1, mem[1] - 16, mem[2] - 1
    disk[0], disk[1], disk[2] = disk[0] - 1, disk[1] - 2048, disk[2] - 3
    expect()
    registry.entries["sb-new"] = Entry(_record(LIVE + 1))  # a create, using nothing yet
    mem[0], mem[1] = mem[0] + 1, mem[1] + 16
    disk[0], disk[1] = disk[0] + 1, disk[1] + 2048
    expect()
    registry.reserve("sb-pending", 64, 1024)  # a create in flight: its whole limit, unused
    mem[0], mem[1] = mem[0] + 1, mem[1] + 64
    disk[0], disk[1] = disk[0] + 1, disk[1] + 1024
    expect()
    registry.release("sb-pending")
    # And the promises still decide: a budget of 64 GiB × 16 holds 1,000 × 16 MiB and not 1 TiB more.
    with pytest.raises(errors.InsufficientCapacity, match="MiB requested"):
        registry.reserve("sb-huge", 1024 * 1024, 2048)
