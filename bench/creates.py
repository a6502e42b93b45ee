"""Creates per second at concurrency: a burst of creates from many clients at once, each followed by the
new sandbox's first command.

- paddock: ``total`` creates from ``concurrency`` threads through the public API (the SDK's ``Client``,
  one per thread), each ``create`` → running → ``run("true")``. The rate is ``total`` over the burst's
  wall time (first request sent → last first command answered); each create's latency is
  create → first command answered. The warm pool starts full (``pool_size`` slots) and refills while
  the burst runs, as it would on a live host.
- host agent alone: the same burst on the host agent's internal API (what the control plane calls).
- floor (raw crun): the same burst of an overlay mount of the image + ``crun run -d`` of ``sleep
  infinity`` + ``crun exec`` of ``true``, from as many threads (``lifecycle.RawRuntimeLifecycle``): no
  network namespace, disk, guest agent or API.

Sandboxes are destroyed after each burst (untimed) and the pool is let refill before the next. The
agent's ``create_phases`` log lines of the Paddock bursts are summarised per step (p50 ms), with how
many creates found a warm slot and how many of those claimed a sandbox parked in it (the pool boots
sandboxes of the pool image ahead: drivers/runtime/pool.py). The bursts run twice: on the bench's host agent (a warm pool of 2,
emptied at once, the rest of each burst building its slots on demand) and on a second platform whose
agent keeps a pool as large as a burst, refilled between bursts.
"""

from __future__ import annotations

import json
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench import platform as bench_platform
from bench.lifecycle import AGENT_SPEC, DISK_MIB, SHAPE, BenchError, RawRuntimeLifecycle
from bench.stats import summarize

# A burst stays under the bench key's cap of 30 live sandboxes (its plan's quota): every sandbox of a
# burst lives until the burst ends.
TOTAL = 30
CONCURRENCY = 20


def burst(total: int, concurrency: int, one: Callable[[int], None]) -> dict[str, Any]:
    """Runs ``one(index)`` for ``total`` indices from ``concurrency`` threads; returns the rate and the
    latency of each call (ms)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def timed(index: int) -> None:
        started = time.perf_counter()
        one(index)
        with lock:
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(timed, index) for index in range(total)]:
            future.result()
    wall = time.perf_counter() - started
    return {
        "total": total,
        "concurrency": concurrency,
        "seconds": wall,
        "per_s": total / wall,
        **summarize(latencies),
    }


class _PaddockBurst:
    """One SDK client per thread, all built before the burst: a client costs ~17 ms of CPU to build
    (httpx makes an SSL context), which a real caller pays once, not inside a burst of creates."""

    def __init__(self, url: str, key: str, concurrency: int) -> None:
        from paddock import Client, RetryPolicy

        self.clients = threading.local()
        self.made = [
            Client(url, key, timeout=300, retry=RetryPolicy(max_retries=0)) for _ in range(concurrency)
        ]
        self.spare: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for client in self.made:
            self.spare.put(client)
        self.live: list[Any] = []
        self.lock = threading.Lock()

    def client(self) -> Any:
        client = getattr(self.clients, "client", None)
        if client is None:
            client = self.clients.client = self.spare.get_nowait()
        return client

    def one(self, index: int) -> None:
        sandbox = self.client().sandboxes.create(
            SHAPE, name=f"bench-burst-{index}", rootfs="debian:13", disk_mib=DISK_MIB
        )
        with self.lock:
            self.live.append(sandbox)
        if sandbox.info.status != "running":
            sandbox.wait_until("running")
        result = sandbox.run("true")
        if result.exit_code != 0:
            raise BenchError(f"paddock: `true` exited {result.exit_code}")

    def clean(self, concurrency: int) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda sandbox: sandbox.destroy(wait=True), self.live))
        self.live.clear()
        for client in self.made:
            client.close()


class _AgentBurst:
    def __init__(self, agent_url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=agent_url + "/internal/v1/",
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(300, connect=5),
            limits=httpx.Limits(max_connections=64),
        )
        self.live: list[str] = []
        self.tag = f"sb-burst-{time.monotonic_ns() % 10**8}"

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise BenchError(f"host agent {method} {path}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else None

    def one(self, index: int) -> None:
        sandbox_id = f"{self.tag}-{index}"
        self.live.append(sandbox_id)
        self.call("POST", "sandboxes", json={"id": sandbox_id, "name": f"burst-{index}", **AGENT_SPEC})
        body = {"cmd": "true", "args": [], "env": {}, "stream": False}
        if self.call("POST", f"sandboxes/{sandbox_id}/exec", json=body)["exit_code"] != 0:
            raise BenchError("host agent: `true` failed")

    def wait_pool(self, pool_size: int, timeout_s: float = 120) -> None:
        """Waits for the pool to be full, and for its slots to have their sandboxes parked (all but
        the one readied for a fork; an agent that parks nothing stops this wait at the deadline)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.call("GET", "info").get("warm_slots", 0) < pool_size:
            time.sleep(0.1)
        parked_deadline = min(deadline, time.monotonic() + 30)
        while (
            time.monotonic() < parked_deadline
            and self.call("GET", "info").get("parked_slots", 0) < pool_size - 1
        ):
            time.sleep(0.1)

    def clean(self, concurrency: int) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda sandbox_id: self.http.delete(f"sandboxes/{sandbox_id}"), self.live))
        self.live.clear()


def _floor_one(raw: RawRuntimeLifecycle) -> Callable[[int], None]:
    def one(index: int) -> None:
        name = f"burst-{index}"
        raw.start(name)
        raw.call("exec", name, "true")

    return one


def create_phases(log_text: str) -> dict[str, Any]:
    """p50 of each step of the agent's ``create_phases`` log lines (JSON, one per line) in ``log_text``,
    and how many creates found a warm slot (and of those, how many claimed a parked sandbox)."""
    steps: dict[str, list[float]] = {}
    warm = cold = parked = 0
    for line in log_text.splitlines():
        if '"create_phases"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        for name, value in event.items():
            if name.endswith("_ms") and isinstance(value, int | float):
                steps.setdefault(name.removesuffix("_ms"), []).append(float(value))
        warm, cold = (warm + 1, cold) if event.get("warm_slot") else (warm, cold + 1)
        parked += 1 if event.get("parked") else 0
    return {
        "warm": warm,
        "cold": cold,
        "parked": parked,
        "p50_ms": {name: summarize(values)["p50"] for name, values in steps.items()},
    }


def _rounds(
    url: str,
    key: str,
    agent_url: str,
    token: str,
    pool_size: int,
    agent_log: Path,
    raw: RawRuntimeLifecycle | None,
    *,
    rounds: int,
    total: int,
    concurrency: int,
) -> dict[str, Any]:
    """``rounds`` bursts of each system, interleaved (the box is shared: absolute rates drift); the
    pool refills (untimed) before each Paddock or host agent burst."""
    out: dict[str, Any] = {"pool_size": pool_size}
    agent = _AgentBurst(agent_url, token)
    log_from = agent_log.stat().st_size if agent_log.exists() else 0
    try:
        for _ in range(rounds):
            agent.wait_pool(pool_size)
            paddock = _PaddockBurst(url, key, concurrency)
            try:
                out.setdefault("paddock", []).append(burst(total, concurrency, paddock.one))
            finally:
                paddock.clean(concurrency)
            with open(agent_log, errors="replace") as log:
                log.seek(log_from)
                out.setdefault("paddock_phases", []).append(create_phases(log.read()))
            agent.wait_pool(pool_size)
            try:
                out.setdefault("hostagent", []).append(burst(total, concurrency, agent.one))
            finally:
                agent.clean(concurrency)
            if raw is not None:
                try:
                    out.setdefault("crun", []).append(burst(total, concurrency, _floor_one(raw)))
                finally:
                    for name in list(raw.live):
                        raw.stop(name)
            log_from = agent_log.stat().st_size
    finally:
        agent.http.close()
    return out


def measure(
    url: str,
    key: str,
    agent_url: str,
    token: str,
    pool_size: int,
    rootfs: Path,
    agent_log: Path,
    *,
    rounds: int = 1,
    total: int = TOTAL,
    concurrency: int = CONCURRENCY,
    burst_pool: bool = True,
) -> dict[str, Any]:
    """Bursts on the bench's host agent (its warm pool of ``pool_size``) against the raw crun floor, then
    (``burst_pool``) on a second platform whose agent keeps a pool as large as a burst, refilled
    between bursts."""
    out: dict[str, Any] = {"total": total, "concurrency": concurrency, "pools": []}
    raw = RawRuntimeLifecycle("crun", rootfs)
    try:
        out["pools"].append(
            _rounds(
                url,
                key,
                agent_url,
                token,
                pool_size,
                agent_log,
                raw,
                rounds=rounds,
                total=total,
                concurrency=concurrency,
            )
        )
    finally:
        raw.close()
    if burst_pool:
        out["pools"].append(_with_own_platform(total, rounds=rounds, total=total, concurrency=concurrency))
    return out


def _with_own_platform(pool_size: int, *, rounds: int, total: int, concurrency: int) -> dict[str, Any]:
    """The same bursts on a platform of its own whose host agent keeps ``pool_size`` warm slots (the test
    helpers are imported here, as bench.run does: they are heavy)."""
    from tests.hostagent.conftest import TOKEN

    from paddock_hostagent.guest.build import ensure_agent_binary

    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    try:
        ensure_agent_binary(guest_dir)
        platform = bench_platform.start(guest_dir, pool_size=pool_size)
        try:
            agent = platform.agents[0]
            key = platform.api_key(plan="enterprise", credits=1_000_000)
            return _rounds(
                platform.url,
                key,
                agent.url,
                TOKEN,
                pool_size,
                agent.log_path,
                None,
                rounds=rounds,
                total=total,
                concurrency=concurrency,
            )
        finally:
            platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)


def markdown(section: dict[str, Any]) -> str:
    """The section's tables: rate and create → first command latency per system, best round of each."""
    lines = [f"## Creates at concurrency {section['concurrency']} ({section['total']} per burst)"]
    for pool in section["pools"]:
        lines += [
            "",
            f"Warm pool of {pool['pool_size']}:",
            "",
            "| system | creates/s, best (each round) | create → first command p50 ms | p99 ms |",
            "|---|---|---|---|",
        ]
        for system, label in (
            ("paddock", "Paddock through the API"),
            ("hostagent", "host agent alone"),
            ("crun", "raw `crun run` + `exec true` (floor)"),
        ):
            bursts = pool.get(system) or []
            if not bursts:
                continue
            best = max(bursts, key=lambda row: row["per_s"])
            rates = ", ".join(f"{row['per_s']:.1f}" for row in bursts)
            lines.append(
                f"| {label} | {best['per_s']:.1f} ({rates}) | {best['p50']:.0f} | {best['p99']:.0f} |"
            )
        for phases in pool.get("paddock_phases", []):
            steps = ", ".join(f"{name} {value:.0f}" for name, value in phases["p50_ms"].items())
            lines += [
                "",
                f"Host agent's create phases in a Paddock burst (p50 ms of the creates that ran "
                f"each step): {steps}; warm slot {phases['warm']} (a parked sandbox claimed: "
                f"{phases.get('parked', 0)}), built on demand {phases['cold']}.",
            ]
    return "\n".join(lines) + "\n"
