"""What the reconciler's idle pass costs each second, with N running sandboxes that asked for an idle
pause (``auto_pause_after_seconds``) and none of them idle yet: the usual case, every second.

    .venv/bin/python -m bench.idle_pass                       # SQLite, 1,000 sandboxes
    .venv/bin/python -m bench.idle_pass --engine postgresql --sandboxes 5000

Measured in one run, on one database, interleaved:

- floor: the same rows read as plain tuples by a ``text()`` statement on the same session (the
  driver and SQLAlchemy's core, nothing the pass could save);
- peer: the pass as it was before #36's third wave, reading ``Sandbox`` ORM objects and deciding on
  them (kept here, as the comparison);
- paddock: ``reconciler.idle_pass`` as it is, reading the seven columns it decides on.

Writes bench/results/idle-pass-<time>.json and .md; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text
from tests.controlplane.hosts.rows import host, running_sandbox

from bench.fleet_sim import admin_url, make_services, pg_execute

RESULTS = Path(__file__).resolve().parent / "results"

FLOOR_SQL = text(
    "SELECT id, user_id, auto_pause_after_seconds, on_idle, last_activity_at, last_resumed_at, running_at"
    " FROM sandboxes WHERE status = 'running' AND auto_pause_after_seconds IS NOT NULL"
)


async def orm_pass(session: Any, services: Any) -> None:
    """The pass before: every row as a ``Sandbox`` object, the same decision."""
    from paddock_controlplane.records.models import Sandbox
    from paddock_controlplane.records.states import SandboxStatus
    from paddock_controlplane.workers.reconciler import idle_long_enough

    now_s = services.clock().timestamp()
    rows = (
        await session.scalars(
            select(Sandbox).where(
                Sandbox.status == SandboxStatus.RUNNING, Sandbox.auto_pause_after_seconds.is_not(None)
            )
        )
    ).all()
    for sandbox in rows:
        if idle_long_enough(sandbox, now_s, services.activity.last_seen_s):
            raise AssertionError(f"{sandbox.id} is idle: the bench's rows are all active")


async def floor_read(session: Any, services: Any) -> None:
    rows = (await session.execute(FLOOR_SQL)).all()
    assert rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from paddock_controlplane.app import migrate
    from paddock_controlplane.records.models import Host, Sandbox
    from paddock_controlplane.resources import accounts
    from paddock_controlplane.workers.reconciler import idle_pass
    from paddock_core.db import transaction

    root = Path(tempfile.mkdtemp(prefix="paddock-idle-pass-"))
    database = ""
    if args.engine == "postgresql":
        admin = admin_url()
        database = "idle_" + secrets.token_hex(5)
        await pg_execute(admin, f"CREATE DATABASE {database}")
        url = admin.rsplit("/", 1)[0] + "/" + database
    else:
        url = f"sqlite+aiosqlite:///{root / 'paddock.db'}"
    services = make_services(url, root / "cp")
    try:
        await migrate(services.settings)
        now = services.clock()
        async with transaction(services.sessions) as session:
            user_id = (await accounts.create_user(session, plan_id="enterprise", signup_credits=10**9)).id
        rows = []
        for n in range(args.sandboxes):
            row = running_sandbox(f"sbx_idle{n:06d}", user_id, "idle-host", now - dt.timedelta(minutes=5))
            row.update(auto_pause_after_seconds=600, on_idle="pause", running_at=now, last_activity_at=now)
            rows.append(row)
        async with services.engine.begin() as connection:
            await connection.execute(
                insert(Host.__table__), [host("idle-host", now, free_mib=10**6, total_mib=10**6)]
            )
            for start in range(0, len(rows), 5000):
                await connection.execute(insert(Sandbox.__table__), rows[start : start + 5000])

        variants = {"floor": floor_read, "peer": orm_pass, "paddock": idle_pass}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.samples):
            for name, step in variants.items():
                async with transaction(services.sessions) as session:
                    started = time.perf_counter()
                    await step(session, services)
                    times[name].append((time.perf_counter() - started) * 1000)
        assert not services.auto_pausing, "a pass paused an active sandbox"
        p50 = {name: statistics.median(values) for name, values in times.items()}
        return {
            "engine": args.engine,
            "sandboxes": args.sandboxes,
            "samples": args.samples,
            "p50_ms": p50,
            "paddock_over_floor": p50["paddock"] / p50["floor"],
            "peer_over_paddock": p50["peer"] / p50["paddock"],
        }
    finally:
        await services.engine.dispose()
        if database:
            await pg_execute(admin_url(), f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    RESULTS.mkdir(exist_ok=True)
    name = f"idle-pass-{args.engine}-{stamp}"
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    p50 = result["p50_ms"]
    table = [
        f"# The idle pass, {result['sandboxes']} running sandboxes that asked for an idle pause ({args.engine})",
        "",
        "| read | p50 ms per pass |",
        "|---|---|",
        f"| floor: the same columns by a text() statement | {p50['floor']:.2f} |",
        f"| peer: ORM objects (the pass before) | {p50['peer']:.2f} |",
        f"| paddock: idle_pass, plain columns | {p50['paddock']:.2f} |",
        "",
        f"paddock / floor {result['paddock_over_floor']:.2f}; peer / paddock {result['peer_over_paddock']:.2f}",
        "",
    ]
    (RESULTS / f"{name}.md").write_text("\n".join(table))
    print("\n".join(table))


if __name__ == "__main__":
    main()
