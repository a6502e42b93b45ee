"""Creates per second at concurrency 20: all on one host vs spread over three, in one run.

    sudo .venv/bin/python -m bench.multihost_bench              # 30 creates per phase
    sudo .venv/bin/python -m bench.multihost_bench --creates 60 --concurrency 20

The cluster is tests/multihost's: one control plane on PostgreSQL (scripts/ensure-postgres.sh) and
three host agents, each in its own network namespace on a test bridge. Phases alternate, so load from
elsewhere on the machine hits both alike:

- 1 host: every create pinned to host 1 (``host_id``), the others idle;
- 3 hosts: no pin, placement by free memory spreads them.

Each phase creates ``--creates`` sandboxes (``s-1vcpu-256mb``, 2 GiB disk) from ``--concurrency``
client threads, timed from the first request to the last answer, then destroys them (untimed) and
lets the warm pools refill. All three "hosts" share this machine's cores, so the ratio shows what the
control plane and placement add or remove, not what three machines would give: on one box, spreading
only helps where one agent serialises work (its warm pool, its locks). Needs root and the debian:13
image. Prints a table; never fails on a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.hostagent.conftest import image_cache
from tests.multihost.harness import Cluster, HostMachine, start_cluster

from paddock_hostagent.guest.build import ensure_agent_binary
from paddock_hostagent.images import ImageStore

BODY = {"shape": "s-1vcpu-256mb", "disk_mib": 2048}


def timed_creates(
    cluster: Cluster, key: str, count: int, concurrency: int, pin: str | None
) -> tuple[float, list[str], list[float]]:
    def one(_: int) -> tuple[str, float]:
        started = time.perf_counter()
        with cluster.http(key) as http:
            answer = http.post("/v1/sandboxes", json={**BODY, **({"host_id": pin} if pin else {})})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["data"]["id"]), (time.perf_counter() - started) * 1000

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(one, range(count)))
    return time.perf_counter() - started, [d[0] for d in done], [d[1] for d in done]


def destroy(cluster: Cluster, key: str, sandbox_ids: list[str]) -> None:
    def one(sandbox_id: str) -> None:
        with cluster.http(key) as http:
            http.delete(f"/v1/sandboxes/{sandbox_id}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, sandbox_ids))
    time.sleep(3)  # warm pools refill before the next phase


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--creates", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of both phases")
    args = parser.parse_args()
    if not os.environ.get("PADDOCK_TEST_PG_URL"):
        url = subprocess.run(
            ["scripts/ensure-postgres.sh"], capture_output=True, text=True, check=True
        ).stdout
        os.environ["PADDOCK_TEST_PG_URL"] = url.strip()
    ImageStore(image_cache()).build("debian:13")
    guest_dir = Path(tempfile.mkdtemp(prefix="pdkmhbench-"))
    ensure_agent_binary(guest_dir)
    hosts = [{"total_mib": 16384, "pool_size": 2} for _ in range(3)]
    # Heartbeats queue behind 20 creates on a loaded box: judge hosts as the production default would.
    cluster = start_cluster(guest_dir, hosts, controlplanes=1, cp_env={"PADDOCK_CP_HOST_DEAD_AFTER_S": "30"})
    rates: dict[str, list[float]] = {"1 host": [], "3 hosts": []}
    latencies: dict[str, list[float]] = {"1 host": [], "3 hosts": []}
    try:
        key = cluster.api_key(plan="enterprise", credits=100_000)
        first = next(a for a in cluster.agents if isinstance(a, HostMachine)).host_id
        for _ in range(args.rounds):
            for phase, pin in (("1 host", first), ("3 hosts", None)):
                seconds, made, each_ms = timed_creates(cluster, key, args.creates, args.concurrency, pin)
                rates[phase].append(args.creates / seconds)
                latencies[phase] += each_ms
                destroy(cluster, key, made)
    finally:
        cluster.stop()
        shutil.rmtree(guest_dir, ignore_errors=True)
    print(f"\ncreates at concurrency {args.concurrency}, {args.creates} per phase, {args.rounds} rounds")
    print(f"{'phase':<10} {'creates/s (per round)':<28} {'p50 ms':>8} {'p90 ms':>8}")
    for phase in rates:
        ordered = sorted(latencies[phase])
        p90 = ordered[int(len(ordered) * 0.9) - 1]
        per_round = ", ".join(f"{rate:.1f}" for rate in rates[phase])
        print(f"{phase:<10} {per_round:<28} {statistics.median(ordered):>8.0f} {p90:>8.0f}")
    one, three = statistics.median(rates["1 host"]), statistics.median(rates["3 hosts"])
    print(f"3 hosts / 1 host: {three / one:.2f}×  (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
