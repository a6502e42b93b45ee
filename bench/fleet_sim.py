"""The fleet by simulation: 200 host agents and 100,000 sandbox records against two control planes on
one PostgreSQL database, measured beside a small fleet (3 hosts, 100 sandboxes) in the same run.

    .venv/bin/python -m bench.fleet_sim                       # 3 → 200 hosts, 100 → 100,000 sandboxes
    .venv/bin/python -m bench.fleet_sim --hosts 50 --sandboxes 20000 --samples 100

What is real and what stands in:

- two ``paddock controlplane`` processes (tests/multihost's ``ClusterControlPlane``), each with its
  reconciler and workers, on a fresh PostgreSQL database (``scripts/ensure-postgres.sh``; dropped at
  the end);
- the host agents are the real agent code (``SandboxManager`` and its registry, admission, lifecycle
  and heartbeat; the ``Registrar``; the internal HTTP app with its kept channel), each listening on its
  own port, over :class:`bench.fleet_driver.StandInRuntime`, a driver that creates no containers. 200
  agent processes do not fit this 2-core box (each is ~60 MB and a Python start), so they share one
  child process and its event loop: the control planes see 200 hosts at 200 addresses, and every
  call they make (heartbeat answers, creates over the kept channel, destroys) reaches an agent's
  own app and manager. The stand-in enforces no egress, so each agent's beat says it has no egress
  attempts and the audit writer asks none of them (it asked every host every 2 s before);
- the agents' beats are sent by their own ``Registrar.beat`` (the body, the failover list, the
  answer's overlay), driven from the fleet process: the measured bursts, and, with ``--beat-rate``, a
  steady background of that many beats a second (none by default: 200 hosts beating every 2 s would
  be 100 beats/s of 500 sandboxes each, more than this box's two cores, and a fixed rate of such beats
  loads the large phase with 15 times the small one's work, which hides what the fleet's size adds).
  The control planes are told a host is dead after 600 s, not 15, accordingly;
- the sandbox records of the large fleet are written to the database directly (rows as a create
  leaves them: running, on their host, billed up to now) and handed to their agents' registries, so
  each agent reports its own on every beat. A hundred users own them (1,000 each); the measured
  user owns the same 100 sandboxes in both phases.

Measured in each phase, the small fleet first:

- the scheduler's decision (``scheduler.pick_host`` in its own transaction, rolled back);
- heartbeats: a burst from the small fleet's three hosts (the same hosts, the same 33 sandboxes each,
  in both phases: what the fleet's size adds) and, in the large phase, from hosts of 500 sandboxes;
- a reconciler round (every pass of ``reconciler.PASSES``, each in its transaction as the loop runs
  them; the interval-gated billing passes left out, as most rounds leave them);
- one compute billing pass over every running sandbox, and creates by an owner of billed sandboxes
  timed while it runs;
- ``GET /v1/sandboxes/{id}``, ``GET /v1/sandboxes`` (first page) and ``POST /v1/sandboxes`` p50
  through the API, alternating between the two control planes.

Writes bench/results/fleet-<time>.json and .md; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing
import multiprocessing.connection
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, text
from tests.controlplane.hosts.rows import running_sandbox

from bench import machine
from bench.stats import summarize

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TOKEN = "test-host-agent-token-0123456789"  # the token tests/live.py gives its control planes
IMAGE = "debian:13"
SHAPE = "s-1vcpu-256mb"
MEM_MIB = 256
DISK_MIB = 2048
HOST_TOTAL_MIB = 1_000_000  # what a simulated host offers: room for every sandbox the sim places
PER_USER = 1000


# -- the fleet: host agents in one process ---------------------------------------------------------


class Fleet:
    """Runs in the fleet's child process: the agents, their servers and their beats."""

    def __init__(self, root: Path, cp_urls: list[str]) -> None:
        self.root = root
        self.cp_urls = cp_urls
        self.agents: dict[str, Any] = {}  # host id -> (manager, registrar, server, runtime)
        self.http: httpx.AsyncClient | None = None
        self.background: asyncio.Task[None] | None = None
        self.image_dir = root / "images"
        self.turn = 0
        self.in_flight: set[asyncio.Task[None]] = set()  # background beats being sent

    def _image(self) -> None:
        from paddock_hostagent.images import slug

        folder = self.image_dir / slug(IMAGE)
        (folder / "rootfs").mkdir(parents=True, exist_ok=True)
        (folder / "image.json").write_text(json.dumps({"name": IMAGE}))

    async def add(self, index: int, sandboxes: list[tuple[str, str]]) -> str:
        """Starts agent ``index`` holding ``sandboxes`` (id, address) running; returns its host id."""
        import socket

        import uvicorn

        from bench.fleet_driver import StandInRuntime
        from paddock_hostagent.app import api_app
        from paddock_hostagent.drivers.base import RuntimeState, SandboxRecord
        from paddock_hostagent.images import ImageStore
        from paddock_hostagent.records import RecordStore
        from paddock_hostagent.registrar import Registrar
        from paddock_hostagent.sandboxes import SandboxManager
        from paddock_hostagent.sandboxes.registry import Entry
        from paddock_hostagent.settings import HostAgentSettings

        if self.http is None:
            self._image()
            self.http = httpx.AsyncClient(
                timeout=30.0,
                headers={"Authorization": f"Bearer {TOKEN}"},
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            )
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        host_id = f"fleet-{index:03d}"
        settings = HostAgentSettings(
            id=host_id,
            host="127.0.0.1",
            port=port,
            token=TOKEN,
            controlplane_url=",".join(self.cp_urls),
            state_dir=self.root / host_id,
            image_dir=self.image_dir,
            total_mib=HOST_TOTAL_MIB,
            reserved_mib=0,
            pool_size=0,
            pool_kind_max=0,
            disk_watch_interval_s=60.0,
            guest_poll_interval_s=3600.0,
            subnet=f"10.{index % 250}.0.0/16",
        )
        runtime = StandInRuntime(f"10.{index % 250}.128.0/17")
        manager = SandboxManager(
            settings, runtime, ImageStore(self.image_dir), RecordStore(settings.state_dir / "s")
        )
        manager.runtime_label = "crun"
        await manager.start()
        for sandbox_id, ip in sandboxes:
            record = SandboxRecord(
                id=sandbox_id,
                name=sandbox_id,
                image=IMAGE,
                ip=ip,
                state=RuntimeState.RUNNING,
                driver="crun",
                vcpu=1,
                mem_mib=MEM_MIB,
                disk_mib=DISK_MIB,
                cpu_quota_pct=None,
            )
            manager.registry.entries[sandbox_id] = Entry(record)
            runtime.states[sandbox_id] = RuntimeState.RUNNING
        app = api_app(lambda header: header == f"Bearer {TOKEN}")
        app.state.manager = manager
        registrar = Registrar(settings, manager)
        app.state.registrar = registrar
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[listener]), name=f"agent {host_id}")
        while not server.started:
            if task.done():
                raise RuntimeError(f"agent {host_id} did not start: {task.exception()!r}")
            await asyncio.sleep(0.01)
        self.agents[host_id] = (manager, registrar, server, task)
        return host_id

    async def beat(self, host_id: str) -> float:
        """One beat of ``host_id`` by its registrar, to the control planes in turn; its seconds."""
        assert self.http is not None
        registrar = self.agents[host_id][1]
        urls = registrar.heartbeat_urls()
        self.turn += 1
        started = time.perf_counter()
        # As the registrar's loop does: on failure, the next control plane within the same beat (a
        # kept-alive connection the server closed while idle fails once).
        ok = False
        for attempt in range(len(urls)):
            if await registrar.beat(self.http, urls[(self.turn + attempt) % len(urls)]):
                ok = True
                break
        took = time.perf_counter() - started
        assert ok, f"heartbeat of {host_id} failed"
        return took

    async def burst(self, host_ids: list[str], count: int, concurrency: int) -> dict[str, Any]:
        """``count`` beats of ``host_ids`` in turn, ``concurrency`` at once: per beat and per second."""
        queue = [host_ids[i % len(host_ids)] for i in range(count)]
        times: list[float] = []

        async def lane() -> None:
            while queue:
                times.append(await self.beat(queue.pop()) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        return {"beat_ms": summarize(times), "beats_per_s": count / wall, "concurrency": concurrency}

    async def beat_all(self) -> None:
        ids = list(self.agents)
        for start in range(0, len(ids), 8):
            await asyncio.gather(*(self.beat(host_id) for host_id in ids[start : start + 8]))

    async def set_background(self, rate: float) -> None:
        """Beats of every agent in turn at ``rate`` a second, in the background (0: none)."""
        if self.background is not None:
            self.background.cancel()
            await asyncio.gather(self.background, return_exceptions=True)
            self.background = None
        if rate <= 0:
            return

        async def run() -> None:
            index = 0
            while True:
                ids = list(self.agents)
                host_id = ids[index % len(ids)]
                index += 1
                beat = asyncio.create_task(self._quiet_beat(host_id))
                self.in_flight.add(beat)
                beat.add_done_callback(self.in_flight.discard)
                await asyncio.sleep(1.0 / rate)

        self.background = asyncio.create_task(run(), name="background beats")

    async def _quiet_beat(self, host_id: str) -> None:
        try:
            await self.beat(host_id)
        except Exception as exc:  # counted by the control plane's liveness; shown here
            print(f"background beat of {host_id} failed: {exc!r}", file=sys.stderr)

    def held(self) -> dict[str, int]:
        return {host_id: len(agent[0].registry.entries) for host_id, agent in self.agents.items()}

    async def close(self) -> None:
        await self.set_background(0)
        # The agents' servers stop; their managers are not closed (a close saves every record, 100,000
        # files the sim removes next), and their watchers end with this process.
        for _, _, server, _ in self.agents.values():
            server.should_exit = True
        await asyncio.gather(*(agent[3] for agent in self.agents.values()), return_exceptions=True)
        if self.http is not None:
            await self.http.aclose()


def fleet_main(conn: multiprocessing.connection.Connection, root: str, cp_urls: list[str]) -> None:
    """The fleet's child process: commands in, answers out, one at a time."""
    from paddock_core.logging import configure_logging

    configure_logging("warning", json=True)
    os.environ["PADDOCK_METRICS"] = "0"

    async def serve() -> None:
        fleet = Fleet(Path(root), cp_urls)
        loop = asyncio.get_running_loop()
        while True:
            command, args = await loop.run_in_executor(None, conn.recv)
            try:
                if command == "add":
                    answer: Any = [await fleet.add(index, sandboxes) for index, sandboxes in args]
                elif command == "beat_all":
                    await fleet.beat_all()
                    answer = None
                elif command == "burst":
                    answer = await fleet.burst(*args)
                elif command == "background":
                    await fleet.set_background(args)
                    answer = None
                elif command == "held":
                    answer = fleet.held()
                elif command == "stop":
                    await fleet.close()
                    conn.send(("ok", None))
                    return
                else:
                    raise ValueError(command)
                conn.send(("ok", answer))
            except Exception as exc:
                conn.send(("error", repr(exc)))

    asyncio.run(serve())


class FleetClient:
    def __init__(self, root: Path, cp_urls: list[str]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=fleet_main, args=(child, str(root), cp_urls), daemon=True)
        self.process.start()

    async def call(self, command: str, args: Any = None) -> Any:
        self.conn.send((command, args))
        status, answer = await asyncio.get_running_loop().run_in_executor(None, self.conn.recv)
        if status != "ok":
            raise RuntimeError(f"fleet {command}: {answer}")
        return answer

    async def stop(self) -> None:
        if self.process.is_alive():
            await self.call("stop")
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


# -- the database ------------------------------------------------------------------------------------


async def pg_execute(url: str, statement: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as connection:
            await connection.execute(text(statement))
    finally:
        await engine.dispose()


def admin_url() -> str:
    url = (
        os.environ.get("PADDOCK_TEST_PG_URL")
        or subprocess.run(
            [str(REPO / "scripts" / "ensure-postgres.sh")], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    return url


async def seed_rows(services: Any, rows: list[dict[str, Any]]) -> None:
    from paddock_controlplane.records.models import Sandbox

    async with services.engine.begin() as connection:
        for start in range(0, len(rows), 5000):
            await connection.execute(insert(Sandbox.__table__), rows[start : start + 5000])


def sandbox_row(sandbox_id: str, user_id: str, host_id: str, ip: str, now: dt.datetime) -> dict[str, Any]:
    """A sandbox row as a create leaves it: running on its host for five minutes, billed up to now."""
    started = now - dt.timedelta(minutes=5)
    return {
        **running_sandbox(sandbox_id, user_id, host_id, started, mem_mib=MEM_MIB, shape=SHAPE),
        "rootfs": IMAGE,
        "disk_mib": DISK_MIB,
        "ip": ip,
        "ingress_enabled": False,
        "bandwidth_quota_bytes": 5 * 1024**3,
        "bandwidth_used_bytes": 0,
        "bandwidth_ingress_bytes": 0,
        "hibernated": False,
        "oom_kills": 0,
        "running_at": started,
        "last_activity_at": started,
        "billed_until": now,
    }


def make_services(database_url: str, data_dir: Path) -> Any:
    """The control plane's services over the sim's database, wired as ``app.py``'s lifespan wires them,
    for the scheduler's and the reconciler's own timings (the two serving control planes run their own)."""
    from paddock_controlplane.app import create_app  # noqa: F401 - registers the session events
    from paddock_controlplane.records.hotcache import StatusWatch, TTLCache
    from paddock_controlplane.records.services import Services
    from paddock_controlplane.settings import ControlPlaneSettings
    from paddock_core.crypto import SecretBox
    from paddock_core.db import PointReads, make_engine, make_sessionmaker
    from paddock_core.timeutil import utcnow

    settings = ControlPlaneSettings(
        database_url=database_url,
        data_dir=data_dir,
        host_token=TOKEN,
        secret_key="fleet-sim-secret-key-0123456789",
        region="eu",
        host_dead_after_s=600,
    )
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    running: Any = TTLCache(settings.hot_cache_ttl_s)
    status_watch = StatusWatch()
    sessions.configure(
        info={
            "running_cache": running,
            "ingress_cache": TTLCache(settings.hot_cache_ttl_s),
            "status_watch": status_watch,
        }
    )
    return Services(
        settings=settings,
        engine=engine,
        sessions=sessions,
        reads=PointReads(database_url, sessions),
        principals=TTLCache(settings.hot_cache_ttl_s),
        running=running,
        secret_box=SecretBox(settings.secret_key.get_secret_value()),
        clock=utcnow,
        status_watch=status_watch,
    )


# -- the measurements --------------------------------------------------------------------------------


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far: on a box others load too,
    what an operation costs the control planes, where its wall time also holds the waits for a core."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)
    return total / os.sysconf("SC_CLK_TCK")


async def time_scheduler(services: Any, samples: int) -> dict[str, Any]:
    from paddock_controlplane.hosts import scheduler

    times: list[float] = []
    for _ in range(samples):
        async with services.sessions() as session:
            started = time.perf_counter()
            await scheduler.pick_host(
                session,
                mem_mib=MEM_MIB,
                rootfs=IMAGE,
                now=services.clock(),
                dead_after_s=services.settings.host_dead_after_s,
            )
            times.append((time.perf_counter() - started) * 1000)
            await session.rollback()
    return summarize(times)


async def time_reconciler(services: Any, rounds: int) -> dict[str, Any]:
    from paddock_controlplane.workers import reconciler
    from paddock_core.db import transaction

    passes = reconciler.PASSES
    per_pass: dict[str, list[float]] = {}
    totals: list[float] = []
    for _ in range(rounds):
        services.liveness_since = time.monotonic() - 10_000  # judged now, as a long-running process does
        # The billing passes run every billing_interval_s, not every round: timed apart (time_billing).
        services.billing_last = services.storage_billing_last = time.monotonic()
        total = 0.0
        for step in passes:
            name = getattr(step, "__name__", type(step).__name__)
            started = time.perf_counter()
            async with transaction(services.sessions) as session:
                await step(session, services)
            took = (time.perf_counter() - started) * 1000
            per_pass.setdefault(name, []).append(took)
            total += took
        totals.append(total)
        await asyncio.sleep(0.2)
    return {
        "round_ms": summarize(totals),
        "passes_ms": {name: summarize(values) for name, values in per_pass.items()},
    }


async def time_billing(
    services: Any, timeout_s: float, cp_urls: list[str], key: str, most_creates: int = 20
) -> dict[str, Any]:
    """One compute billing pass (``billing.billing_pass``: every running sandbox, a batch per
    transaction), given up after ``timeout_s``; and creates by the measured user, whose 100 sandboxes
    the pass settles, timed through the API while it runs (at least one, started with the pass): a
    create waits on its owner's row, which the pass holds only for a batch."""
    from paddock_controlplane.resources import billing

    async def one_pass() -> float:
        started = time.perf_counter()
        async with asyncio.timeout(timeout_s):
            await billing.billing_pass(services.sessions, services.clock())
        return (time.perf_counter() - started) * 1000

    clients = [httpx.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=120) for url in cp_urls]
    create_ms: list[float] = []
    made: list[tuple[httpx.AsyncClient, str]] = []
    try:
        billing_task = asyncio.create_task(one_pass())
        body = {"shape": SHAPE, "rootfs": IMAGE, "disk_mib": DISK_MIB}
        while len(create_ms) < most_creates and (not create_ms or not billing_task.done()):
            http = clients[len(create_ms) % len(clients)]
            started = time.perf_counter()
            answer = await http.post("/v1/sandboxes", json=body)
            create_ms.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, answer.text
            made.append((http, answer.json()["data"]["id"]))
        try:
            pass_ms: float | None = await billing_task
        except TimeoutError:
            pass_ms = None
        for http, sandbox_id in made:
            answer = await http.delete(f"/v1/sandboxes/{sandbox_id}")
            assert answer.status_code in (200, 202), answer.text
    finally:
        for http in clients:
            await http.aclose()
    out: dict[str, Any] = {"ms": pass_ms, "create_during_ms": summarize(create_ms)}
    if pass_ms is None:
        out["gave_up_after_s"] = timeout_s
    return out


async def time_api(
    cp_urls: list[str], key: str, sandbox_ids: list[str], samples: int, creates: int, cp_pids: list[int]
) -> dict[str, Any]:
    clients = [httpx.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=60) for url in cp_urls]
    try:
        get_ms: list[float] = []
        list_ms: list[float] = []
        create_ms: list[float] = []
        made: list[tuple[httpx.AsyncClient, str]] = []

        async def timed(call: Callable[[], Awaitable[httpx.Response]], into: list[float]) -> httpx.Response:
            started = time.perf_counter()
            answer = await call()
            into.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, answer.text
            return answer

        cpu_reads = cpu_s(cp_pids)
        for index in range(samples):
            http = clients[index % len(clients)]
            sandbox_id = sandbox_ids[index % len(sandbox_ids)]
            await timed(lambda: http.get(f"/v1/sandboxes/{sandbox_id}"), get_ms)  # noqa: B023
            await timed(lambda: http.get("/v1/sandboxes", params={"limit": 20}), list_ms)  # noqa: B023
        cpu_reads = (cpu_s(cp_pids) - cpu_reads) * 1000 / samples
        cpu_creates = cpu_s(cp_pids)
        for index in range(creates):
            http = clients[index % len(clients)]
            body = {"shape": SHAPE, "rootfs": IMAGE, "disk_mib": DISK_MIB}
            answer = await timed(lambda: http.post("/v1/sandboxes", json=body), create_ms)  # noqa: B023
            made.append((http, answer.json()["data"]["id"]))
        cpu_creates = (cpu_s(cp_pids) - cpu_creates) * 1000 / max(creates, 1)
        for http, sandbox_id in made:  # untimed: the next phase starts from the same count
            answer = await http.delete(f"/v1/sandboxes/{sandbox_id}")
            assert answer.status_code in (200, 202), answer.text
        return {
            "get_ms": summarize(get_ms),
            "list_ms": summarize(list_ms),
            "create_ms": summarize(create_ms),
            "cp_cpu_ms_per_get_and_list": cpu_reads,
            "cp_cpu_ms_per_create": cpu_creates,
        }
    finally:
        for http in clients:
            await http.aclose()


async def measure(
    label: str,
    services: Any,
    fleet: FleetClient,
    cp_urls: list[str],
    key: str,
    user_sandboxes: list[str],
    small_hosts: list[str],
    dense_hosts: list[str],
    args: argparse.Namespace,
    cp_pids: list[int],
) -> dict[str, Any]:
    print(f"[{label}] measuring", flush=True)
    out: dict[str, Any] = {"load_before": machine.load_average()}
    out["scheduler_ms"] = await time_scheduler(services, args.samples)
    for name, hosts in (("heartbeat_small_hosts", small_hosts), ("heartbeat_dense_hosts", dense_hosts)):
        if not hosts:
            continue
        before = cpu_s(cp_pids)
        out[name] = await fleet.call("burst", (hosts, args.beats, args.beat_concurrency))
        out[name]["cp_cpu_ms_per_beat"] = (cpu_s(cp_pids) - before) * 1000 / args.beats
    out["reconciler"] = await time_reconciler(services, args.rounds)
    out["billing_pass"] = await time_billing(services, args.billing_timeout, cp_urls, key)
    out.update(await time_api(cp_urls, key, user_sandboxes, args.samples, args.creates, cp_pids))
    out["load_after"] = machine.load_average()
    return out


# -- the run -----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.multihost.harness import ClusterControlPlane

    from paddock_controlplane.app import migrate
    from paddock_controlplane.resources import accounts
    from paddock_core import ids
    from paddock_core.db import transaction

    admin = admin_url()
    name = "fleet_" + secrets.token_hex(5)
    database_url = admin.rsplit("/", 1)[0] + "/" + name
    await pg_execute(admin, f"CREATE DATABASE {name}")
    root = Path(tempfile.mkdtemp(prefix="paddock-fleet-"))
    controlplanes: list[Any] = []
    fleet: FleetClient | None = None
    services: Any = None
    try:
        services = make_services(database_url, root / "bench-cp")
        await migrate(services.settings)
        # The sim's accounts hold a thousand sandboxes each: the enterprise plan's caps are raised in
        # this database only, before the control planes start.
        await pg_execute(
            database_url,
            "UPDATE plans SET concurrent_sandboxes = 1000000, sandboxes_per_day = 1000000 WHERE id = 'enterprise'",
        )
        env = {
            "PADDOCK_CP_HOST_DEAD_AFTER_S": "600",
            # A compute billing pass settles every running sandbox (a batch per transaction): work that
            # grows with the fleet by nature, every billing_interval_s. It is timed apart, with creates
            # during it (time_billing); the serving control planes bill once an hour here, so the other
            # measurements show what the fleet's size adds to each operation.
            "PADDOCK_CP_BILLING_INTERVAL_S": "3600",
            "PADDOCK_CP_RECONCILE_INTERVAL_S": "1.0",
            "PADDOCK_CP_METRICS_INTERVAL_S": "0",
            "PADDOCK_CP_LOG_LEVEL": "warning",
            "PADDOCK_METRICS": "0",
        }
        if args.audit_egress_poll_s is not None:
            env["PADDOCK_CP_AUDIT_EGRESS_POLL_S"] = str(args.audit_egress_poll_s)
        for index in range(2):
            cp = ClusterControlPlane(state_dir=root / f"cp{index}", pg_url=database_url, extra_env=dict(env))
            cp.start()
            controlplanes.append(cp)
        cp_urls = [cp.url for cp in controlplanes]
        cp_pids = [cp.process.pid for cp in controlplanes]
        fleet = FleetClient(root / "fleet", cp_urls)

        async with transaction(services.sessions) as session:
            user = await accounts.create_user(session, plan_id="enterprise", signup_credits=10**9)
            key = (await accounts.create_key(session, user.id)).plaintext
            user_id = user.id

        now = dt.datetime.now(dt.UTC)
        # The small fleet: 3 hosts, the measured user's 100 sandboxes.
        small_plan: list[list[tuple[str, str]]] = [[] for _ in range(args.small_hosts)]
        rows = []
        user_sandboxes = []
        for n in range(args.small_sandboxes):
            host = n % args.small_hosts
            sandbox_id, ip = ids.new_id("sbx"), f"10.{host}.1.{n // args.small_hosts + 2}"
            small_plan[host].append((sandbox_id, ip))
            rows.append(sandbox_row(sandbox_id, user_id, f"fleet-{host:03d}", ip, now))
            user_sandboxes.append(sandbox_id)
        small_hosts = await fleet.call("add", list(enumerate(small_plan)))
        await fleet.call("beat_all")  # the hosts' rows
        await seed_rows(services, rows)
        await fleet.call("beat_all")
        await fleet.call("background", args.beat_rate)
        await asyncio.sleep(2)
        results: dict[str, Any] = {}
        results["small"] = await measure(
            "small", services, fleet, cp_urls, key, user_sandboxes, small_hosts, [], args, cp_pids
        )
        results["small"]["fleet"] = {"hosts": args.small_hosts, "sandboxes": args.small_sandboxes}

        # Grow to the large fleet.
        print(f"growing to {args.hosts} hosts and {args.sandboxes} sandboxes", flush=True)
        await fleet.call("background", 0)
        extra_hosts = args.hosts - args.small_hosts
        extra = args.sandboxes - args.small_sandboxes
        plan: list[list[tuple[str, str]]] = [[] for _ in range(extra_hosts)]
        rows = []
        owners: list[str] = []
        async with transaction(services.sessions) as session:
            for _ in range((extra + PER_USER - 1) // PER_USER):
                owners.append(
                    (await accounts.create_user(session, plan_id="enterprise", signup_credits=10**9)).id
                )
        for n in range(extra):
            slot = n % extra_hosts
            index = args.small_hosts + slot
            count = n // extra_hosts
            sandbox_id = ids.new_id("sbx")
            ip = f"10.{index % 250}.{2 + count // 250}.{count % 250 + 2}"
            plan[slot].append((sandbox_id, ip))
            rows.append(sandbox_row(sandbox_id, owners[n // PER_USER], f"fleet-{index:03d}", ip, now))
        batch = 20
        new_hosts: list[str] = []
        for start in range(0, extra_hosts, batch):
            chunk = [(args.small_hosts + i, plan[i]) for i in range(start, min(start + batch, extra_hosts))]
            new_hosts += await fleet.call("add", chunk)
        await fleet.call("beat_all")
        await seed_rows(services, rows)
        # The 100,000 rows as autovacuum keeps a live database's: the planner's statistics of them
        # (and with --vacuum, hint bits set and pages visible). Committed: an ANALYZE in a transaction
        # that is rolled back, as this one was until 2026-12-05, leaves no column statistics, so the
        # large fleet was measured on the small fleet's (one user, three hosts).
        await pg_execute(database_url, "VACUUM ANALYZE" if args.vacuum else "ANALYZE")
        await fleet.call("beat_all")
        await fleet.call("background", args.beat_rate)
        await asyncio.sleep(2)
        results["large"] = await measure(
            "large", services, fleet, cp_urls, key, user_sandboxes, small_hosts, new_hosts[:20], args, cp_pids
        )
        results["large"]["fleet"] = {"hosts": args.hosts, "sandboxes": args.sandboxes}
        await fleet.call("background", 0)
        statuses = await host_statuses(services)
        results["hosts_by_status"] = statuses
        return results
    finally:
        if fleet is not None:
            try:
                await fleet.stop()
            except Exception as exc:
                print(f"fleet stop: {exc!r}", file=sys.stderr)
        for cp in controlplanes:
            cp.stop()
        if sys.exc_info()[0] is not None:  # a failed run keeps its control planes' logs
            kept = Path(tempfile.mkdtemp(prefix="paddock-fleet-logs-"))
            for cp in controlplanes:
                if cp.log_path.exists():
                    shutil.copy(cp.log_path, kept / f"{cp.state_dir.name}.log")
            print(f"control-plane logs kept in {kept}", file=sys.stderr)
        if services is not None:
            await services.engine.dispose()
        await pg_execute(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        shutil.rmtree(root, ignore_errors=True)


async def host_statuses(services: Any) -> dict[str, int]:
    async with services.engine.connect() as connection:
        rows = (await connection.execute(text("SELECT status, count(*) FROM hosts GROUP BY status"))).all()
    return {str(status): int(count) for status, count in rows}


# -- the report --------------------------------------------------------------------------------------

ROWS = [
    ("scheduler's decision (`pick_host`)", lambda r: r["scheduler_ms"]["p50"], "ms"),
    (
        "heartbeats/s, the 3 small hosts (33 sandboxes each)",
        lambda r: r["heartbeat_small_hosts"]["beats_per_s"],
        "/s",
    ),
    ("heartbeat, the 3 small hosts, p50", lambda r: r["heartbeat_small_hosts"]["beat_ms"]["p50"], "ms"),
    ("reconciler round (every pass)", lambda r: r["reconciler"]["round_ms"]["p50"], "ms"),
    ("`GET /v1/sandboxes/{id}` p50", lambda r: r["get_ms"]["p50"], "ms"),
    ("`GET /v1/sandboxes` (first page) p50", lambda r: r["list_ms"]["p50"], "ms"),
    ("`POST /v1/sandboxes` p50", lambda r: r["create_ms"]["p50"], "ms"),
    (
        "control planes' CPU per heartbeat, small hosts",
        lambda r: r["heartbeat_small_hosts"]["cp_cpu_ms_per_beat"],
        "ms",
    ),
    ("control planes' CPU per GET + list", lambda r: r["cp_cpu_ms_per_get_and_list"], "ms"),
    ("control planes' CPU per create", lambda r: r["cp_cpu_ms_per_create"], "ms"),
]


def markdown(meta: dict[str, Any], results: dict[str, Any]) -> str:
    small, large = results["small"], results["large"]
    lines = [
        f"# Fleet simulation, {meta['stamp']}",
        "",
        f"`{meta['command']}` at {meta['git_sha']}; load {small['load_before']} → {large['load_after']} "
        f"(1/5/15 min). Small: {small['fleet']['hosts']} hosts, {small['fleet']['sandboxes']:,} sandboxes; "
        f"large: {large['fleet']['hosts']} hosts, {large['fleet']['sandboxes']:,} sandboxes; two control planes on "
        "one PostgreSQL.",
        "",
        "| measurement | small fleet | large fleet | large / small |",
        "|---|---|---|---|",
    ]
    for label, pick, unit in ROWS:
        a, b = pick(small), pick(large)
        ratio = (a / b) if unit == "/s" else (b / a)  # a rate that falls is a cost that grows
        lines.append(f"| {label} | {a:,.2f} {unit} | {b:,.2f} {unit} | {ratio:.2f}× |")
    dense = large.get("heartbeat_dense_hosts")
    if dense:
        lines += [
            "",
            f"Heartbeats of hosts holding {large['fleet']['sandboxes'] // large['fleet']['hosts']:,} sandboxes: "
            f"{dense['beats_per_s']:,.1f}/s, p50 {dense['beat_ms']['p50']:,.1f} ms "
            f"(concurrency {dense['concurrency']}); control planes' CPU {dense['cp_cpu_ms_per_beat']:,.1f} ms a beat.",
        ]
    bills = [r["billing_pass"] for r in (small, large)]
    shown = [
        f"{b['ms']:,.0f} ms" if b.get("ms") is not None else f"over {b['gave_up_after_s']:.0f} s"
        for b in bills
    ]
    lines += ["", f"One compute billing pass (every running sandbox): {shown[0]} → {shown[1]}."]
    during = [b.get("create_during_ms") for b in bills]
    if all(during):
        lines.append(
            "`POST /v1/sandboxes` by an owner of billed sandboxes while the pass runs: p50 "
            f"{during[0]['p50']:,.1f} → {during[1]['p50']:,.1f} ms, max {during[0]['max']:,.1f} → "
            f"{during[1]['max']:,.1f} ms ({during[0]['n']} → {during[1]['n']} creates)."
        )
    lines += ["", "Reconciler passes, p50 ms (small → large):", ""]
    for name, stats in large["reconciler"]["passes_ms"].items():
        before = small["reconciler"]["passes_ms"].get(name, {}).get("p50", float("nan"))
        lines.append(f"- `{name}`: {before:,.2f} → {stats['p50']:,.2f}")
    lines += ["", f"Hosts at the end: {results['hosts_by_status']}", ""]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The options of a run, with their defaults (``main`` and bench/run.py's ``fleet`` section)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--sandboxes", type=int, default=100_000)
    parser.add_argument("--small-hosts", type=int, default=3)
    parser.add_argument("--small-sandboxes", type=int, default=100)
    parser.add_argument("--samples", type=int, default=200, help="timed scheduler decisions, GETs and lists")
    parser.add_argument("--creates", type=int, default=40)
    parser.add_argument("--beats", type=int, default=150, help="beats per heartbeat burst")
    parser.add_argument("--beat-concurrency", type=int, default=4)
    parser.add_argument("--beat-rate", type=float, default=0.0, help="background beats per second (0: none)")
    parser.add_argument("--rounds", type=int, default=10, help="timed reconciler rounds")
    parser.add_argument(
        "--audit-egress-poll-s",
        type=float,
        default=None,
        help="the control planes' poll of the hosts with egress attempts to record (default theirs: 2 s)",
    )
    parser.add_argument(
        "--vacuum",
        action="store_true",
        help="VACUUM ANALYZE the database once the large fleet's rows are in (default: ANALYZE only)",
    )
    parser.add_argument(
        "--billing-timeout", type=float, default=30.0, help="seconds a timed billing pass may take"
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    results = asyncio.run(run(args))
    meta = {
        "stamp": stamp,
        "command": "python -m bench.fleet_sim " + " ".join(sys.argv[1:]),
        **machine.facts(),
    }
    text_out = markdown(meta, results)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"fleet-{stamp}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (RESULTS / f"fleet-{stamp}.md").write_text(text_out)
    print(text_out)


if __name__ == "__main__":
    main()
