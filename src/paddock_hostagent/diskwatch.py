"""The disk store's watermark: a host running out of disk holds the sandboxes that are filling it.

Sandbox disks are sparse files, thin-provisioned (``capacity.py``): together they are promised far
more than the host has, and an idle one holds a few MiB. Their blocks come from the disk store
(``drivers/storage/rootdisks.py``), on a host whose filesystem does not clone an XFS inside a sparse file on the
host's filesystem, sized like it. Were the host filesystem to fill, the store's loop device would fail
its writes: every sandbox would get EIO, and the store's XFS would shut down. This watch keeps that
from happening.

Every ``interval_s`` (0.25 s: a ``statvfs`` or two and ``/proc/meminfo``, some 30 µs) the agent
measures the ``Room`` left: the smaller of the host filesystem's and the store's free space, less the
dirty and writeback data in the page cache, which lands on them whatever happens next.

- Below ``high_mib`` it reads each running sandbox's disk use every tick (above, every
  ``SAMPLE_EVERY_TICKS``), and trims the store (``FITRIM``: the blocks it freed, of destroyed
  sandboxes, go back to the host filesystem) at most every ``TRIM_EVERY_S``.
- Below ``low_mib`` it freezes (the cgroup freezer, as a pause does) every running sandbox whose disk
  grew by ``FILLING_BYTES`` or more since the last reading, logs ``disk_low_hold`` and reports the
  sandboxes in ``/info`` (``disk_held``). Their records stay ``running``; their processes, and commands
  run in them, wait. Sandboxes that each grew less are held when together they grew that much.
- Back above ``high_mib`` it thaws them (``disk_low_release``); one a user paused meanwhile stays paused.

While it holds any sandbox, admission refuses creates, forks and disk growth (``capacity.DiskView``),
which the control plane answers 503 with ``Retry-After``. A sandbox filling its own disk gets ENOSPC
from its own filesystem long before: its size is what it was promised. The holds are kept in
``<state>/disk-holds.json``, so that a restarted agent reads a held sandbox's frozen cgroup as a hold
and not as a pause (``SandboxManager.start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import math
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import DriverError, RuntimeState, SandboxRecord, SandboxRuntime

log = get_logger(__name__)

MIB = 1 << 20
#: Above the high watermark, disk use is sampled every this many ticks (~2 s at 0.25 s), so that a
#: sandbox's growth is known from a recent reading when the room first falls below the low watermark.
SAMPLE_EVERY_TICKS = 8
#: How often, at most, the store is trimmed while the room is below the high watermark.
TRIM_EVERY_S = 5.0
#: A sandbox is filling the host when its disk grew this much since the last reading (a quarter of a
#: second before, below the high watermark: 4 MiB/s). One that grew less, by a log line or its boot's
#: own writes, was frozen beside the real writers (the watermark test saw a sandbox that had only
#: booted held with them, in 7 runs of 10 one morning). Many slow ones together can fill a host too, so
#: they are held, all of them, when together they grew this much. What is left running is a drip below
#: 4 MiB/s in all, which takes minutes to use up the low watermark's room (2 GiB by default).
FILLING_BYTES = 1 * MIB
#: ``FITRIM``: ``_IOWR('X', 121, struct fstrim_range)``, the range being three u64 (start, len, minlen).
FITRIM = 0xC0185879


@dataclass(frozen=True)
class Room:
    """What the disk store can still take."""

    host_free_bytes: int
    store_free_bytes: int | None  # None: the store is the host filesystem itself
    in_flight_bytes: int  # dirty and writeback pages, on their way to a filesystem

    @property
    def free_bytes(self) -> int:
        free = self.host_free_bytes
        if self.store_free_bytes is not None:
            free = min(free, self.store_free_bytes)
        return max(free - self.in_flight_bytes, 0)

    @property
    def free_mib(self) -> int:
        return self.free_bytes // MIB


def filesystem_free_bytes(path: Path) -> int:
    """Free space an unprivileged writer gets (``f_bavail``: root without CAP_SYS_RESOURCE gets no more)."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def in_flight_bytes() -> int:
    """``Dirty`` + ``Writeback`` of ``/proc/meminfo``: written, not yet on a filesystem's blocks."""
    total = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith(("Dirty:", "Writeback:")):
                total += int(line.split()[1]) * 1024
    return total


def trim(mount_dir: Path) -> int:
    """Discards the free blocks of the filesystem mounted at ``mount_dir`` (``FITRIM``; a loop device
    punches them out of its file); returns the bytes trimmed."""
    fd = os.open(mount_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        answer = fcntl.ioctl(fd, FITRIM, struct.pack("QQQ", 0, 2**64 - 1, 0))
    finally:
        os.close(fd)
    return int(struct.unpack("QQQ", answer)[1])


def load_holds(path: Path) -> set[str]:
    try:
        return set(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return set()


class DiskWatch:
    """The watermark task of one agent (see the module's docstring)."""

    def __init__(
        self,
        runtime: SandboxRuntime,
        records: Callable[[], list[SandboxRecord]],
        *,
        store_dir: Path | None,
        holds_path: Path,
        low_mib: int,
        high_mib: int,
        interval_s: float,
    ) -> None:
        self.runtime = runtime
        self.records = records  # every sandbox of the agent, now
        self.store_dir = store_dir
        self.holds_path = holds_path
        self.low_mib, self.high_mib, self.interval_s = low_mib, high_mib, interval_s
        self.held: set[str] = load_holds(holds_path)
        self.room: Room | None = None
        self._usage: dict[str, int] = {}  # sandbox id -> disk bytes at the last reading
        self._ticks = 0
        self._trimmed_at = -math.inf  # never: the monotonic clock starts at the host's boot
        self._task: asyncio.Task[None] | None = None

    # -- measuring --------------------------------------------------------------------------------

    def measure(self) -> Room | None:
        """The room left now; None on a runtime that does not report its disk store's free space."""
        host_free = self.runtime.disk_free_bytes()
        if host_free is None:
            return None
        store_free = None
        if self.store_dir is not None and os.path.ismount(self.store_dir):
            store_free = filesystem_free_bytes(self.store_dir)
        self.room = Room(host_free, store_free, in_flight_bytes())
        return self.room

    def _read_usage(self, records: list[SandboxRecord]) -> dict[str, int]:
        return {record.id: self.runtime.disk_usage_bytes(record) for record in records}

    def _trim_store(self) -> None:
        if self.store_dir is None or not os.path.ismount(self.store_dir):
            return
        if time.monotonic() - self._trimmed_at < TRIM_EVERY_S:
            return
        self._trimmed_at = time.monotonic()
        try:
            trimmed = trim(self.store_dir)
        except OSError as exc:
            log.warning("disk_store_trim_failed", error=str(exc))
            return
        log.info("disk_store_trimmed", trimmed_mib=trimmed // MIB)

    # -- the loop ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="disk-watch")

    async def close(self) -> None:
        """Stops watching; held sandboxes stay frozen (the next agent releases them)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("disk_watch_failed")
            await asyncio.sleep(self.interval_s)

    async def tick(self) -> None:
        """One look at the room: release, sample, trim and hold as the watermarks say."""
        room = self.measure()
        if room is None:
            return
        self._ticks += 1
        if room.free_mib >= self.high_mib and not self.held and self._ticks % SAMPLE_EVERY_TICKS:
            return  # most ticks: room enough, nothing held, no sample due (the sandboxes go unlisted)
        records = {record.id: record for record in self.records()}
        self._forget(records)
        if room.free_mib >= self.high_mib:
            if self.held:
                await self._release(records, room)
            if self._ticks % SAMPLE_EVERY_TICKS:
                return
        running = [r for r in records.values() if r.state == RuntimeState.RUNNING and r.id not in self.held]
        usage = await asyncio.to_thread(self._read_usage, running)
        growth = {
            r.id: usage[r.id] - self._usage[r.id]
            for r in running
            if r.id in self._usage and usage[r.id] > self._usage[r.id]
        }
        self._usage = usage
        if room.free_mib >= self.high_mib:
            return
        if filling := self._filling(running, growth, room):
            # Held before the trim, not after: a FITRIM under heavy writes can take seconds, in which
            # the writers would go on filling the host (a full run saw 400 MiB past the low watermark).
            await self._hold(filling, growth, room)
            running = [r for r in running if r not in filling]
        await asyncio.to_thread(self._trim_store)
        room = self.measure() or room
        if filling := self._filling(running, growth, room):
            await self._hold(filling, growth, room)

    def _filling(
        self, running: list[SandboxRecord], growth: dict[str, int], room: Room
    ) -> list[SandboxRecord]:
        """The sandboxes to hold with ``room`` left: below the low watermark those that grew by
        ``FILLING_BYTES``, and every other one that grew if together they grew that much."""
        if room.free_mib >= self.low_mib:
            return []
        filling = [r for r in running if growth.get(r.id, 0) >= FILLING_BYTES]
        slow = [r for r in running if 0 < growth.get(r.id, 0) < FILLING_BYTES]
        if sum(growth[r.id] for r in slow) >= FILLING_BYTES:
            filling += slow
        return filling

    def _forget(self, records: dict[str, SandboxRecord]) -> None:
        """Drops holds on sandboxes destroyed, paused by their user, or thawed by someone (a user's
        pause and resume): those are no longer this watch's to release."""
        kept = {
            sandbox_id
            for sandbox_id in self.held
            if sandbox_id in records
            and records[sandbox_id].state == RuntimeState.RUNNING
            and self.runtime.probe(records[sandbox_id]) == RuntimeState.PAUSED
        }
        if kept != self.held:
            log.info("disk_low_hold_dropped", sandbox_ids=sorted(self.held - kept))
            self.held = kept
            self._save()

    async def _hold(self, growing: list[SandboxRecord], growth: dict[str, int], room: Room) -> None:
        async def freeze(record: SandboxRecord) -> str | None:
            try:
                await self.runtime.pause(record)
            except (DriverError, OSError) as exc:
                log.warning("disk_low_hold_failed", sandbox_id=record.id, error=str(exc))
                return None
            return record.id

        held = [sandbox_id for sandbox_id in await asyncio.gather(*map(freeze, growing)) if sandbox_id]
        self.held.update(held)
        self._save()
        log.warning(
            "disk_low_hold",
            sandbox_ids=sorted(held),
            grew_kib={sandbox_id: growth.get(sandbox_id, 0) // 1024 for sandbox_id in sorted(held)},
            free_mib=room.free_mib,
            in_flight_mib=room.in_flight_bytes // MIB,
            low_watermark_mib=self.low_mib,
            high_watermark_mib=self.high_mib,
        )

    async def _release(self, records: dict[str, SandboxRecord], room: Room) -> None:
        released = []
        for sandbox_id in sorted(self.held):
            with contextlib.suppress(DriverError, OSError):
                await self.runtime.resume(records[sandbox_id])
                released.append(sandbox_id)
        self.held = set()
        self._save()
        log.info("disk_low_release", sandbox_ids=released, free_mib=room.free_mib)

    def _save(self) -> None:
        try:
            partial = self.holds_path.with_suffix(".partial")
            partial.write_text(json.dumps(sorted(self.held)))
            partial.replace(self.holds_path)
        except OSError as exc:
            log.error("disk_holds_not_saved", error=str(exc))
