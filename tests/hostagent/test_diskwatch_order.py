"""The disk watermark's order of work below the low watermark (``diskwatch.py``): the sandboxes filling
the host are frozen first, and only then is the store trimmed. A FITRIM under heavy writes takes
seconds, in which the writers went on filling the host; a full run saw the room fall 400 MiB past the
low watermark (the real thing, a filling host, is ``test_disk_fill.py``). Here a fake runtime stands in
for the disk store, so the order can be seen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paddock_hostagent import diskwatch
from paddock_hostagent.diskwatch import DiskWatch
from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord

MIB = 1 << 20


class FillingStore:
    """A runtime whose one sandbox grows 100 MiB per look, on a host with ``free_mib`` left."""

    def __init__(self, free_mib: int) -> None:
        self.free_mib = free_mib
        self.used = 0
        self.events: list[str] = []

    def disk_free_bytes(self) -> int:
        return self.free_mib * MIB

    def disk_usage_bytes(self, record: SandboxRecord) -> int:
        self.used += 100 * MIB
        return self.used

    async def pause(self, record: SandboxRecord) -> None:
        self.events.append(f"freeze {record.id}")

    async def resume(self, record: SandboxRecord) -> None:
        self.events.append(f"thaw {record.id}")

    def probe(self, record: SandboxRecord) -> RuntimeState:
        return RuntimeState.PAUSED


def record(sandbox_id: str) -> SandboxRecord:
    return SandboxRecord(
        id=sandbox_id, name=sandbox_id, image="debian", vcpu=1, mem_mib=256, disk_mib=1024,
        cpu_quota_pct=None, ip="10.0.0.2", state=RuntimeState.RUNNING, driver="crun",
    )  # fmt: skip


def watching(store: FillingStore, sandbox_ids: list[str], tmp_path: Path, monkeypatch: Any) -> DiskWatch:
    watch = DiskWatch(
        store,  # type: ignore[arg-type]
        lambda: [record(sandbox_id) for sandbox_id in sandbox_ids],
        store_dir=None,
        holds_path=tmp_path / "disk-holds.json",
        low_mib=512,
        high_mib=1536,
        interval_s=0.25,
    )
    monkeypatch.setattr(diskwatch, "in_flight_bytes", lambda: 0)
    monkeypatch.setattr(watch, "_trim_store", lambda: None)
    return watch


async def test_below_the_low_watermark_the_writer_is_frozen_before_the_store_is_trimmed(
    tmp_path: Path, monkeypatch: Any
) -> None:
    store = FillingStore(free_mib=1000)  # between the watermarks: sampled and trimmed, nobody held
    watch = watching(store, ["sbx_writer"], tmp_path, monkeypatch)
    monkeypatch.setattr(watch, "_trim_store", lambda: store.events.append("trim"))

    await watch.tick()
    assert store.events == ["trim"] and watch.held == set()

    store.free_mib = 400  # below the low watermark, and the writer grew since the last look
    await watch.tick()
    assert store.events == ["trim", "freeze sbx_writer", "trim"]
    assert watch.held == {"sbx_writer"}

    store.free_mib = 2000  # room again: the hold is let go
    await watch.tick()
    assert store.events[-1] == "thaw sbx_writer" and watch.held == set()


class QuietSandboxes(FillingStore):
    """A writer that grows 100 MiB per look, beside ``quiet`` sandboxes that grow 4 KiB per look each
    (a log line)."""

    def __init__(self, free_mib: int, quiet: int) -> None:
        super().__init__(free_mib)
        self.quiet = [f"sbx_quiet{index}" for index in range(quiet)]
        self.usage = dict.fromkeys(["sbx_writer", *self.quiet], 0)

    def disk_usage_bytes(self, record: SandboxRecord) -> int:
        self.usage[record.id] += 100 * MIB if record.id == "sbx_writer" else 4096
        return self.usage[record.id]


async def test_a_sandbox_that_grew_a_little_is_not_held_beside_the_writer(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A sandbox that wrote a log line is not what fills the host: below the low watermark only the
    writer is frozen (the watermark test saw a sandbox that had only booted held beside the writers)."""
    store = QuietSandboxes(free_mib=1000, quiet=1)
    watch = watching(store, ["sbx_writer", "sbx_quiet0"], tmp_path, monkeypatch)
    await watch.tick()  # the first reading
    store.free_mib = 400
    await watch.tick()
    assert watch.held == {"sbx_writer"} and store.events == ["freeze sbx_writer"]
    store.free_mib = 10  # whatever the room: 4 KiB per look is no filling
    await watch.tick()
    assert watch.held == {"sbx_writer"}


async def test_many_sandboxes_that_each_grew_a_little_are_held_when_together_they_fill(
    tmp_path: Path, monkeypatch: Any
) -> None:
    store = QuietSandboxes(free_mib=1000, quiet=300)  # 300 x 4 KiB: 1.2 MiB per look together
    watch = watching(store, store.quiet, tmp_path, monkeypatch)
    await watch.tick()
    store.free_mib = 400
    await watch.tick()
    assert watch.held == set(store.quiet)
