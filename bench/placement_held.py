"""What a placement's count of a host's held memory costs with N sandboxes on that host: the statement
every create and fork runs (``scheduler.held_by_host``), once per leading host.

    .venv/bin/python -m bench.placement_held                       # SQLite, 1,000 sandboxes
    .venv/bin/python -m bench.placement_held --engine postgresql --sandboxes 5000

Two databases with the same rows, interleaved sample by sample:

- paddock: the schema as migrated, ``ix_sandboxes_host_status (host_id, status)``: the count finds the
  host's rows in the index and reads each from the table for ``hibernated``, ``mem_mib`` and
  ``created_at``;
- covering: the same rows with ``(host_id, status, hibernated, mem_mib, created_at)`` added, so the
  count can read the index alone (the idea docs/performance.md tried and did not keep);
- floor: on the paddock database, ``count(*)`` of the host's rows in the index: the least a statement
  that visits each of them can cost.

Writes bench/results/placement-held-<engine>-<time>.json and .md; never fails on a time.
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

from sqlalchemy import insert, text
from tests.controlplane.hosts.rows import host, running_sandbox

from bench.fleet_sim import admin_url, make_services, pg_execute

RESULTS = Path(__file__).resolve().parent / "results"
HOST = "held-host"
FLOOR_SQL = text("SELECT count(*) FROM sandboxes WHERE host_id = :host_id")
#: The covering index tried: every column the count reads, after the two it searches by.
COVERING_DDL = (
    "CREATE INDEX ix_sandboxes_host_held ON sandboxes (host_id, status, hibernated, mem_mib, created_at)"
)


async def database(engine: str, root: Path, label: str) -> tuple[str, str]:
    """A new empty database's URL, and its name on PostgreSQL (to drop) or ''."""
    if engine == "postgresql":
        name = "held_" + secrets.token_hex(5)
        admin = admin_url()
        await pg_execute(admin, f"CREATE DATABASE {name}")
        return admin.rsplit("/", 1)[0] + "/" + name, name
    return f"sqlite+aiosqlite:///{root / f'{label}.db'}", ""


async def seeded(url: str, data_dir: Path, sandboxes: int, *, covering: bool) -> Any:
    from paddock_controlplane.app import migrate
    from paddock_controlplane.records.models import Host, Sandbox
    from paddock_controlplane.resources import accounts
    from paddock_core.db import transaction

    services = make_services(url, data_dir)
    await migrate(services.settings)
    now = services.clock()
    async with transaction(services.sessions) as session:
        user_id = (await accounts.create_user(session, plan_id="enterprise", signup_credits=10**9)).id
    # Most rows created before the host's last report (counted once), the last tenth since.
    beat = now - dt.timedelta(seconds=1)
    rows = []
    for n in range(sandboxes):
        created = beat - dt.timedelta(minutes=5) if n < sandboxes * 9 // 10 else now
        rows.append(running_sandbox(f"sbx_held{n:06d}", user_id, HOST, created, mem_mib=256))
    async with services.engine.begin() as connection:
        await connection.execute(insert(Host.__table__), [host(HOST, beat, free_mib=10**6, total_mib=10**6)])
        for start in range(0, len(rows), 5000):
            await connection.execute(insert(Sandbox.__table__), rows[start : start + 5000])
        if covering:
            await connection.execute(text(COVERING_DDL))
    if url.startswith("postgresql"):
        # What autovacuum does on a live database: statistics, and the visibility map that lets
        # PostgreSQL answer from an index without visiting the table.
        await pg_execute(url, "VACUUM ANALYZE sandboxes")
    else:
        async with services.engine.begin() as connection:
            await connection.execute(text("ANALYZE"))
    return services


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from paddock_controlplane.hosts.scheduler import Held, held_by_host
    from paddock_core.db import transaction

    root = Path(tempfile.mkdtemp(prefix="paddock-placement-held-"))
    names: list[str] = []
    services: dict[str, Any] = {}
    try:
        for label in ("paddock", "covering"):
            url, name = await database(args.engine, root, label)
            names += [name] if name else []
            services[label] = await seeded(url, root / label, args.sandboxes, covering=label == "covering")
        expected = Held(args.sandboxes * 256, (args.sandboxes - args.sandboxes * 9 // 10) * 256)

        async def count_held(session: Any) -> None:
            assert (await held_by_host(session, [HOST]))[HOST] == expected

        async def floor(session: Any) -> None:
            assert (await session.execute(FLOOR_SQL, {"host_id": HOST})).scalar_one() == args.sandboxes

        variants = {
            "floor": ("paddock", floor),
            "paddock": ("paddock", count_held),
            "covering": ("covering", count_held),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.samples):
            for name, (label, step) in variants.items():
                async with transaction(services[label].sessions) as session:
                    started = time.perf_counter()
                    await step(session)
                    times[name].append((time.perf_counter() - started) * 1000)
        p50 = {name: statistics.median(values) for name, values in times.items()}
        return {
            "engine": args.engine,
            "sandboxes": args.sandboxes,
            "samples": args.samples,
            "p50_ms": p50,
            "paddock_over_floor": p50["paddock"] / p50["floor"],
            "paddock_over_covering": p50["paddock"] / p50["covering"],
        }
    finally:
        for each in services.values():
            await each.engine.dispose()
        for name in names:
            await pg_execute(admin_url(), f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    RESULTS.mkdir(exist_ok=True)
    name = f"placement-held-{args.engine}-{stamp}"
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    p50 = result["p50_ms"]
    table = [
        f"# A placement's count of held memory, {result['sandboxes']} sandboxes on the host ({args.engine})",
        "",
        "| statement | p50 ms |",
        "|---|---|",
        f"| floor: count(*) of the host's rows, from the index | {p50['floor']:.3f} |",
        f"| paddock: held_by_host, index (host_id, status) and the table | {p50['paddock']:.3f} |",
        f"| covering (tried): held_by_host from the covering index alone | {p50['covering']:.3f} |",
        "",
        f"paddock / floor {result['paddock_over_floor']:.2f}; "
        f"paddock / covering {result['paddock_over_covering']:.2f}",
        "",
    ]
    (RESULTS / f"{name}.md").write_text("\n".join(table))
    print("\n".join(table))


if __name__ == "__main__":
    main()
