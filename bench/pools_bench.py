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
  with the agent's CPU per create and delete; then the floor (``measure_floor``): the raw runtime's
  own loop, ``crun run -d`` + ``crun delete -f`` at the same concurrency for the same time, each
  container in a netns and a cgroup, with crun's CPU per run and delete. Each row gives the whole
  box's CPU per create too (``/proc/stat``), and the report each rate and CPU ÷ the floor's.

Run: ``.venv/bin/python -m bench.pools_bench [--rounds 8] [--seconds 30] [--concurrency 20]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench import platform as bench_platform
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


TEMPLATE_LABEL = "a user's template"


def cases(template: str | None) -> list[tuple[str, str, int | None]]:
    """The create cases in order, as (label, image, disk_mib): every image at its default disk, debian:13
    at 2 GiB and at a size never asked before, and the user's ``template`` when given."""
    found: list[tuple[str, str, int | None]] = [(image, image, None) for image in IMAGES]
    found.insert(1, ("debian:13 disk 2048", "debian:13", 2048))
    found.insert(2, ("debian:13, a new disk size each time (grown on claim)", "debian:13", GROWN))
    if template is not None:
        found.append((TEMPLATE_LABEL, template, None))
    return found


def measure_creates(
    client: Any, agent: Any, token: str, rounds: int, template: str | None = None
) -> list[dict[str, Any]]:
    rows = []
    for label, image, disk_mib in cases(template):
        if disk_mib != GROWN:
            warmup = client.sandboxes.create(SHAPE, rootfs=image, disk_mib=disk_mib, name="pool-warmup")
            warmup.destroy(wait=True)
        full = _settled_parked(agent.url)  # the kind just asked for is parked (one per tick at most)
        load = [round(value, 2) for value in os.getloadavg()]
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
                "load": load,
            }
        )
    return rows


def measure_sustained(
    url: str, keys: list[str], seconds: float, pids: dict[str, int | None] | None = None
) -> dict[str, Any]:
    """One thread per key: each key is its own user, as a plan's daily sandbox cap (300) is per user.
    ``pids``: processes (by role: ``controlplane``, ``agent``) whose CPU per cycle the row reports."""
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

    watched = {role: pid for role, pid in (pids or {}).items() if pid is not None}
    cpu_before = {role: _process_cpu_s(pid) for role, pid in watched.items()}
    box_before = _box_busy_ticks()
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    wall = time.perf_counter() - started
    box_ms = _box_cpu_ms(box_before, len(latencies))
    # Per create, ``true`` and destroy (each process with its reaped children: the agent's crun and
    # ``ip``), so the row says what of the box's CPU is the control plane's.
    per_cycle = {
        f"{role}_cpu_ms_per_create": (_process_cpu_s(pid) - cpu_before[role]) * 1000 / max(len(latencies), 1)
        for role, pid in watched.items()
    }
    for client in clients:
        client.close()
    return {
        **per_cycle,
        "box_cpu_ms_per_create": box_ms,
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
    box_before = _box_busy_ticks()
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    wall = time.perf_counter() - started
    cpu = _process_cpu_s(pid) - cpu_before if pid is not None else 0.0
    box_ms = _box_cpu_ms(box_before, len(latencies))
    http.close()
    return {
        "agent_cpu_ms_per_create": cpu * 1000 / max(len(latencies), 1) if pid is not None else None,
        "box_cpu_ms_per_create": box_ms,
        "seconds": wall,
        "concurrency": concurrency,
        "creates": len(latencies),
        "per_s": len(latencies) / wall,
        "errors": len(errors),
        "first_errors": errors[:3],
        **summarize(latencies),
    }


def _box_busy_ticks() -> tuple[int, int]:
    """Busy and total clock ticks of every CPU since boot (``/proc/stat``), for CPU over a window."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)  # less idle and iowait


def _box_cpu_ms(before: tuple[int, int], count: int) -> float:
    """The whole box's busy CPU since ``before``, per one of ``count`` operations, in ms."""
    busy = _box_busy_ticks()[0] - before[0]
    return busy * 1000 / os.sysconf("SC_CLK_TCK") / max(count, 1)


def _children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


def measure_floor(rootfs: Path, seconds: float, concurrency: int) -> dict[str, Any]:
    """The raw runtime's sustained rate, the floor of the sustained rows: ``CONCURRENCY`` threads, each
    looping ``crun run -d`` + ``crun delete -f`` of ``sleep infinity`` for ``SECONDS``, each container
    in a network namespace (one per thread, made once, as Paddock keeps a destroyed sandbox's pristine
    one for the next) and a cgroup of its own with a memory and pids limit, on the image's root
    filesystem read-only (no overlay, disk, guest agent, egress rules or API). Its CPU: the crun
    processes' own (``os.times`` of reaped children; the containers' ``sleep`` is not counted) and the
    whole box's (``/proc/stat``, which also holds whatever else ran meanwhile)."""
    crun = shutil.which("crun")
    if crun is None:
        raise BenchError("crun is not installed")
    tag = f"pdkfloor{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir="/var/tmp"))
    state_root = f"/run/{tag}"
    base = [crun, "--root", state_root, "--cgroup-manager=cgroupfs"]
    subprocess.run([crun, "spec", "--bundle", str(work)], check=True, capture_output=True)
    template = json.loads((work / "config.json").read_text())
    template["process"]["terminal"] = False
    template["process"]["args"] = ["sleep", "infinity"]
    template["root"] = {"path": str(rootfs), "readonly": True}
    netns = [f"{tag}-{index}" for index in range(concurrency)]
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    try:
        for index, name in enumerate(netns):
            subprocess.run(["ip", "netns", "add", name], check=True)
            config = json.loads(json.dumps(template))
            config["linux"]["namespaces"] = [
                ns if ns["type"] != "network" else {"type": "network", "path": f"/run/netns/{name}"}
                for ns in config["linux"]["namespaces"]
            ]
            if not any(ns["type"] == "network" for ns in config["linux"]["namespaces"]):
                config["linux"]["namespaces"].append({"type": "network", "path": f"/run/netns/{name}"})
            config["linux"]["resources"] = {"memory": {"limit": 256 << 20}, "pids": {"limit": 4096}}
            bundle = work / f"b{index}"
            bundle.mkdir()
            (bundle / "config.json").write_text(json.dumps(config))
        stop_at = time.monotonic() + seconds

        def worker(index: int) -> None:
            bundle = work / f"b{index}"
            count = 0
            config = json.loads((bundle / "config.json").read_text())
            while time.monotonic() < stop_at:
                name = f"{tag}-{index}-{count}"
                count += 1
                config["linux"]["cgroupsPath"] = f"/{tag}/{name}"
                (bundle / "config.json").write_text(json.dumps(config))
                started = time.perf_counter()
                ran = subprocess.run(
                    [*base, "run", "-d", "-b", str(bundle), name],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                elapsed = (time.perf_counter() - started) * 1000
                deleted = subprocess.run([*base, "delete", "-f", name], capture_output=True)
                with lock:
                    if ran.returncode == 0 and deleted.returncode == 0:
                        latencies.append(elapsed)
                    else:
                        errors.append(f"run {ran.returncode}, delete {deleted.returncode}")

        box_before, children_before = _box_busy_ticks(), _children_cpu_s()
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(worker, range(concurrency)))
        wall = time.perf_counter() - started
        crun_cpu_s = _children_cpu_s() - children_before
        box_ms = _box_cpu_ms(box_before, len(latencies))
    finally:
        for name in netns:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            with contextlib.suppress(OSError):
                (hierarchy / tag).rmdir()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state_root, ignore_errors=True)
    return {
        "seconds": wall,
        "concurrency": concurrency,
        "creates": len(latencies),
        "per_s": len(latencies) / wall,
        "errors": len(errors),
        "first_errors": errors[:3],
        "crun_cpu_ms_per_create": crun_cpu_s * 1000 / max(len(latencies), 1),
        "box_cpu_ms_per_create": box_ms,
        **summarize(latencies),
    }


def run(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    from tests.hostagent.conftest import TOKEN

    from paddock_hostagent.guest.build import ensure_agent_binary

    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    out: dict[str, Any] = {"load_before": os.getloadavg()}
    try:
        ensure_agent_binary(guest_dir)
        platform = bench_platform.start(
            guest_dir,
            pool_size=2,
            agent_env={"PADDOCK_HOST_POOL_DISK_MIB": "10240"},  # the default configuration
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
                out["sustained"] = measure_sustained(
                    platform.url,
                    keys,
                    seconds,
                    {
                        "controlplane": platform.controlplane.process.pid,
                        "agent": agent.process.pid if agent.process else None,
                    },
                )
                time.sleep(3)
                out["sustained_agent"] = measure_sustained_agent(
                    agent.url, TOKEN, seconds, concurrency, agent.process.pid if agent.process else None
                )
                time.sleep(3)
                from tests.hostagent.conftest import image_cache

                from paddock_hostagent.images import ImageStore

                rootfs = ImageStore(image_cache()).rootfs_path("debian:13")
                out["sustained_floor"] = measure_floor(rootfs, seconds, concurrency)
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
        if row["case"] == TEMPLATE_LABEL:
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
            f"create → first command p50 {sustained['p50']:.1f} ms, p99 {sustained['p99']:.1f} ms; "
            f"the box's CPU per create {sustained['box_cpu_ms_per_create']:.0f} ms"
            + (
                f"; the control plane's {sustained['controlplane_cpu_ms_per_create']:.1f} ms"
                if sustained.get("controlplane_cpu_ms_per_create")
                else ""
            )
            + (
                f"; the agent's CPU per create and delete (its children included, not the sandboxes') "
                f"{sustained['agent_cpu_ms_per_create']:.0f} ms."
                if sustained.get("agent_cpu_ms_per_create")
                else "."
            )
        )
    floor = result.get("sustained_floor")
    if floor:
        lines.append(
            f"Floor, same run (`crun run -d` + `crun delete -f`, netns and cgroup each): {floor['per_s']:.1f}/s "
            f"at concurrency {floor['concurrency']} for {floor['seconds']:.1f} s ({floor['creates']} runs, "
            f"{floor['errors']} errors; `crun run -d` p50 {floor['p50']:.1f} ms, p99 {floor['p99']:.1f} ms); "
            f"crun's CPU per run + delete {floor['crun_cpu_ms_per_create']:.1f} ms, the box's "
            f"{floor['box_cpu_ms_per_create']:.1f} ms."
        )
        for label, name in (("SDK", "sustained"), ("host agent API", "sustained_agent")):
            sustained = result.get(name)
            if not sustained or not floor["per_s"]:
                continue
            ratios = (
                f"{label} ÷ floor: rate {sustained['per_s'] / floor['per_s']:.2f}, "
                f"the box's CPU per create {sustained['box_cpu_ms_per_create'] / max(floor['box_cpu_ms_per_create'], 1e-9):.1f}×"
            )
            if sustained.get("agent_cpu_ms_per_create"):
                ratios += (
                    f", the agent's CPU per create and delete ÷ crun's "
                    f"{sustained['agent_cpu_ms_per_create'] / max(floor['crun_cpu_ms_per_create'], 1e-9):.1f}×"
                )
            lines.append(ratios + ".")
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
    result["command"] = (
        f"python -m bench.pools_bench --rounds {args.rounds} --seconds {args.seconds:g} "
        f"--concurrency {args.concurrency}"
    )
    text = markdown(result)
    print(json.dumps(result, indent=1, default=str))
    print(text)
    results = Path(__file__).resolve().parent / "results"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (results / f"pools-{stamp}.json").write_text(json.dumps(result, indent=1, default=str))
    (results / f"pools-{stamp}.md").write_text(f"`{result['command']}`\n\n{text}\n")


if __name__ == "__main__":
    main()
