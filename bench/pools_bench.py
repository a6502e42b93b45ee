"""Creates of every image and disk size from the warm pools (drivers/runtime/pool.py, issue #36), and creates
sustained at concurrency.

On a platform of its own (one control plane, one host agent in the default configuration: a pool of 2
at a 10 GiB disk, the per-image pools on), through the SDK:

- **create → running** of each image, of ``debian:13`` at ``disk_mib=2048``, and of ``debian:13`` at a disk size
  never asked before (2560, 3072, ...: a smaller parked disk grown on claim): one untimed create first
  (it boots cold, and tells the per-image pools the image is wanted), then ``ROUNDS`` creates, each once
  the pools are full again (untimed; a create the pool could not have refilled for is the sustained case
  below). Each row says how many claimed a parked sandbox (the agent's ``create_phases``). Beside it the
  floor: ``crun run -d`` of ``sleep infinity`` on an overlay of the same image (no disk, network, guest
  agent or API), and the numbers of issue #36 before this change.
- **host memory the pools hold**: the agent's ``paddock_host_pool_memory_bytes`` (what the parked
  sandboxes' cgroups hold) with every image's pool full, and the budget.
- **sustained**: ``CONCURRENCY`` threads (each its own user: a plan caps sandboxes per user and day), each
  creating a ``debian:13`` sandbox, running ``true`` in it and destroying it (untimed), for ``SECONDS``:
  creates/s completed and create → first command p50/p99; then the same loop on the host agent's API,
  with the agent's CPU per create and delete.

Run: ``.venv/bin/python -m bench.pools_bench [--rounds 8] [--seconds 30] [--concurrency 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.lifecycle import SHAPE, BenchError, RawRuntimeLifecycle
from bench.stats import summarize

IMAGES = ("debian:13", "devbox:1", "code-interpreter:1", "desktop:1")
ROUNDS = 8
GROWN = -1  # the case whose every create asks a disk size not asked before
SECONDS = 30.0
CONCURRENCY = 20
#: Issue #36, measured through the SDK before the per-image pools (p50 of 8, ms); cold: a full boot.
BEFORE_MS = {"debian:13": 9.7, "debian:13 disk 2048": 56.8, "devbox:1": 36.3}


def _metric(agent_url: str, name: str) -> float:
    text = httpx.get(agent_url + "/metrics", timeout=10).text
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _parked(agent_url: str) -> float:
    """Sandboxes parked now: the default pool's and the per-image pools' (``paddock_host_pool_slots``)."""
    text = httpx.get(agent_url + "/metrics", timeout=10).text
    found = re.findall(r'^paddock_host_pool_slots\{kind="(parked|images)"\} ([0-9.e+]+)$', text, re.MULTILINE)
    return sum(float(value) for _, value in found)


def _settled_parked(agent_url: str, steady_s: float = 2.0, timeout_s: float = 30.0) -> float:
    """The parked count once it has not changed for ``steady_s`` (the pools are full)."""
    deadline = time.monotonic() + timeout_s
    count, since = _parked(agent_url), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < steady_s:
        time.sleep(0.1)
        now = _parked(agent_url)
        if now != count:
            count, since = now, time.monotonic()
    return count


def _wait_parked(agent_url: str, count: float, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _parked(agent_url) >= count:
            time.sleep(0.3)  # let the refill's boot finish settling before the next create
            return True
        time.sleep(0.1)
    return False


def _parked_flags(log_path: Path, ids: list[str]) -> list[bool]:
    flags: dict[str, bool] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if '"create_phases"' not in line:
            continue
        with_data = json.loads(line)
        flags[with_data.get("sandbox_id", "")] = bool(with_data.get("parked"))
    return [flags.get(sandbox_id, False) for sandbox_id in ids]


def _floor_ms(image: str, rounds: int) -> dict[str, Any]:
    from tests.hostagent.conftest import image_cache

    from paddock_hostagent.images import ImageStore

    raw = RawRuntimeLifecycle("crun", ImageStore(image_cache()).rootfs_path(image))
    samples = []
    try:
        for index in range(rounds):
            started = time.perf_counter()
            raw.start(f"floor{index}")
            samples.append((time.perf_counter() - started) * 1000)
            raw.stop(f"floor{index}")
    finally:
        raw.close()
    return summarize(samples)


TEMPLATE_DOCKERFILE = "FROM debian:13\nRUN echo warm > /etc/pool-bench\n"


def build_template(url: str, key: str) -> str:
    """A user's template (a one-line Dockerfile), built through the API; its id is its rootfs."""
    with httpx.Client(base_url=url, headers={"X-Api-Key": key}, timeout=60) as http:
        response = http.post("/v1/templates", json={"name": "pool-bench", "dockerfile": TEMPLATE_DOCKERFILE})
        if response.status_code >= 400:
            raise BenchError(f"template: {response.status_code} {response.text[:300]}")
        template_id = str(response.json()["data"]["id"])
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            status = http.get(f"/v1/templates/{template_id}").json()["data"]["status"]
            if status == "ready":
                return template_id
            if status not in ("pending", "building"):
                raise BenchError(f"template build {status}")
            time.sleep(0.2)
        raise BenchError("template build still running after 600 s")


def delete_template(url: str, key: str, template_id: str) -> None:
    with httpx.Client(base_url=url, headers={"X-Api-Key": key}, timeout=60) as http:
        http.delete(f"/v1/templates/{template_id}")


def measure_creates(
    client: Any, agent: Any, token: str, rounds: int, template: str | None = None
) -> list[dict[str, Any]]:
    rows = []
    cases: list[tuple[str, int | None]] = [(image, None) for image in IMAGES]
    cases.insert(1, ("debian:13", 2048))
    cases.insert(2, ("debian:13", GROWN))
    if template is not None:
        cases.append((template, None))
    for image, disk_mib in cases:
        label = image if disk_mib is None else f"{image} disk {disk_mib}"
        if image == template:
            label = "a user's template"
        if disk_mib == GROWN:
            label = f"{image}, a new disk size each time (grown on claim)"
        else:
            warmup = client.sandboxes.create(SHAPE, rootfs=image, disk_mib=disk_mib, name="pool-warmup")
            warmup.destroy(wait=True)
        full = _settled_parked(agent.url)  # the kind just asked for is parked (one per tick at most)
        samples, ids = [], []
        for index in range(rounds):
            if disk_mib == GROWN:  # every size new: a smaller parked disk of the image is grown
                _settled_parked(agent.url)
            else:
                _wait_parked(agent.url, full)
            size = 2048 + 512 * (index + 1) if disk_mib == GROWN else disk_mib
            started = time.perf_counter()
            sandbox = client.sandboxes.create(SHAPE, rootfs=image, disk_mib=size, name=f"pool-{index}")
            if sandbox.info.status != "running":
                sandbox.wait_until("running")
            samples.append((time.perf_counter() - started) * 1000)
            ids.append(sandbox.id)
            sandbox.destroy(wait=True)
        parked = _parked_flags(agent.log_path, ids)
        rows.append(
            {
                "case": label,
                **summarize(samples),
                "claimed": sum(parked),
                "rounds": rounds,
                "floor": _floor_ms(image, min(rounds, 5)),
                "image": image,
                "before_ms": BEFORE_MS.get(label),
            }
        )
    return rows


def measure_sustained(url: str, keys: list[str], seconds: float) -> dict[str, Any]:
    """One thread per key: each key is its own user, as a plan's daily sandbox cap (300) is per user."""
    from paddock import Client, RetryPolicy

    concurrency = len(keys)
    clients = [Client(url, key, timeout=300, retry=RetryPolicy(max_retries=0)) for key in keys]
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker(index: int) -> None:
        client = clients[index]
        count = 0
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                sandbox = client.sandboxes.create(SHAPE, rootfs="debian:13", name=f"sus-{index}-{count}")
                if sandbox.info.status != "running":
                    sandbox.wait_until("running")
                if sandbox.run("true").exit_code != 0:
                    raise BenchError("`true` failed")
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    latencies.append(elapsed)
                sandbox.destroy(wait=True)  # untimed; a host sustains creates only as fast as it destroys
            except Exception as exc:  # counted, reported
                with lock:
                    errors.append(str(exc)[:200])
            count += 1

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    wall = time.perf_counter() - started
    for client in clients:
        client.close()
    return {
        "seconds": wall,
        "concurrency": concurrency,
        "creates": len(latencies),
        "per_s": len(latencies) / wall,
        "errors": len(errors),
        "first_errors": errors[:3],
        **summarize(latencies),
    }


def _process_cpu_s(pid: int) -> float:
    """CPU time of a process and of its reaped children (the runtime, ``ip``, ``mount``...), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def measure_sustained_agent(
    agent_url: str, token: str, seconds: float, concurrency: int, pid: int | None = None
) -> dict[str, Any]:
    """The same loop on the host agent's internal API (what the control plane calls): create, ``true``,
    delete; says what of the sustained rate is the host's and what the control plane's. With the
    agent's ``pid``: the agent's CPU per create (with its children, not the sandboxes' own)."""
    from bench.lifecycle import AGENT_SPEC

    http = httpx.Client(
        base_url=agent_url + "/internal/v1/",
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx.Timeout(300, connect=5),
        limits=httpx.Limits(max_connections=64),
    )
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    tag = f"sb-sus-{time.monotonic_ns() % 10**8}"

    def worker(index: int) -> None:
        count = 0
        while time.monotonic() < stop_at:
            sandbox_id = f"{tag}-{index}-{count}"
            count += 1
            started = time.perf_counter()
            body = {"cmd": "true", "args": [], "env": {}, "stream": False}
            created = http.post("sandboxes", json={"id": sandbox_id, "name": "sus", **AGENT_SPEC})
            ran = (
                http.post(f"sandboxes/{sandbox_id}/exec", json=body) if created.status_code < 400 else created
            )
            elapsed = (time.perf_counter() - started) * 1000
            with lock:
                if ran.status_code < 400 and ran.json().get("exit_code") == 0:
                    latencies.append(elapsed)
                else:
                    errors.append(f"{ran.status_code} {ran.text[:200]}")
            http.delete(f"sandboxes/{sandbox_id}")

    cpu_before = _process_cpu_s(pid) if pid is not None else 0.0
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    wall = time.perf_counter() - started
    cpu = _process_cpu_s(pid) - cpu_before if pid is not None else 0.0
    http.close()
    return {
        "agent_cpu_ms_per_create": cpu * 1000 / max(len(latencies), 1) if pid is not None else None,
        "seconds": wall,
        "concurrency": concurrency,
        "creates": len(latencies),
        "per_s": len(latencies) / wall,
        "errors": len(errors),
        "first_errors": errors[:3],
        **summarize(latencies),
    }


def run(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    from tests.hostagent.conftest import TOKEN
    from tests.live import start_platform

    from paddock_hostagent.guest.build import ensure_agent_binary

    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    out: dict[str, Any] = {"load_before": os.getloadavg()}
    try:
        ensure_agent_binary(guest_dir)
        platform = start_platform(
            guest_dir,
            agents=1,
            cp_env={"PADDOCK_CP_RECONCILE_INTERVAL_S": "1.0", "PADDOCK_CP_HOST_DEAD_AFTER_S": "15"},
            agent_options={
                "pool_size": 2,
                "extra_env": {
                    "PADDOCK_HOST_HEARTBEAT_INTERVAL_S": "2.0",
                    "PADDOCK_HOST_POOL_DISK_MIB": "10240",  # the default configuration
                },
            },
        )
        try:
            from paddock import Client, RetryPolicy

            agent = platform.agents[0]
            key = platform.api_key(plan="enterprise", credits=1_000_000)
            with Client(platform.url, key, timeout=300, retry=RetryPolicy(max_retries=0)) as client:
                _wait_parked(agent.url, 1)
                template = build_template(platform.url, key) if rounds > 0 else None
                try:
                    out["creates"] = (
                        measure_creates(client, agent, TOKEN, rounds, template) if rounds > 0 else []
                    )
                finally:
                    if template is not None:
                        delete_template(platform.url, key, template)
            time.sleep(2)
            out["pool_memory_bytes"] = _metric(agent.url, "paddock_host_pool_memory_bytes")
            out["pool_memory_budget_bytes"] = _metric(agent.url, "paddock_host_pool_memory_budget_bytes")
            out["parked_slots"] = _parked(agent.url)
            out["load_before_sustained"] = os.getloadavg()
            if seconds > 0:
                keys = [platform.api_key(plan="enterprise", credits=1_000_000) for _ in range(concurrency)]
                out["sustained"] = measure_sustained(platform.url, keys, seconds)
                time.sleep(3)
                out["sustained_agent"] = measure_sustained_agent(
                    agent.url, TOKEN, seconds, concurrency, agent.process.pid if agent.process else None
                )
            out["load_after"] = os.getloadavg()
        finally:
            platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| create → running (SDK) | p50 ms | p90 ms | claimed parked | floor p50 ms (crun run -d) | before (#36) |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["creates"]:
        before = f"{row['before_ms']} ms" if row["before_ms"] is not None else "cold boot"
        if row["case"] == "a user's template":
            before = "231-249 ms"
        lines.append(
            f"| {row['case']} | {row['p50']:.1f} | {row['p90']:.1f} | {row['claimed']}/{row['rounds']} "
            f"| {row['floor']['p50']:.1f} | {before} |"
        )
    lines.append("")
    lines.append(
        f"Pools hold {result['pool_memory_bytes'] / (1 << 20):.1f} MiB of host memory "
        f"({result['parked_slots']} parked sandboxes; budget {result['pool_memory_budget_bytes'] / (1 << 20):.0f} MiB)."
    )
    for label, name in (("Sustained (SDK)", "sustained"), ("Sustained (host agent API)", "sustained_agent")):
        sustained = result.get(name)
        if not sustained:
            continue
        lines.append(
            f"{label}: {sustained['per_s']:.1f} creates/s at concurrency {sustained['concurrency']} for "
            f"{sustained['seconds']:.1f} s ({sustained['creates']} creates, {sustained['errors']} errors); "
            f"create → first command p50 {sustained['p50']:.1f} ms, p99 {sustained['p99']:.1f} ms"
            + (
                f"; the agent's CPU per create and delete (its children included, not the sandboxes') "
                f"{sustained['agent_cpu_ms_per_create']:.0f} ms."
                if sustained.get("agent_cpu_ms_per_create")
                else "."
            )
        )
    lines.append(
        f"Load average before / before sustained / after: {result['load_before']} / "
        f"{result.get('load_before_sustained')} / {result.get('load_after')}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    args = parser.parse_args()
    result = run(args.rounds, args.seconds, args.concurrency)
    print(json.dumps(result, indent=1, default=str))
    print(markdown(result))


if __name__ == "__main__":
    main()
