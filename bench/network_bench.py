"""What egress enforcement costs: sandbox create with and without an allowlist, and name lookups.

    sudo .venv/bin/python -m bench.network_bench              # 20 rounds each
    sudo .venv/bin/python -m bench.network_bench --rounds 50

A control plane and one host agent run as processes (tests/live.py) next to a fake internet in a
network namespace (tests/network/internet.py); nothing leaves the machine. Rows (milliseconds, p50 / p90):

- create, open: ``POST /v1/sandboxes`` without egress rules, timed by the client (the warm pool refills,
  untimed, between creates). Every sandbox is metered (the budget is one nftables batch either way).
  Open and allowlisted creates alternate, so load from elsewhere on the machine hits both alike.
- create, 4 rules: the same with ``api.example.test:80``, ``*.foo.test``, a CIDR and an ``ip:port``.
- nft batch: one ``nft -f`` with a sandbox's whole policy, alone: the floor of what a create adds.
- lookup, open / allowlisted: ``curl``'s name lookup time inside a sandbox for an allowed name; the
  allowlisted one waits for the answer's address to be admitted into the kernel set.

Needs root and the debian:13 image. Prints a table; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from tests.hostagent.conftest import image_cache
from tests.live import LivePlatform, start_platform
from tests.network.internet import FakeInternet

from paddock_hostagent.drivers.net.egress_rules import EgressFirewall, EgressPolicy
from paddock_hostagent.guest.build import ensure_agent_binary
from paddock_hostagent.images import ImageStore


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} / {percentile(values, 0.9):7.1f}" if values else "-"


def create_once(http: httpx.Client, rules: list[str]) -> tuple[float, float]:
    """(create ms, name lookup ms inside the new sandbox); the sandbox is destroyed afterwards."""
    time.sleep(0.8)  # the warm pool refills (untimed), as between requests on a live host
    started = time.perf_counter()
    response = http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "disk_mib": 2048, "egress": rules})
    created_ms = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    sid = response.json()["data"]["id"]
    script = "curl -s -o /dev/null -w '%{time_namelookup}' --max-time 3 http://api.example.test/"
    ran = http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "bash", "args": ["-c", script]})
    lookup_ms = float(ran.json()["data"]["result"]["stdout"] or "nan") * 1000
    http.delete(f"/v1/sandboxes/{sid}").raise_for_status()
    return created_ms, lookup_ms


def create_rounds(platform: LivePlatform, rules: list[str], rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"open": [], "open_lookup": [], "rules": [], "rules_lookup": []}
    with platform.http(platform.api_key()) as http:
        for index in range(rounds):
            order = [("open", []), ("rules", rules)]
            for label, egress in order if index % 2 else reversed(order):
                created_ms, lookup_ms = create_once(http, egress)
                out[label].append(created_ms)
                out[f"{label}_lookup"].append(lookup_ms)
    return out


async def nft_floor(rules: list[str], rounds: int) -> list[float]:
    firewall = EgressFirewall(f"pdkbench{int(time.time()) % 100000}", "10.254.77.0/24", "10.254.77.1")
    firewall.setup_host()
    policy = EgressPolicy.parse(rules)
    out: list[float] = []
    try:
        for index in range(rounds):
            veth = f"pdkb{index:06d}"
            started = time.perf_counter()
            await firewall.install(veth, "10.254.77.2", policy, quota_bytes=5 << 30)
            out.append((time.perf_counter() - started) * 1000)
            await firewall.remove(veth)
    finally:
        firewall.teardown_host()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    ImageStore(image_cache()).build("debian:13")
    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    try:
        ensure_agent_binary(guest_dir)
        with FakeInternet() as internet:
            rules = ["api.example.test:80", "*.foo.test", internet.cidr, f"{internet.address('raw-a')}:443"]
            platform = start_platform(
                guest_dir, agent_options={"extra_env": {"PADDOCK_HOST_DNS_UPSTREAM": internet.dns_upstream}}
            )
            try:
                create_rounds(platform, rules, 1)  # warm-up: caches, first-use paths
                timed = create_rounds(platform, rules, args.rounds)
            finally:
                platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)
    floor = asyncio.run(nft_floor(rules, args.rounds))
    print(f"\nnetwork bench, {args.rounds} rounds (ms, p50 / p90)")
    print(f"{'create, open':<28}{summary(timed['open'])}")
    print(f"{'create, 4 rules':<28}{summary(timed['rules'])}")
    print(f"{'nft batch (floor)':<28}{summary(floor)}")
    print(f"{'lookup, open':<28}{summary(timed['open_lookup'])}")
    print(f"{'lookup, allowlisted':<28}{summary(timed['rules_lookup'])}")
    delta = statistics.median(timed["rules"]) - statistics.median(timed["open"])
    print(f"\ncreate p50 with rules - without: {delta:+.1f} ms")


if __name__ == "__main__":
    main()
