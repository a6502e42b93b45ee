"""What one heartbeat of a dense host costs each side's event loop (issue #36, "Growth at 1,000 live"):

- **the agent**: building the beat's list of its sandboxes (``Heartbeat.sandboxes``) over the real
  registry. Reads on the loop is what a beat pays for a sandbox not read yet (every sandbox, before
  f02c3a3): the driver's three kernel files each (liveness, freezer state, OOM count). After the read
  off the loop (``Heartbeat.refresh_usage``, in a thread before every beat) the list takes only what
  that read found. The files read are this host's own (``/proc/<pid>/stat`` and the root cgroup's
  ``freezer.state`` and ``memory.oom_control``), as the OCI driver reads its sandboxes';
- **the control plane**: folding the beat (``host_reports.apply_host_report``) into a database that
  holds the host's 1,000 running rows, on SQLite and, when ``scripts/ensure-postgres.sh`` gives one,
  PostgreSQL. The floor is the fold's own read of those rows alone (the same statement on the same
  pool), in the same run: what is above it is the fold's work.

    .venv/bin/python -m bench.heartbeat_cost                  # 1,000 sandboxes, 20 beats each
    .venv/bin/python -m bench.heartbeat_cost --sandboxes 5000 --beats 10 --no-postgres

Prints a table and writes bench/results/heartbeat-<time>.json and .md (``--out`` elsewhere); never fails
on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import insert

from bench import machine
from bench.fleet_sim import admin_url, make_services, pg_execute, sandbox_row
from bench.stats import summarize

RESULTS = Path(__file__).parent / "results"
HOST_ID = "host-heartbeat-bench"


# -- the agent ---------------------------------------------------------------------------------------


class _HostFileReads:
    """The OCI driver's reads for a beat, on files this host has (the unit seam of the registry)."""

    name = "oci"

    def __init__(self) -> None:
        from paddock_hostagent.drivers.base import RuntimeState
        from paddock_hostagent.drivers.system import host_processes

        self.running = RuntimeState.RUNNING
        self.read_small = host_processes.read_small
        self.stat = f"/proc/{os.getpid()}/stat"
        freezer = Path("/sys/fs/cgroup/freezer/freezer.state")
        self.freezer = freezer if freezer.exists() else Path(f"/proc/{os.getpid()}/cgroup")
        oom = Path("/sys/fs/cgroup/memory/memory.oom_control")
        self.oom = oom if oom.exists() else Path("/proc/self/status")

    def probe(self, record: Any) -> Any:
        self.read_small(self.stat)
        self.freezer.read_text()
        return self.running

    def oom_kills(self, record: Any) -> int:
        self.oom.read_text()
        return 0

    def memory_usage_bytes(self, record: Any) -> int:
        return 0

    def disk_usage_bytes(self, record: Any) -> int:
        return 0


async def agent_beat(count: int, beats: int) -> dict[str, Any]:
    from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord
    from paddock_hostagent.sandboxes.heartbeat import Heartbeat
    from paddock_hostagent.sandboxes.registry import Entry, Registry
    from paddock_hostagent.settings import HostAgentSettings

    with tempfile.TemporaryDirectory(prefix="heartbeat-bench-") as state:
        settings = HostAgentSettings(state_dir=Path(state), total_mib=64 * 1024, memory_overcommit=16)
        registry = Registry(settings, _HostFileReads(), images=None, records=None)
        for n in range(count):
            record = SandboxRecord(
                id=f"sb-{n:06d}", name=f"s{n}", image="debian:13", vcpu=1, mem_mib=16, disk_mib=2048,
                cpu_quota_pct=None, ip="", state=RuntimeState.RUNNING, driver="oci", driver_state={},
            )  # fmt: skip
            registry.entries[record.id] = Entry(record)

        async def no_counters() -> None:
            return None

        traffic: Any = SimpleNamespace(usage={}, egress=None, read_counters=no_counters)
        heartbeat = Heartbeat(registry, traffic, disks=None)
        on_loop, off_loop, read = [], [], []
        for _ in range(beats):
            for entry in registry.entries.values():
                entry.probed = None
            started = time.perf_counter()
            heartbeat.sandboxes()
            on_loop.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await heartbeat.refresh_usage()
            read.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            heartbeat.sandboxes()
            off_loop.append((time.perf_counter() - started) * 1000)
    return {
        "reads_on_the_loop_ms": summarize(on_loop),
        "after_the_read_ms": summarize(off_loop),
        "the_read_in_its_thread_ms": summarize(read),
    }


# -- the control plane -------------------------------------------------------------------------------


async def fold(database_url: str, count: int, beats: int) -> dict[str, Any]:
    from paddock_controlplane.app import migrate
    from paddock_controlplane.records.models import Host, Sandbox, User
    from paddock_controlplane.sandboxes import host_reports
    from paddock_core.timeutil import utcnow

    with tempfile.TemporaryDirectory(prefix="heartbeat-bench-") as data:
        services = make_services(database_url, Path(data))
        await migrate(services.settings)
        now = utcnow()
        try:
            async with services.engine.begin() as connection:
                await connection.execute(
                    insert(User.__table__), [{"id": "usr_bench", "name": "bench", "plan_id": "pro"}]
                )
                await connection.execute(
                    insert(Host.__table__),
                    [{"id": HOST_ID, "url": "http://127.0.0.1:9", "total_mib": 65536, "free_mib": 65536,
                      "status": "active"}],
                )  # fmt: skip
                rows = [sandbox_row(f"sb-{n:06d}", "usr_bench", HOST_ID, "", now) for n in range(count)]
                await connection.execute(insert(Sandbox.__table__), rows)
            beat = {
                "id": HOST_ID,
                "sandboxes": [
                    {"id": row["id"], "status": "running", "oom_kills": 0, "last_activity_at": time.time(),
                     "egress_bytes": 0, "ingress_bytes": 0, "capped": False,
                     "quota_bytes": row["bandwidth_quota_bytes"], "egress": []}
                    for row in rows
                ],
            }  # fmt: skip
            folds, floors = [], []
            await host_reports.apply_host_report(services, beat)  # warm: statements compiled, pool open
            for _ in range(beats):
                started = time.perf_counter()
                async with services.engine.connect() as connection:
                    (await connection.execute(host_reports._REPORTED_ROWS, {"host_id": HOST_ID})).all()
                floors.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await host_reports.apply_host_report(services, beat)
                folds.append((time.perf_counter() - started) * 1000)
        finally:
            await services.engine.dispose()
    return {"fold_ms": summarize(folds), "floor_read_rows_ms": summarize(floors)}


# -- the run -----------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.1f}"


def markdown(meta: dict[str, Any], results: dict[str, Any]) -> str:
    lines = [
        f"# Heartbeat cost, {meta['sandboxes']} sandboxes ({meta['at']})",
        "",
        f"Load before {meta['load_before']}, after {meta['load_after']}; {meta['beats']} beats each.",
        "",
        "| what | p50 ms | p90 ms | floor p50 ms | ratio |",
        "|---|---|---|---|---|",
    ]
    agent = results["agent"]
    before = agent["reads_on_the_loop_ms"]
    after = agent["after_the_read_ms"]
    read = agent["the_read_in_its_thread_ms"]
    lines += [
        f"| agent: beat list, reads on the loop (before) | {_ms(before['p50'])} | {_ms(before['p90'])} | – | – |",
        f"| agent: beat list after the off-loop read (now) | {_ms(after['p50'])} | {_ms(after['p90'])} | – "
        f"| {after['p50'] / max(before['p50'], 1e-9):.2f}× of before |",
        f"| agent: the read, in its thread (off the loop) | {_ms(read['p50'])} | {_ms(read['p90'])} | – | – |",
    ]
    for engine, numbers in results["fold"].items():
        floor, folded = numbers["floor_read_rows_ms"], numbers["fold_ms"]
        lines.append(
            f"| control plane: fold, {engine} | {_ms(folded['p50'])} | {_ms(folded['p90'])} "
            f"| {_ms(floor['p50'])} | {folded['p50'] / max(floor['p50'], 1e-9):.2f}× |"
        )
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = {
        "at": dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ"),
        "sandboxes": args.sandboxes,
        "beats": args.beats,
        "load_before": machine.load_average(),
    }
    results: dict[str, Any] = {"agent": await agent_beat(args.sandboxes, args.beats), "fold": {}}
    with tempfile.TemporaryDirectory(prefix="heartbeat-bench-db-") as db:
        results["fold"]["sqlite"] = await fold(f"sqlite+aiosqlite:///{db}/cp.db", args.sandboxes, args.beats)
    if args.postgres:
        admin = admin_url()
        name = f"heartbeat_bench_{os.getpid()}"
        await pg_execute(admin, f"CREATE DATABASE {name}")
        try:
            url = admin.rsplit("/", 1)[0] + "/" + name
            results["fold"]["postgresql"] = await fold(url, args.sandboxes, args.beats)
        finally:
            await pg_execute(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    meta["load_after"] = machine.load_average()
    return meta, results


def parser() -> argparse.ArgumentParser:
    """The options of a run, with their defaults (``main`` and bench/run.py's ``heartbeat`` section)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--beats", type=int, default=20)
    parser.add_argument("--no-postgres", dest="postgres", action="store_false")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results files go")
    return parser


def main() -> None:
    args = parser().parse_args()
    meta, results = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"heartbeat-{meta['at']}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    report = markdown(meta, results)
    stem.with_suffix(".md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
