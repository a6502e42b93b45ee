"""``make bench``: Paddock against the floor and a peer, in one run; writes Markdown + JSON to bench/results/.

    .venv/bin/python -m bench.run               # the full run (≥ 30 recorded runs per operation)
    .venv/bin/python -m bench.run --smoke       # a few runs of everything: proves the harness works
    .venv/bin/python -m bench.run --only lifecycle,gateway --runs 5

Sections (each module's docstring says exactly what is timed):
  lifecycle   Paddock through its API vs raw runc/crun with an overlay mount vs podman --rootfs
  fork        fork → running of a source holding 100 MB and 2 GB (settled), and right after a fresh 100 MB
  density     idle sandboxes until a cap/limit/memory stops creation; host memory per sandbox
  throughput  GET /v1/sandboxes/{id} req/s with wrk vs a bare Starlette endpoint
  webhooks    deliveries/s and event→2xx latency vs bare POSTs (bench/webhooks_bench.py)
  gateway     quote latency vs a bare endpoint; signed-request verifications/s per core vs raw ecrecover
  vm          the VM tier (QEMU): create, exec, pause/resume, fork vs the raw QEMU boot and QMP floors
              (bench/vm_bench.py; not in --smoke unless asked with --only vm: TCG boots take seconds)
  isolation   each tier (crun, runc, gVisor) through the SDK vs its raw runtime: create, exec, pause/resume,
              fork (bench/isolation_bench.py; not in --smoke unless asked: tests/bench has its own smoke test)
  creates     creates/s at concurrency 20 through the API and on the host agent alone, create → first command
              p50/p99, vs raw `crun run` at the same concurrency (bench/creates.py)
  desktop     computer use on desktop:1: screenshot and click → screenshot-changed latency vs exec and an
              in-sandbox grab (bench/desktop_bench.py; not in --smoke unless asked: its own smoke test)

Issue #36's (wave 3) sections, each its module's own measurement on a platform (or database) of its own;
none is in --smoke unless asked with --only. Their goals, each beside its floor from the same run, are
the report's "Wave 3 (#36)" table (bench/wave3.py), with density's growth, vm and desktop:
  fork_after_write  the first fork after writing 1 GiB synced, 100 MiB unsynced, 20,000 files, and the
              settled sources, without and with a neighbour writing, vs FICLONE (bench/fork_after_write.py)
  pools       create → running of every image and disk size, the pools' memory, creates sustained at
              concurrency 20 vs crun's own loop (bench/pools_bench.py)
  templates   a Dockerfile build vs `podman build`, the cached rebuild (bench/templates_bench.py)
  pg_mode     two control planes on PostgreSQL beside SQLite: GET, creates, webhooks (bench/pg_mode.py;
              PADDOCK_TEST_PG_URL or scripts/ensure-postgres.sh)
  fleet       200 simulated hosts and 100,000 sandboxes vs 3 and 100 (bench/fleet_sim.py; PostgreSQL)
  heartbeat   one heartbeat of 1,000 sandboxes, on the agent and folded by the control plane
              (bench/heartbeat_cost.py)

Needs root (sandboxes), the debian:13 image, and podman + wrk (``make bench-deps``). Never fails on a
time: the exit status is non-zero only when a section could not run (the harness or the product broke).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    creates,
    density,
    desktop_bench,
    fleet_sim,
    fork_after_write,
    heartbeat_cost,
    http_bench,
    isolation_bench,
    lifecycle,
    machine,
    pg_mode,
    pools_bench,
    report,
    templates_bench,
    vm_bench,
    wave3,
)
from bench import platform as bench_platform

#: Issue #36's sections, run first (``Run.run``): most of their goals are latencies a busy box moves the
#: most. Each takes minutes.
WAVE3_FIRST = ("fork_after_write", "pools", "templates", "pg_mode", "fleet", "heartbeat")
SECTIONS = (
    "lifecycle",
    "fork",
    "creates",
    "density",
    "throughput",
    "webhooks",
    "gateway",
    "vm",
    "isolation",
    "desktop",
    *WAVE3_FIRST,
)
#: Not in --smoke unless asked with --only: each takes minutes, and those with a smoke test of their own
#: run it in tests/bench.
NOT_IN_SMOKE = ("vm", "isolation", "desktop", *WAVE3_FIRST)
RESULTS = Path(__file__).resolve().parent / "results"
POOL_SIZE = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke", action="store_true", help="3 runs of everything, small loads, results to a temp dir"
    )
    parser.add_argument("--runs", type=int, help="recorded rounds per system (default 30, smoke 3)")
    parser.add_argument("--warmup", type=int, help="unrecorded rounds first (default 3, smoke 0)")
    parser.add_argument(
        "--density-cap", type=int, help="stop density at this many sandboxes (default 1000, smoke 3)"
    )
    parser.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    parser.add_argument(
        "--out", type=Path, help="results directory (default bench/results; smoke: a temp dir)"
    )
    parser.add_argument(
        "--fork-after-write-runs", type=int, help="first forks per case (default 10, smoke 1)"
    )
    parser.add_argument("--pools-rounds", type=int, help="creates per image and size (default 8, smoke 1)")
    parser.add_argument(
        "--sustained-seconds", type=float, help="each sustained-creates loop (default 30, smoke 2)"
    )
    parser.add_argument("--templates-rounds", type=int, help="template builds (default 3, smoke 1)")
    args = parser.parse_args(argv)
    smoke = args.smoke
    args.runs = args.runs or (3 if smoke else 30)
    args.warmup = args.warmup if args.warmup is not None else (0 if smoke else 3)
    args.density_cap = args.density_cap or (3 if smoke else 1000)
    args.big_file_mib = 8 if smoke else 100
    args.fork_sizes_mib = (8, 32) if smoke else lifecycle.FORK_SIZES_MIB
    args.fork_fresh_mib = 8 if smoke else lifecycle.FRESH_MIB
    args.fork_fresh_files = 500 if smoke else lifecycle.FRESH_FILES
    args.fork_runs = 1 if smoke else args.runs  # the smoke run proves the section works, quickly
    args.creates_total = 6 if smoke else creates.TOTAL
    args.creates_concurrency = 3 if smoke else creates.CONCURRENCY
    args.wrk_seconds = 1 if smoke else 10
    args.wrk_connections = 8
    args.webhook_burst = 50 if smoke else 2000
    args.webhook_rate = 20.0 if smoke else 100.0
    args.webhook_seconds = 1.0 if smoke else 5.0
    args.webhook_concurrency = 16
    args.quote_requests = 10 if smoke else 300
    args.verify_seconds = 0.3 if smoke else 3.0
    args.sections = [s.strip() for s in args.only.split(",")] if args.only else list(SECTIONS)
    if smoke and not args.only:
        args.sections = [section for section in args.sections if section not in NOT_IN_SMOKE]
    args.fork_after_write_runs = args.fork_after_write_runs or (1 if smoke else 10)
    args.pools_rounds = args.pools_rounds if args.pools_rounds is not None else (1 if smoke else 8)
    args.sustained_seconds = args.sustained_seconds or (2.0 if smoke else pools_bench.SECONDS)
    args.templates_rounds = args.templates_rounds or (1 if smoke else 3)
    # The modules' own options (their CLIs' parsers): the documented full runs, or a few seconds' worth.
    args.pg_mode_argv = (
        "--get-seconds 1 --fresh-rounds 2 --create-seconds 3 --create-warmup-seconds 1 --hosts 2 --burst 50"
        if smoke
        else ""
    ).split()
    args.fleet_argv = (
        "--hosts 6 --sandboxes 300 --samples 5 --creates 3 --beats 5 --rounds 1"
        if smoke
        else "--samples 100 --creates 30 --beats 100 --rounds 5"
    ).split()
    args.heartbeat_argv = ("--sandboxes 50 --beats 2" if smoke else "").split()
    args.vm_rounds = 1 if smoke else 3
    args.vm_execs = 3 if smoke else 30
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="paddock-bench-smoke-")) if smoke else RESULTS
    return args


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.results: dict[str, Any] = {
            "started_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "mode": "smoke" if args.smoke else "full",
            "runs": args.runs,
            "warmup": args.warmup,
            "big_file_mib": args.big_file_mib,
            "execs_per_round": lifecycle.EXECS_PER_ROUND,
            "machine": machine.facts(),
            "errors": {},
        }
        stamp = self.results["started_at"].replace(":", "").replace("-", "")
        self.partial = Path(tempfile.gettempdir()) / f"paddock-bench-{stamp}-{os.getpid()}.partial.json"

    def section(self, name: str, work: Callable[[], Any]) -> Any:
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        loads = self.results.setdefault("section_load", {})[name] = {"start": machine.load_average()}
        started = time.monotonic()
        try:
            value = work()
        except Exception as exc:  # one broken section must not hide the others' numbers
            self.results["errors"][name] = "".join(traceback.format_exception(exc)[-6:])
            print(f"bench: {name} FAILED: {exc}", file=sys.stderr, flush=True)
            return None
        finally:
            elapsed = round(time.monotonic() - started, 1)
            self.results.setdefault("section_seconds", {})[name] = elapsed
            loads["end"] = machine.load_average()
            print(f"bench: {name} took {elapsed} s", file=sys.stderr, flush=True)
        self.results.setdefault("sections", {})[name] = value
        self.checkpoint()
        return value

    def checkpoint(self) -> None:
        """What the run has so far, after each section, in a temp file ``write`` removes: a run stopped
        half-way still leaves its numbers."""
        self.partial.write_text(json.dumps(_clean(self.results), indent=1, default=str) + "\n")

    # -- sections that need the platform --------------------------------------------------------

    def with_platform(self) -> None:
        from tests.hostagent.conftest import image_cache

        from paddock_hostagent.guest.build import ensure_agent_binary
        from paddock_hostagent.images import ImageStore

        rootfs = ImageStore(image_cache()).build("debian:13")
        guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
        try:
            ensure_agent_binary(guest_dir)
            self._measure_platform(guest_dir, rootfs)
        finally:
            shutil.rmtree(guest_dir, ignore_errors=True)

    def _measure_platform(self, guest_dir: Path, rootfs: Path) -> None:
        from tests.hostagent.conftest import TOKEN

        # Production intervals (bench/platform.py); room for a thousand sandboxes: a /21 of addresses and
        # memory overcommitted as dense hosts run it (density.py).
        platform = bench_platform.start(
            guest_dir,
            pool_size=POOL_SIZE,
            subnet=f"10.{200 + os.getpid() % 40}.{os.getpid() // 40 % 32 * 8}.0/21",
            agent_env={
                "PADDOCK_HOST_MEMORY_OVERCOMMIT": str(density.OVERCOMMIT),
                "PADDOCK_HOST_DISK_OVERCOMMIT": str(density.DISK_OVERCOMMIT),
            },
        )
        try:
            agent = platform.agents[0]
            assert platform.controlplane.process is not None and agent.process is not None
            import httpx

            info = httpx.get(
                agent.url + "/internal/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}
            ).json()
            self.results["machine"]["paddock_runtime"] = info.get("runtime")

            def new_key() -> str:
                return platform.api_key(plan="enterprise", credits=1_000_000)

            if "lifecycle" in self.args.sections:
                self.lifecycle(platform.url, new_key(), agent.url, TOKEN, rootfs)
            if "fork" in self.args.sections:
                a = self.args
                self.section(
                    "fork",
                    lambda: lifecycle.fork_scale(
                        platform.url,
                        new_key(),
                        agent.url,
                        TOKEN,
                        POOL_SIZE,
                        a.fork_runs,
                        a.fork_sizes_mib,
                        a.fork_fresh_mib,
                        a.fork_fresh_files,
                    ),
                )
            if "creates" in self.args.sections:
                a = self.args
                self.section(
                    "creates",
                    lambda: creates.measure(
                        platform.url,
                        new_key(),
                        agent.url,
                        TOKEN,
                        POOL_SIZE,
                        rootfs,
                        agent.log_path,
                        rounds=2,
                        total=a.creates_total,
                        concurrency=a.creates_concurrency,
                    ),
                )
            if "throughput" in self.args.sections:
                self.section("throughput", lambda: self.throughput(platform.url, new_key()))
            if "density" in self.args.sections:
                self.section(
                    "density",
                    lambda: density.run(
                        platform.url,
                        new_key,
                        platform.controlplane.process.pid,  # type: ignore[union-attr]
                        agent.process.pid,  # type: ignore[union-attr]
                        agent.url,
                        TOKEN,
                        agent.state_dir,
                        POOL_SIZE,
                        self.args.density_cap,
                    ),
                )
        finally:
            try:
                platform.stop()
            except AssertionError as leftover:
                self.results["errors"]["teardown"] = str(leftover)

    def lifecycle(self, url: str, key: str, agent_url: str, token: str, rootfs: Path) -> None:
        out: dict[str, Any] = {}
        self.results.setdefault("sections", {})["lifecycle"] = out
        lifecycle.use_big_file(self.args.big_file_mib)

        def measure(system: str, make: Callable[[], Any]) -> None:
            def work() -> dict[str, Any]:
                driver = make()
                try:
                    lifecycle.rounds(driver.samples, self.args.warmup, self.args.runs, driver.round)
                finally:
                    driver.close()
                return dict(driver.samples.summary())

            value = self.section(f"lifecycle/{system}", work)
            if value is not None:
                out[system] = value
                self.results["sections"].pop(f"lifecycle/{system}", None)

        measure("paddock", lambda: lifecycle.PaddockLifecycle(url, key, agent_url, token, POOL_SIZE))
        measure("hostagent", lambda: lifecycle.HostAgentLifecycle(agent_url, token, POOL_SIZE))
        measure("runc", lambda: lifecycle.RawRuntimeLifecycle("runc", rootfs))
        measure("crun", lambda: lifecycle.RawRuntimeLifecycle("crun", rootfs))
        measure("podman", lambda: lifecycle.PodmanLifecycle(rootfs))

    def throughput(self, url: str, key: str) -> dict[str, Any]:
        from paddock import Client

        with Client(url, key, timeout=300) as client:
            sandbox = client.sandboxes.create(
                lifecycle.SHAPE, name="bench-read", rootfs="debian:13", disk_mib=lifecycle.DISK_MIB
            )
            try:
                return http_bench.throughput(
                    url, key, sandbox.id, self.args.wrk_seconds, self.args.wrk_connections
                )
            finally:
                sandbox.destroy()

    # -- sections without the platform --------------------------------------------------------------

    def webhooks(self) -> dict[str, Any]:
        from bench import webhooks_bench
        from paddock_core.logging import configure_logging

        configure_logging("warning")
        a = self.args
        options = argparse.Namespace(
            burst=a.webhook_burst,
            rate=a.webhook_rate,
            seconds=a.webhook_seconds,
            concurrency=a.webhook_concurrency,
        )

        async def go() -> dict[str, Any]:
            async with webhooks_bench.receiver_process() as url:
                one = await webhooks_bench.floor(url, min(a.webhook_burst, 500), 1)
                lanes = await webhooks_bench.floor(url, a.webhook_burst, a.webhook_concurrency)
                rows = dict(await webhooks_bench.run_engine("sqlite", url, options))
            burst = next(v for k, v in rows.items() if "burst" in k)
            steady = next(v for k, v in rows.items() if "steady" in k)
            return {
                "floor_1_lane": one,
                "floor_lanes": lanes,
                "burst": burst,
                "steady": steady,
                "concurrency": a.webhook_concurrency,
                "steady_rate": a.webhook_rate,
                "engine": "sqlite",
            }

        return asyncio.run(go())

    def gateway(self) -> dict[str, Any]:
        warmup = 2 if self.args.smoke else 20
        from tests.live import start_platform  # lazily, as with_platform does: the test helpers are heavy

        # The gateway refuses to quote without a control plane that accepts its key; no host is needed.
        guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
        try:
            platform = start_platform(guest_dir, agents=0)
            try:
                key = platform.api_key(plan="enterprise", credits=1_000_000)
                quote = http_bench.quote_latency(self.args.quote_requests, warmup, platform.url, key)
            finally:
                platform.stop()
        finally:
            shutil.rmtree(guest_dir, ignore_errors=True)
        return {"quote": quote, "verify": http_bench.verifications(self.args.verify_seconds)}

    # -- issue #36's sections: each module's own measurement ------------------------------------------

    def fork_after_write(self) -> dict[str, Any]:
        runs = self.args.fork_after_write_runs
        return {
            "quiet": fork_after_write.measured(runs, neighbour=False),
            "neighbour": fork_after_write.measured(runs, neighbour=True),
        }

    def pools(self) -> dict[str, Any]:
        a = self.args
        concurrency = 2 if a.smoke else pools_bench.CONCURRENCY
        return pools_bench.run(a.pools_rounds, a.sustained_seconds, concurrency)

    def templates(self) -> dict[str, list[float]]:
        boots = 1 if self.args.smoke else 3
        return templates_bench.run(self.args.templates_rounds, boots)

    def pg_mode(self) -> dict[str, Any]:
        from paddock_core.logging import configure_logging

        configure_logging("warning")
        options = pg_mode.parser().parse_args(self.args.pg_mode_argv)
        self.results.setdefault("section_options", {})["pg_mode"] = vars(options)
        return asyncio.run(pg_mode.run(options))

    def fleet(self) -> dict[str, Any]:
        options = fleet_sim.parser().parse_args(self.args.fleet_argv)
        self.results.setdefault("section_options", {})["fleet"] = vars(options)
        return asyncio.run(fleet_sim.run(options))

    def heartbeat(self) -> dict[str, Any]:
        options = heartbeat_cost.parser().parse_args(self.args.heartbeat_argv)
        self.results.setdefault("section_options", {})["heartbeat"] = vars(options) | {"out": None}
        meta, results = asyncio.run(heartbeat_cost.run(options))
        return {"meta": meta, "results": results}

    # -- the whole run ---------------------------------------------------------------------------------

    def run(self) -> int:
        if os.geteuid() != 0:
            print("bench needs root (namespaces, cgroups, mounts)", file=sys.stderr)
            return 2
        for name in WAVE3_FIRST:
            if name in self.args.sections:
                self.section(name, getattr(self, name))
        if {"lifecycle", "fork", "creates", "density", "throughput"} & set(self.args.sections):
            self.section("platform", self.with_platform)
            self.results.get("sections", {}).pop("platform", None)
        if "webhooks" in self.args.sections:
            self.section("webhooks", self.webhooks)
        if "gateway" in self.args.sections:
            self.section("gateway", self.gateway)
        if "vm" in self.args.sections:
            self.section("vm", lambda: vm_bench.measure(self.args.vm_rounds, self.args.vm_execs))
        if "isolation" in self.args.sections:
            runs = 2 if self.args.smoke else 10
            self.section("isolation", lambda: isolation_bench.measure(runs, 0 if self.args.smoke else 1))
        if "desktop" in self.args.sections:
            self.section("desktop", lambda: desktop_bench.measure(3 if self.args.smoke else 30))
        self.results["machine"]["load_average_end"] = machine.load_average()
        self.results["finished_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return self.write()

    def write(self) -> int:
        self.args.out.mkdir(parents=True, exist_ok=True)
        stamp = self.results["started_at"].replace(":", "").replace("-", "")
        stem = f"{stamp}-{self.results['mode']}-{secrets.token_hex(2)}" if self.args.smoke else f"{stamp}"
        markdown = report.markdown(self.results)
        if self.results.get("sections", {}).get("creates"):  # its own table (bench/creates.py)
            markdown += "\n" + creates.markdown(self.results["sections"]["creates"])
        if set(wave3.SECTIONS) & set(self.args.sections):  # issue #36's goals, then each module's table
            markdown += "\n" + wave3.markdown(self.results) + self.wave3_tables()
        (self.args.out / f"{stem}.json").write_text(
            json.dumps(_clean(self.results), indent=2, default=str) + "\n"
        )
        (self.args.out / f"{stem}.md").write_text(markdown)
        print(markdown)
        print(f"bench: wrote {self.args.out / stem}.md and .json", file=sys.stderr)
        self.partial.unlink(missing_ok=True)
        if self.results["errors"]:
            print(f"bench: sections that failed: {', '.join(self.results['errors'])}", file=sys.stderr)
            return 1
        return 0

    def wave3_tables(self) -> str:
        """Each issue-#36 section's own table, as its module writes it, under a heading of the report's level."""
        sections, m = self.results.get("sections", {}), self.results["machine"]
        options = self.results.get("section_options", {})

        def meta(name: str) -> dict[str, Any]:
            argv = " ".join(getattr(self.args, f"{name}_argv", []))
            return {
                "stamp": self.results["started_at"],
                "command": f"python -m bench.run, section {name} ({argv or 'defaults'})",
                "git_sha": m["git_sha"],
                "cpus": m["cpus"],
                **options.get(name, {}),
            }

        tables: list[tuple[str, Callable[[Any], str]]] = [
            (
                "fork_after_write",
                lambda v: (
                    fork_after_write.markdown(v["quiet"]) + "\n" + fork_after_write.markdown(v["neighbour"])
                ),
            ),
            (
                "pools",
                lambda v: (
                    "# Every image warm; sustained creates (bench/pools_bench.py)\n\n"
                    + pools_bench.markdown(v)
                ),
            ),
            (
                "templates",
                lambda v: (
                    "# Template builds (bench/templates_bench.py)\n\n```\n"
                    + "\n".join(templates_bench.table(v))
                    + "\n```"
                ),
            ),
            ("pg_mode", lambda v: pg_mode.markdown(meta("pg_mode"), v)),
            ("fleet", lambda v: fleet_sim.markdown(meta("fleet"), v)),
            ("heartbeat", lambda v: heartbeat_cost.markdown(v["meta"], v["results"])),
        ]
        out = []
        for name, render in tables:
            if sections.get(name) is None:
                continue
            try:
                text = render(sections[name])
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # the numbers are in the JSON
                text = f"# {name}\n\nits table could not be written: {exc!r}"
            out.append("\n".join("#" + line if line.startswith("#") else line for line in text.splitlines()))
        return "".join("\n" + table.rstrip("\n") + "\n" for table in out)


def _clean(value: Any) -> Any:
    """NaN (no samples) becomes null: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def main(argv: list[str] | None = None) -> int:
    return Run(parse_args(argv)).run()


if __name__ == "__main__":
    raise SystemExit(main())
