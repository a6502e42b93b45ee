"""PostgreSQL mode beside SQLite, in one run on one box (issue #36): GET/s, creates/s through the API,
webhook burst and delivery latency.

    .venv/bin/python -m bench.pg_mode                    # both engines
    .venv/bin/python -m bench.pg_mode --engine postgresql --get-seconds 10

Per engine:

- the control plane: SQLite mode is one ``paddock controlplane`` process on its SQLite file;
  PostgreSQL mode is two of them on one fresh PostgreSQL database (``scripts/ensure-postgres.sh``;
  dropped at the end), each with its reconciler and workers, as a multi-control-plane setup runs;
- host agents (48 by default, each with room for ~90 of the bench's sandboxes: ~4,300, more than the
  ~3,300 that 10 s of creates at 330/s keep live until they are destroyed): the real agent code over
  ``bench.fleet_driver.StandInRuntime`` (no containers; the fleet simulation's seam, in a child
  process), so a create costs the control plane what it costs for real and the agent's side almost
  nothing. The creates/s row is therefore the control plane's rate, not a container runtime's
  (bench/pools_bench.py measures those);
- ``GET /v1/sandboxes/{id}``: wrk, one thread, 8 connections, against control plane A, on a running
  sandbox created through the API;
- freshness (PostgreSQL): a PATCH of the sandbox's ``auto_pause_after_seconds`` on control plane B, then GETs on A until
  they show it: the time from B's answer to A's first answer with the new labels;
- creates: ``concurrency`` lanes of ``POST /v1/sandboxes`` for ``create-seconds`` (lanes alternate
  between the control planes on PostgreSQL), each answered 200, then destroyed untimed; the control
  planes' CPU per create from /proc (theirs in all: reconcilers and workers included), and net of
  what they use idle (measured for 2 s just before). The same for
  ``create-warmup-seconds`` first, untimed, so that each control plane has its link to each host;
- webhooks: ``bench.webhooks_bench.run_engine`` (burst of 2,000, then 100/s for 5 s) on a scratch
  database of the engine, to a loopback receiver in its own process.

The box's load average is recorded before each row. Writes bench/results/pgmode-<time>.json and .md;
never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import machine, webhooks_bench
from bench.fleet_sim import DISK_MIB, IMAGE, SHAPE, FleetClient, admin_url, cpu_s, make_services, pg_execute
from bench.http_bench import wrk
from bench.stats import summarize

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
ENV = {
    "PADDOCK_CP_HOST_DEAD_AFTER_S": "600",
    "PADDOCK_CP_BILLING_INTERVAL_S": "3600",
    "PADDOCK_CP_RECONCILE_INTERVAL_S": "1.0",
    "PADDOCK_CP_METRICS_INTERVAL_S": "0",
    "PADDOCK_CP_LOG_LEVEL": "warning",
    "PADDOCK_METRICS": "0",
}
CAPS = "UPDATE plans SET concurrent_sandboxes = 1000000, sandboxes_per_day = 1000000 WHERE id = 'enterprise'"


def load() -> float:
    return machine.load_average()[0]


async def creates(
    cp_urls: list[str], key: str, seconds: float, concurrency: int, cp_pids: list[int]
) -> dict[str, Any]:
    clients = [
        httpx.AsyncClient(
            base_url=url, headers={"X-API-Key": key}, timeout=60, limits=httpx.Limits(max_connections=64)
        )
        for url in cp_urls
    ]
    made: list[tuple[httpx.AsyncClient, str]] = []
    latencies: list[float] = []
    failures: list[str] = []
    body = {"shape": SHAPE, "rootfs": IMAGE, "disk_mib": DISK_MIB}
    try:
        deadline = time.perf_counter() + seconds

        async def lane(index: int) -> None:
            http = clients[index % len(clients)]
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                answer = await http.post("/v1/sandboxes", json=body)
                if answer.status_code != 200:
                    failures.append(answer.text[:200])
                    continue
                latencies.append((time.perf_counter() - started) * 1000)
                made.append((http, answer.json()["data"]["id"]))

        # What the control planes use doing nothing asked (reconcilers, workers, listeners), to take
        # out of the per-create figure: at a few creates a second it is a large share of it.
        idle_before, idle_started = cpu_s(cp_pids), time.perf_counter()
        await asyncio.sleep(2.0)
        idle_per_s = (cpu_s(cp_pids) - idle_before) / (time.perf_counter() - idle_started)
        cpu_before = cpu_s(cp_pids)
        started = time.perf_counter()
        await asyncio.gather(*(lane(index) for index in range(concurrency)))
        wall = time.perf_counter() - started
        cpu_total_s = cpu_s(cp_pids) - cpu_before
        cpu_ms = cpu_total_s * 1000 / max(len(made), 1)
        net_ms = max(0.0, cpu_total_s - idle_per_s * wall) * 1000 / max(len(made), 1)
        for start in range(0, len(made), 20):  # untimed
            answers = await asyncio.gather(
                *(http.delete(f"/v1/sandboxes/{sandbox_id}") for http, sandbox_id in made[start : start + 20])
            )
            for answer in answers:
                assert answer.status_code in (200, 202), answer.text
        return {
            "creates": len(made),
            "per_s": len(made) / wall,
            "create_ms": summarize(latencies),
            "cp_cpu_ms_per_create": cpu_ms,
            "cp_idle_cpu_ms_per_s": idle_per_s * 1000,
            "cp_cpu_ms_per_create_net_of_idle": net_ms,
            "failures": len(failures),
            "first_failure": failures[0] if failures else None,
            "concurrency": concurrency,
        }
    finally:
        for http in clients:
            await http.aclose()


async def freshness(cp_urls: list[str], key: str, sandbox_id: str, rounds: int) -> dict[str, Any]:
    """A PATCH on the last control plane, then GETs on the first until they show it (ms after B's answer)."""
    a, b = (
        httpx.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=30)
        for url in (cp_urls[0], cp_urls[-1])
    )
    seen_ms: list[float] = []
    gets: list[float] = []  # GETs on A until one showed the change (1: the first one did)
    try:
        for n in range(rounds):
            await a.get(f"/v1/sandboxes/{sandbox_id}")  # A holds the current state, if it keeps any
            answer = await b.patch(f"/v1/sandboxes/{sandbox_id}", json={"auto_pause_after_seconds": 600 + n})
            assert answer.status_code == 200, answer.text
            written = time.perf_counter()
            polls = 0
            while True:
                polls += 1
                got = (await a.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
                if got.get("auto_pause_after_seconds") == 600 + n:
                    seen_ms.append((time.perf_counter() - written) * 1000)
                    gets.append(polls)
                    break
                assert time.perf_counter() - written < 5, f"control plane A never saw round {n}: {got}"
            await asyncio.sleep(0.05)
    finally:
        await a.aclose()
        await b.aclose()
    return {"seen_after_ms": summarize(seen_ms), "max_ms": max(seen_ms), "gets": summarize(gets)}


async def control_plane_rows(engine: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from tests.live import ControlPlaneProcess
    from tests.multihost.harness import ClusterControlPlane

    from paddock_controlplane.app import migrate
    from paddock_controlplane.resources import accounts
    from paddock_core.db import transaction

    out: dict[str, Any] = {}
    admin = name = None
    controlplanes: list[Any] = []
    fleet: FleetClient | None = None
    services: Any = None
    try:
        if engine == "postgresql":
            admin = admin_url()
            name = "pgmode_" + secrets.token_hex(5)
            database_url = admin.rsplit("/", 1)[0] + "/" + name
            await pg_execute(admin, f"CREATE DATABASE {name}")
            controlplanes = [
                ClusterControlPlane(state_dir=root / f"pg-cp{i}", pg_url=database_url, extra_env=dict(ENV))
                for i in range(2)
            ]
        else:
            controlplanes = [ControlPlaneProcess(state_dir=root / "sqlite-cp0", extra_env=dict(ENV))]
            database_url = controlplanes[0].database_url
        services = make_services(database_url, root / f"{engine}-bench")
        await migrate(services.settings)
        async with services.engine.begin() as connection:
            from sqlalchemy import text

            await connection.execute(text(CAPS))
        for cp in controlplanes:
            cp.start()
        cp_urls = [cp.url for cp in controlplanes]
        cp_pids = [cp.process.pid for cp in controlplanes]
        fleet = FleetClient(root / f"{engine}-fleet", cp_urls)
        # Enough stand-in hosts that no create is refused for room: each admits ~90 of these (the real
        # machine's memory, which every stand-in host reports). With 12, creates at 125/s filled them
        # within a run, and the row measured the room, not the control planes.
        await fleet.call("add", [(index, []) for index in range(args.hosts)])
        await fleet.call("beat_all")
        async with transaction(services.sessions) as session:
            user = await accounts.create_user(session, plan_id="enterprise", signup_credits=10**9)
            key = (await accounts.create_key(session, user.id)).plaintext

        async with httpx.AsyncClient(base_url=cp_urls[0], headers={"X-API-Key": key}, timeout=60) as http:
            made = await http.post(
                "/v1/sandboxes", json={"shape": SHAPE, "rootfs": IMAGE, "disk_mib": DISK_MIB}
            )
            assert made.status_code == 200, made.text
            sandbox_id = made.json()["data"]["id"]
            ready = await http.get(
                f"/v1/sandboxes/{sandbox_id}", params={"wait_for": "running", "wait_ms": 10000}
            )
            assert ready.json()["data"]["status"] == "running", ready.text

        path = f"{cp_urls[0]}/v1/sandboxes/{sandbox_id}"
        wrk(path, {"X-API-Key": key}, 1, 8)  # warm-up
        out["get"] = {"load": load(), **wrk(path, {"X-API-Key": key}, args.get_seconds, 8)}
        print(f"[{engine}] GET {out['get']['rps']:.0f}/s (load {out['get']['load']})", flush=True)
        if len(cp_urls) > 1:
            out["freshness"] = {
                "load": load(),
                **await freshness(cp_urls, key, sandbox_id, args.fresh_rounds),
            }
            print(f"[{engine}] B's PATCH seen on A after {out['freshness']['seen_after_ms']}", flush=True)
        # Untimed first: each control plane's first call to a host makes its link (an HTTP client with
        # its TLS context, ~10 ms of CPU, made by every create racing for it), once per host and process.
        await creates(cp_urls, key, args.create_warmup_seconds, args.concurrency, cp_pids)
        out["creates"] = {
            "load": load(),
            **await creates(cp_urls, key, args.create_seconds, args.concurrency, cp_pids),
        }
        print(
            f"[{engine}] creates {out['creates']['per_s']:.1f}/s (load {out['creates']['load']})", flush=True
        )
        return out
    finally:
        if fleet is not None:
            try:
                await fleet.stop()
            except Exception as exc:
                print(f"fleet stop: {exc!r}", file=sys.stderr)
        for cp in controlplanes:
            cp.stop()
            if getattr(cp, "owner", None) is not None:
                cp.remove()
        if services is not None:
            await services.engine.dispose()
        if admin is not None:
            await pg_execute(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    engines = ["sqlite", "postgresql"] if args.engine == "both" else [args.engine]
    results: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="paddock-pgmode-"))
    try:
        for engine in engines:
            results[engine] = await control_plane_rows(engine, args, root)
        hooks = argparse.Namespace(burst=args.burst, rate=100.0, seconds=5.0, concurrency=16)
        async with webhooks_bench.receiver_process() as url:
            for engine in engines:
                before = load()
                rows = dict(await webhooks_bench.run_engine(engine, url, hooks))
                results[engine]["webhooks"] = {
                    "load": before,
                    **{k.split(": ", 1)[1]: v for k, v in rows.items()},
                }
                print(f"[{engine}] webhooks {results[engine]['webhooks']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def markdown(meta: dict[str, Any], results: dict[str, Any]) -> str:
    lines = [
        f"# PostgreSQL mode beside SQLite ({meta['stamp']})",
        "",
        f"`{meta['command']}` at {meta.get('git_sha', '?')}, {meta.get('cpus', '?')} CPUs; load = 1-min load average before the row.",
        "",
        "| row | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def cell(engine: str, pick: Any) -> str:
        try:
            return str(pick(results[engine]))
        except (KeyError, TypeError):
            return "–"

    rows = [
        (
            "GET /v1/sandboxes/{id}, wrk 1×8",
            lambda r: (
                f"{r['get']['rps']:,.0f} req/s (p99 {r['get']['latency_ms'].get('p99', '?')} ms; load {r['get']['load']})"
            ),
        ),
        (
            "B's PATCH seen by a GET on A, p50 / max",
            lambda r: (
                f"{r['freshness']['seen_after_ms']['p50']:.1f} / {r['freshness']['max_ms']:.1f} ms (load {r['freshness']['load']})"
            ),
        ),
        (
            "creates through the API, stand-in agent",
            lambda r: (
                f"{r['creates']['per_s']:.1f}/s, p50 {r['creates']['create_ms']['p50']:.0f} ms, CP CPU {r['creates']['cp_cpu_ms_per_create']:.1f} ms each ({r['creates'].get('cp_cpu_ms_per_create_net_of_idle', float('nan')):.1f} net of their idle {r['creates'].get('cp_idle_cpu_ms_per_s', float('nan')):.0f} ms/s), {r['creates']['failures']} failed (load {r['creates']['load']})"
            ),
        ),
        (
            "webhooks: burst",
            lambda r: f"{r['webhooks']['burst']['rate']:,.0f}/s (load {r['webhooks']['load']})",
        ),
        (
            "webhooks: 100/s, committed → 2xx p50 / p99",
            lambda r: (
                f"{r['webhooks']['steady 100/s']['p50']:.1f} / {r['webhooks']['steady 100/s']['p99']:.1f} ms"
            ),
        ),
    ]
    for label, pick in rows:
        lines.append(f"| {label} | " + " | ".join(cell(engine, pick) for engine in results) + " |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    """The options of a run, with their defaults (``main`` and bench/run.py's ``pg_mode`` section)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--get-seconds", type=float, default=5.0)
    parser.add_argument("--fresh-rounds", type=int, default=20)
    parser.add_argument("--create-seconds", type=float, default=10.0)
    parser.add_argument("--create-warmup-seconds", type=float, default=3.0, help="untimed creates first")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--hosts", type=int, default=48, help="stand-in host agents")
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--tag", default="", help="appended to the results' file names (before, after …)")
    return parser


def main() -> None:
    args = parser().parse_args()
    from paddock_core.logging import configure_logging

    configure_logging("warning")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    results = asyncio.run(run(args))
    meta = {"stamp": stamp, "command": "python -m bench.pg_mode " + " ".join(sys.argv[1:]), **machine.facts()}
    text_out = markdown(meta, results)
    RESULTS.mkdir(exist_ok=True)
    suffix = f"-{args.tag}" if args.tag else ""
    (RESULTS / f"pgmode-{stamp}{suffix}.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1)
    )
    (RESULTS / f"pgmode-{stamp}{suffix}.md").write_text(text_out)
    print(text_out)


if __name__ == "__main__":
    main()
