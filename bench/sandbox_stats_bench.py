"""What the host agent's ``GET /internal/v1/stats`` costs with N live sandboxes (issue #35: the metrics
worker pulls it from every host every ``metrics_interval_s``, 10 s by default).

    .venv/bin/python -m bench.sandbox_stats_bench [--sandboxes 50] [--calls 30]

Starts a platform (``tests.live``: a control plane and a host agent, crun or the host's default
runtime) with the metrics worker off, creates N idle sandboxes through the API, then calls the host
agent's stats route ``--calls`` times, one at a time. Prints the agent's own reading time (``took_ms``,
every sandbox's cgroup, disk and veth files) and the wall time of the call over loopback, p50 and max,
and per sandbox. Never fails on a time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from bench.stats import percentile

PER_USER = 25


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sandboxes", type=int, default=50)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()

    from tests.hostagent.conftest import TOKEN
    from tests.live import start_platform

    from paddock_hostagent.guest.build import ensure_agent_binary

    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    try:
        ensure_agent_binary(guest_dir)
        platform = start_platform(
            guest_dir,
            cp_env={"PADDOCK_CP_METRICS_INTERVAL_S": "0"},
            agent_options={"extra_env": {"PADDOCK_HOST_MEMORY_OVERCOMMIT": "8"}},
        )
        try:
            created: list[tuple[httpx.Client, str]] = []
            keys = [platform.api_key("enterprise") for _ in range(-(-args.sandboxes // PER_USER))]
            clients = [
                httpx.Client(base_url=platform.url, headers={"X-API-Key": key}, timeout=120) for key in keys
            ]
            started = time.perf_counter()
            for index in range(args.sandboxes):
                api = clients[index // PER_USER]
                answer = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})
                assert answer.status_code == 200, answer.text
                created.append((api, answer.json()["data"]["id"]))
            print(f"created {len(created)} sandboxes in {time.perf_counter() - started:.1f} s")
            agent = platform.agents[0]
            took: list[float] = []
            wall: list[float] = []
            with httpx.Client(
                base_url=agent.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as host:
                for _ in range(args.calls + 3):
                    begun = time.perf_counter()
                    answer = host.get("/internal/v1/stats")
                    elapsed = (time.perf_counter() - begun) * 1000
                    assert answer.status_code == 200, answer.text
                    body = answer.json()
                    assert len(body["sandboxes"]) == len(created), len(body["sandboxes"])
                    took.append(body["took_ms"])
                    wall.append(elapsed)
                    time.sleep(0.6)  # past the CPU rate's minimum interval, as real pulls are
            took, wall = took[3:], wall[3:]  # the first calls set the CPU baselines
            n = len(created)
            for label, values in (("reading (took_ms)", took), ("call, wall", wall)):
                p50 = percentile(values, 50)
                print(
                    f"{label}: p50 {p50:.2f} ms, max {max(values):.2f} ms, "
                    f"{p50 * 1000 / n:.0f} µs per sandbox at p50 ({n} sandboxes)"
                )
            for api, sandbox_id in created:
                api.delete(f"/v1/sandboxes/{sandbox_id}")
            for api in clients:
                api.close()
        finally:
            platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
