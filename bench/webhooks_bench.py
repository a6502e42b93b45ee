"""Webhook delivery throughput and latency to a loopback receiver.

    .venv/bin/python -m bench.webhooks_bench                       # SQLite
    .venv/bin/python -m bench.webhooks_bench --engine both         # and PostgreSQL (PADDOCK_TEST_PG_URL)

Rows:
- floor: bare POSTs of the same signed body to the same receiver, no database: one at a time (the
  latency floor) and at the worker's concurrency (the throughput floor). They use aiohttp, the client
  the worker's transport uses; httpx was the floor until it turned out to be the bottleneck (~1,100/s
  on one lane here, falling to ~250-500/s on 16 lanes, while a raw-socket client drove this receiver
  past 40,000/s), so a floor measured with it could not show a 1,000/s goal;
- burst: N events emitted up front, then one worker drains them (deliveries/s);
- steady: events emitted one per transaction at a fixed rate while the worker runs; latency is the
  time from the emitting commit's ``occurredAt`` to the recorded 2xx (``deliveredAt``).

The receiver runs in its own process (uvicorn with httptools and uvloop, answers 204), so its CPU is
not the measuring process's. Prints a table; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from pydantic import SecretStr
from sqlalchemy import delete, select

import paddock_controlplane
from paddock_controlplane.records.models import WebhookDelivery
from paddock_controlplane.resources import accounts, webhooks
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_controlplane.workers.webhook_delivery import DeliveryWorker, sign
from paddock_core.crypto import SecretBox
from paddock_core.db import make_engine, make_sessionmaker, transaction, upgrade
from paddock_core.logging import configure_logging
from paddock_core.timeutil import as_utc, utcnow

MIGRATIONS = Path(paddock_controlplane.__file__).parent / "records" / "migrations"
KEY = "bench-secret-key-0123456789"
DATA = {"sandbox_id": "sb-bench", "shape": "s-1vcpu-1gb", "disk_mib": 10240, "region": "eu"}

RECEIVER = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
uvicorn.run(app, fd=int(sys.argv[1]), log_level="warning", access_log=False)
"""


@asynccontextmanager
async def receiver_process() -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, str(sock.fileno())], pass_fds=[sock.fileno()])
    sock.close()
    url = f"http://127.0.0.1:{port}/hook"
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(100):
                try:
                    await client.post(url, content=b"{}")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait()


@asynccontextmanager
async def scratch_database(engine: str) -> AsyncIterator[str]:
    if engine == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite+aiosqlite:///{tmp}/bench.db"
        return
    import asyncpg

    admin = os.environ.get(
        "PADDOCK_TEST_PG_URL", "postgresql+asyncpg://paddock:paddock@127.0.0.1:5432/postgres"
    )
    dsn = admin.replace("postgresql+asyncpg://", "postgresql://")
    name = "bench_" + secrets.token_hex(4)
    conn = await asyncpg.connect(dsn)
    await conn.execute(f"CREATE DATABASE {name}")
    try:
        yield admin.rsplit("/", 1)[0] + "/" + name
    finally:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.close()


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


async def floor(url: str, n: int, concurrency: int) -> dict[str, Any]:
    body = webhooks.render_payload("sandbox.create", DATA, utcnow()).encode()
    latencies: list[float] = []
    queue = list(range(n))
    connector = aiohttp.TCPConnector(limit=256, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as client:

        async def one_lane() -> None:
            while queue:
                queue.pop()
                started = time.perf_counter()
                ts = int(time.time())
                headers = {"Content-Type": "application/json", "X-Webhook-Signature": sign("s", ts, body)}
                async with client.post(url, data=body, headers=headers, allow_redirects=False) as response:
                    assert response.status == 204
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(one_lane() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"n": n, "rate": n / elapsed, "p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


async def delivered_latencies(sessions: Any) -> list[float]:
    async with sessions() as session:
        rows = (
            await session.execute(
                select(WebhookDelivery.created_at, WebhookDelivery.delivered_at).where(
                    WebhookDelivery.status == "delivered"
                )
            )
        ).all()
    return [(as_utc(done) - as_utc(made)).total_seconds() * 1000 for made, done in rows]


async def wait_delivered(sessions: Any, n: int, timeout_s: float = 300) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        async with sessions() as session:
            done = await session.scalar(
                select(WebhookDelivery.id).where(WebhookDelivery.status != "delivered").limit(1)
            )
        if done is None:
            async with sessions() as session:
                count = len((await session.scalars(select(WebhookDelivery.id))).all())
            if count >= n:
                return
        await asyncio.sleep(0.02)
    raise TimeoutError("deliveries did not finish")


async def run_engine(
    engine_name: str, url: str, args: argparse.Namespace
) -> list[tuple[str, dict[str, Any]]]:
    results: list[tuple[str, dict[str, Any]]] = []
    async with scratch_database(engine_name) as database_url:
        await upgrade(MIGRATIONS, database_url)
        engine = make_engine(database_url)
        sessions = make_sessionmaker(engine)
        box = SecretBox(KEY)
        settings = ControlPlaneSettings(
            database_url=database_url,
            secret_key=SecretStr(KEY),
            webhook_allow_private_targets=True,
            webhook_concurrency=args.concurrency,
            webhook_poll_interval_s=0.2,
        )
        async with transaction(sessions) as session:
            user = await accounts.create_user(session, plan_id="enterprise", signup_credits=500)
        await webhooks.create_endpoint(
            sessions, box, user_id=user.id, url=url, events=None, allow_private=True
        )

        # burst: everything emitted first, then drained
        for start in range(0, args.burst, 500):
            async with transaction(sessions) as session:
                for _ in range(start, min(args.burst, start + 500)):
                    await webhooks.emit(session, user_id=user.id, action="sandbox.create", data=DATA)
        worker = DeliveryWorker(sessions, box, settings)
        started = time.perf_counter()
        worker.start()
        await wait_delivered(sessions, args.burst)
        elapsed = time.perf_counter() - started
        await worker.stop()
        results.append((f"{engine_name}: burst", {"n": args.burst, "rate": args.burst / elapsed}))

        async with transaction(sessions) as session:
            await session.execute(delete(WebhookDelivery))

        # steady: one event per transaction at a fixed rate, worker running
        worker = DeliveryWorker(sessions, box, settings)
        worker.start()
        interval = 1 / args.rate
        total = int(args.rate * args.seconds)
        started = time.perf_counter()
        for i in range(total):
            async with transaction(sessions) as session:
                await webhooks.emit(session, user_id=user.id, action="sandbox.create", data=DATA)
            delay = started + (i + 1) * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await wait_delivered(sessions, total)
        elapsed = time.perf_counter() - started
        await worker.stop()
        lat = await delivered_latencies(sessions)
        results.append(
            (
                f"{engine_name}: steady {args.rate:g}/s",
                {"n": total, "rate": total / elapsed, "p50": percentile(lat, 50), "p99": percentile(lat, 99)},
            )
        )
        await engine.dispose()
    return results


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    out = [f"{'scenario':<28} {'n':>6} {'deliveries/s':>13} {'p50 ms':>8} {'p99 ms':>8}"]
    for name, r in rows:
        p50 = f"{r['p50']:.1f}" if "p50" in r else "-"
        p99 = f"{r['p99']:.1f}" if "p99" in r else "-"
        out.append(f"{name:<28} {r['n']:>6} {r['rate']:>13.0f} {p50:>8} {p99:>8}")
    return "\n".join(out)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["sqlite", "postgresql", "both"], default="sqlite")
    parser.add_argument("--burst", type=int, default=2000, help="events emitted up front")
    parser.add_argument("--rate", type=float, default=100.0, help="events per second in the steady run")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the steady run")
    parser.add_argument("--concurrency", type=int, default=16, help="deliveries in flight")
    args = parser.parse_args()
    configure_logging("warning")
    engines = ["sqlite", "postgresql"] if args.engine == "both" else [args.engine]
    rows: list[tuple[str, dict[str, Any]]] = []
    async with receiver_process() as url:
        rows.append(("floor: bare POST, 1 lane", await floor(url, min(args.burst, 500), 1)))
        rows.append(
            (f"floor: bare POST, {args.concurrency} lanes", await floor(url, args.burst, args.concurrency))
        )
        for name in engines:
            rows.extend(await run_engine(name, url, args))
    print(f"webhook delivery to a loopback receiver (concurrency {args.concurrency}, {os.cpu_count()} CPUs)")
    print(table(rows))
    print("floor latency: one POST round trip; steady latency: occurredAt of the event → 2xx recorded")


if __name__ == "__main__":
    asyncio.run(main())
