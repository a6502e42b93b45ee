"""What private networks cost: create with and without a network, attach and detach on a running sandbox.

    .venv/bin/python -m bench.private_networks_bench [--rounds 12] [--warmup 2]

One ``tests.live`` platform (control plane + one host agent, warm pool of 2), one user, one network.
Each round, through the public API: create a sandbox without a network, attach it, detach it, destroy
it; create one with ``networks: [{id}]``, destroy it; then wait for the warm pool to refill, so every
create takes a prepared slot. The floor is the host work alone in the same run: ``BridgeNetworks``
attach/detach on a bare network namespace (bridge + veth + address; detach deletes both links). Since
the sandbox is the network's only member, every attach creates the bridge and every detach removes it
(the worst case). Needs root and the debian:13 image. Never fails on a time.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import summarize


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


def floor(rounds: int) -> dict[str, list[float]]:
    from paddock_hostagent.drivers.net.bridges import BridgeNetworks

    netns = f"pdkbench{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    bridges = BridgeNetworks(secrets.token_hex(2), "unused", "10.96.0.0/11")
    out: dict[str, list[float]] = {"attach": [], "detach": []}
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            member = bridges.attach(netns, "sb-bench", "net_bench", "10.96.0.2", 24, set())
            out["attach"].append(_ms(started))
            started = time.perf_counter()
            bridges.detach(member)
            out["detach"].append(_ms(started))
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=False)
    return out


def through_api(rounds: int) -> dict[str, list[float]]:
    from tests.live import LivePlatform, start_platform

    from paddock_hostagent.guest.build import ensure_agent_binary

    guest = Path(f"/tmp/pdkbench-guest-{secrets.token_hex(3)}")
    guest.mkdir()
    out: dict[str, list[float]] = {"create": [], "create_net": [], "attach": [], "detach": []}
    platform: LivePlatform | None = None
    try:
        ensure_agent_binary(guest)
        platform = start_platform(guest, agent_options={"pool_size": 2})
        with platform.http(platform.api_key()) as http:
            network = http.post("/v1/networks", json={"name": "bench"}).json()["data"]
            body: dict[str, Any] = {"shape": "s-1vcpu-256mb", "disk_mib": 2048}
            for _ in range(rounds):
                started = time.perf_counter()
                plain = http.post("/v1/sandboxes", json=body).json()["data"]["id"]
                out["create"].append(_ms(started))
                started = time.perf_counter()
                http.post(f"/v1/sandboxes/{plain}/networks", json={"id": network["id"]}).raise_for_status()
                out["attach"].append(_ms(started))
                started = time.perf_counter()
                http.delete(f"/v1/sandboxes/{plain}/networks/{network['id']}").raise_for_status()
                out["detach"].append(_ms(started))
                http.delete(f"/v1/sandboxes/{plain}")
                time.sleep(1.0)  # the pool refills
                started = time.perf_counter()
                joined = http.post("/v1/sandboxes", json={**body, "networks": [{"id": network["id"]}]})
                out["create_net"].append(_ms(started))
                http.delete(f"/v1/sandboxes/{joined.json()['data']['id']}")
                time.sleep(1.0)
    finally:
        try:
            if platform is not None:
                platform.stop()
        finally:
            shutil.rmtree(guest, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    api = through_api(args.rounds + args.warmup)
    bare = floor(args.rounds + args.warmup)
    rows = [
        ("create, no network (API)", api["create"]),
        ("create, 1 network (API)", api["create_net"]),
        ("attach, running (API)", api["attach"]),
        ("detach, running (API)", api["detach"]),
        ("floor: bridge+veth attach", bare["attach"]),
        ("floor: veth+bridge detach", bare["detach"]),
    ]
    print(f"{'operation':28s} {'p50 ms':>8s} {'p90 ms':>8s} {'n':>4s}")
    for label, values in rows:
        stats = summarize(values[args.warmup :])
        print(f"{label:28s} {stats['p50']:8.1f} {stats['p90']:8.1f} {stats['n']:4d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
