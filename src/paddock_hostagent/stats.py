"""Per-sandbox resource use for the control plane's metrics worker (issue #35): ``GET /internal/v1/stats``.

Everything is read from the host side, never through a path inside a sandbox's tree (docs/security.md,
rule 3): the driver's ``resource_sample`` (the sandbox's cgroup — ``cpuacct.usage``, ``memory.*`` — or
its VM's QEMU process, and ``statvfs`` of the host-made mount point of its disk), and the host-side
veth's ``/sys/class/net/<veth>/statistics`` counters. A reading of one sandbox is a handful of small
file reads; the sampler runs off the event loop.

CPU is a rate: each reading keeps the sandbox's cumulative CPU time and when it was read, and the next
reading at least ``MIN_CPU_INTERVAL_S`` later turns the difference into a percent of the sandbox's CPU
allotment. A reading sooner than that (two control-plane processes pulling at once) repeats the last
percent rather than divide by a tiny interval.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord, SandboxRuntime
from paddock_hostagent.drivers.system.host_processes import read_small
from paddock_hostagent.schemas import HostStats, SandboxStats

if TYPE_CHECKING:
    from paddock_hostagent.sandboxes import SandboxManager

MIN_CPU_INTERVAL_S = 0.5
_NET_SYSFS = "/sys/class/net"
_INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


def allotment_cpus(record: SandboxRecord) -> float:
    """The CPUs a sandbox may use: ``cpu_quota_pct`` of one CPU when set, else ``vcpu`` whole ones
    (ocispec.cpu_quota_us gives the cgroup the same quota)."""
    if record.cpu_quota_pct:
        return record.cpu_quota_pct / 100
    return float(max(record.vcpu, 1))


def interface_counters(interface: str | None) -> tuple[int, int]:
    """(bytes the sandbox received, bytes it sent) through its host-side veth: the host end transmits
    what the sandbox receives. (0, 0) without a network or once the interface is gone."""
    if interface is None or not _INTERFACE_NAME.match(interface):
        return 0, 0
    base = f"{_NET_SYSFS}/{interface}/statistics"
    try:
        return int(read_small(f"{base}/tx_bytes")), int(read_small(f"{base}/rx_bytes"))
    except (OSError, ValueError):
        return 0, 0


class StatsSampler:
    """Reads every live sandbox of ``records()`` through ``runtime``; thread-safe (one reading at a
    time), as readings run in a worker thread."""

    def __init__(
        self,
        runtime: SandboxRuntime,
        records: Callable[[], Iterable[SandboxRecord]],
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.runtime = runtime
        self.records = records
        self.clock_ns = clock_ns
        self._lock = threading.Lock()
        # sandbox id -> (when, cumulative CPU ns) at the reading the current percent was measured from
        self._baseline: dict[str, tuple[int, int]] = {}
        self._pct: dict[str, float] = {}

    def sample(self) -> HostStats:
        with self._lock:
            started = time.perf_counter()
            at = time.time()
            rows = []
            seen = set()
            for record in list(self.records()):
                if record.state not in (RuntimeState.RUNNING, RuntimeState.PAUSED):
                    continue
                row = self._read(record)
                if row is not None:
                    rows.append(row)
                    seen.add(record.id)
            for gone in set(self._baseline) - seen:
                self._baseline.pop(gone, None)
                self._pct.pop(gone, None)
            took_ms = (time.perf_counter() - started) * 1000
            return HostStats(at=at, took_ms=round(took_ms, 3), sandboxes=rows)

    def _read(self, record: SandboxRecord) -> SandboxStats | None:
        use = self.runtime.resource_sample(record)
        if use is None:
            return None
        now = self.clock_ns()
        pct = self._cpu_pct(record, now, use.cpu_usage_ns)
        rx, tx = interface_counters(self.runtime.host_interface(record))
        return SandboxStats(
            id=record.id,
            status="paused" if record.state == RuntimeState.PAUSED else "running",
            vcpu=record.vcpu,
            cpu_usage_ns=use.cpu_usage_ns,
            cpu_pct=pct,
            mem_used_bytes=use.mem_used_bytes,
            mem_limit_bytes=use.mem_limit_bytes,
            disk_used_bytes=use.disk_used_bytes,
            disk_limit_bytes=use.disk_limit_bytes,
            net_rx_bytes=rx,
            net_tx_bytes=tx,
        )

    def _cpu_pct(self, record: SandboxRecord, now_ns: int, cpu_ns: int) -> float | None:
        baseline = self._baseline.get(record.id)
        if baseline is None or cpu_ns < baseline[1]:  # first reading, or a new cgroup (restart)
            self._baseline[record.id] = (now_ns, cpu_ns)
            self._pct.pop(record.id, None)
            return None
        elapsed_ns = now_ns - baseline[0]
        if elapsed_ns < MIN_CPU_INTERVAL_S * 1e9:
            return self._pct.get(record.id)
        pct = (cpu_ns - baseline[1]) / elapsed_ns / allotment_cpus(record) * 100
        self._baseline[record.id] = (now_ns, cpu_ns)
        self._pct[record.id] = round(max(pct, 0.0), 2)
        return self._pct[record.id]


def for_manager(manager: SandboxManager) -> StatsSampler:
    """A sampler over a ``SandboxManager``'s sandboxes (its runtime and its registry's records)."""
    entries = manager.registry.entries

    def records() -> list[SandboxRecord]:  # read-only: the records the agent holds now
        return [entry.record for entry in list(entries.values())]

    return StatsSampler(manager.runtime, records)
