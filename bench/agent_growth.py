"""The host agent's own create at 1 live and beside N live (issue #36, "Growth at 1,000 live"), without
the control plane: what of the density bench's growth is the agent's.

A platform as bench/run.py's density section makes it (production intervals, a /21 of addresses, the
same memory and disk overcommit, a pool of 2). On the agent's internal API: ``--creates`` creates one at
a time, each once the pools are full again (so each claims a parked sandbox) and destroyed after; then
N - 1 more sandboxes, made 4 at a time and left running; then the same spaced creates beside them.
Reports p50 / p90 at each mark and their ratio (the goal's bounds: 1.3× p50, 2× p90).

With ``--py-spy PATH`` (py-spy is not installed by ``make``: ``pip install py-spy`` in a venv of its
own), py-spy records the agent with ``--gil`` during each mark's creates, into
``agent-growth-<time>-{one,many}.raw`` (collapsed stacks): the Python the agent ran, which is how the
walk over every sandbox in ``Registry.reserve`` was found (docs/performance.md, "Admission's sums kept").

    .venv/bin/python -m bench.agent_growth                      # 1,000 live, 20 creates a mark
    .venv/bin/python -m bench.agent_growth --live 300 --py-spy /root/spyenv/bin/py-spy

Writes bench/results/agent-growth-<time>.json and .md (``--out`` elsewhere); never fails on a time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench import machine
from bench import platform as bench_platform
from bench.density import DISK_OVERCOMMIT, OVERCOMMIT
from bench.lifecycle import AGENT_SPEC
from bench.profiling import py_spy_recording
from bench.stats import summarize

RESULTS = Path(__file__).parent / "results"
POOL_SIZE = 2
SPEC = {**AGENT_SPEC, "mem_mib": 256, "disk_mib": 2048}  # density's shape and disk


def _pools_full(agent: httpx.Client) -> None:
    """Until the warm pool is full again, so the next create claims a parked sandbox; a pool that does
    not refill in 2 minutes ends the run rather than timing creates that boot cold."""
    deadline = time.monotonic() + 120
    while agent.get("info").json()["warm_slots"] < POOL_SIZE:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool did not refill to {POOL_SIZE} in 120 s")
        time.sleep(0.1)


def _spaced(
    agent: httpx.Client, label: str, count: int, recording: contextlib.AbstractContextManager[None]
) -> list[float]:
    """``count`` creates one at a time, each claiming a parked sandbox, each destroyed after."""
    _pools_full(agent)
    time.sleep(1)
    with recording:
        times: list[float] = []
        for index in range(count):
            _pools_full(agent)
            time.sleep(1.0)  # the freed slot's parked sandbox boots after the slot is back
            sandbox_id = f"sb-growth-{label}-{index}"
            started = time.perf_counter()
            created = agent.post("sandboxes", json={"id": sandbox_id, "name": "growth", **SPEC})
            times.append((time.perf_counter() - started) * 1000)
            if created.status_code >= 400:
                raise RuntimeError(f"create refused: {created.status_code} {created.text[:300]}")
            agent.delete(f"sandboxes/{sandbox_id}")
        return times


def run(live: int, creates: int, py_spy: str | None, stem: Path) -> dict[str, Any]:
    from tests.hostagent.conftest import TOKEN

    from paddock_hostagent.guest.build import ensure_agent_binary

    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    out: dict[str, Any] = {"live": live, "creates": creates, "load_before": machine.load_average()}
    try:
        ensure_agent_binary(guest_dir)
        platform = bench_platform.start(
            guest_dir,
            pool_size=POOL_SIZE,
            subnet=f"10.{200 + os.getpid() % 40}.{os.getpid() // 40 % 32 * 8}.0/21",
            agent_env={
                "PADDOCK_HOST_MEMORY_OVERCOMMIT": str(OVERCOMMIT),
                "PADDOCK_HOST_DISK_OVERCOMMIT": str(DISK_OVERCOMMIT),
            },
        )
        try:
            process = platform.agents[0].process
            assert process is not None

            def spy(mark: str) -> contextlib.AbstractContextManager[None]:
                return py_spy_recording(py_spy, {process.pid: Path(f"{stem}-{mark}.raw")})

            with httpx.Client(
                base_url=platform.agents[0].url + "/internal/v1/",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=120,
            ) as agent:
                _pools_full(agent)
                agent.post(
                    "sandboxes", json={"id": "sb-growth-live-0", "name": "live", **SPEC}
                ).raise_for_status()
                out["at_one"] = summarize(_spaced(agent, "one", creates, spy("one")))

                def make(index: int) -> None:
                    agent.post(
                        "sandboxes", json={"id": f"sb-growth-live-{index}", "name": "live", **SPEC}
                    ).raise_for_status()

                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(make, range(1, live)))
                _pools_full(agent)
                time.sleep(5)  # the pools' refill and the first usage read beside them settle
                out["load_at_many"] = machine.load_average()
                out["at_many"] = summarize(_spaced(agent, "many", creates, spy("many")))
        finally:
            platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)
    out["load_after"] = machine.load_average()
    return out


def markdown(at: str, out: dict[str, Any]) -> str:
    one, many = out["at_one"], out["at_many"]
    p50, p90 = many["p50"] / max(one["p50"], 1e-9), many["p90"] / max(one["p90"], 1e-9)
    return "\n".join(
        [
            f"# The host agent's create at 1 and {out['live']} live ({at}, {machine.git_sha()})",
            "",
            f"{out['creates']} creates a mark on the agent's API, each claiming a parked sandbox. Load before "
            f"{out['load_before']}, at {out['live']} live {out['load_at_many']}, after {out['load_after']}.",
            "",
            "| mark | p50 ms | p90 ms |",
            "|---|---|---|",
            f"| 1 live | {one['p50']:.2f} | {one['p90']:.2f} |",
            f"| {out['live']} live | {many['p50']:.2f} | {many['p90']:.2f} |",
            f"| ratio (goal ≤ 1.3× / ≤ 2×) | {p50:.2f}× | {p90:.2f}× |",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=1000, help="sandboxes beside the second mark's creates")
    parser.add_argument("--creates", type=int, default=20, help="spaced creates at each mark")
    parser.add_argument("--py-spy", help="py-spy's path: record the agent during each mark's creates")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results files go")
    args = parser.parse_args()
    at = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"agent-growth-{at}"
    out = run(args.live, args.creates, args.py_spy, stem)
    stem.with_suffix(".json").write_text(json.dumps(out, indent=2))
    report = markdown(at, out)
    stem.with_suffix(".md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
