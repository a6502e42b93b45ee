"""Hibernation at scale (issue #34: "10,000 hibernated sandboxes on one host, costing only their disk").

    .venv/bin/python -m bench.hibernate_scale [--count 500] [--concurrency 4] [--budget-s 3600]

One ``tests.live`` platform (control plane + one crun host agent beating every 2 s, as in production),
started here. ``count`` sandboxes (``s-1vcpu-256mb``, spread over enterprise users to stay under the
plans' daily caps) are each created, write their id to ``/root/id`` and are hibernated through the
public API, ``concurrency`` at a time, until ``count`` or ``budget_s``. Then, with all of them
hibernated:

- host memory: ``MemAvailable`` and unreclaimable slab (caches dropped) against before the first, and
  the host agent's and control plane's RSS and open files; the curve every 10 % shows what grows;
- what each one holds: its running slot's directory, network namespace, disk mount, loop device,
  cgroup, init process and address are checked gone (asserted), and its kept files are listed;
- disk: the disk store's used space and the host file system's per sandbox, its record's bytes;
- the steady cost: host agent and control plane CPU per second while idle, the heartbeat's report
  (size, and the control plane's time to fold one, replayed with the agent's own views), the agent's
  list of its sandboxes, ``GET /v1/sandboxes/{id}`` and ``GET /v1/sandboxes`` p50;
- the host agent's restart with all of them (SIGTERM, start, until it answers and lists them all);
- a wake of random ones (the file is back), hibernated again.

Everything is destroyed at the end and the host checked for leftovers (``ip netns``, mounts, loop
devices of the agent's state dir), also when a step fails. Needs root and the debian:13 image. Writes
``bench/results/hibernate-scale-<time>.json`` and ``.md``. Never fails on a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import math
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from tests.hibernation.test_hibernation_at_rest import held_of_slots, slot_parts
from tests.hostagent.conftest import TOKEN, leftovers
from tests.live import LivePlatform, start_platform

from bench.machine import load_average, meminfo_kib
from bench.stats import summarize
from paddock_core.heartbeat import ids_digest
from paddock_hostagent.guest.build import ensure_agent_binary

SHAPE = "s-1vcpu-256mb"
PER_USER = 250  # under the enterprise plan's 300 sandboxes a day
POOL_SIZE = 4
HEARTBEAT_S = 2.0  # the production default (the tests' agents beat every 0.2 s)
RESULTS = Path(__file__).resolve().parent / "results"
MIB = 1024 * 1024


# -- what the host holds --------------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _used_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def _mounts() -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [line.split()[4] for line in mountinfo]


def _loops() -> str:
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout


def _netns() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def _pids(platform: LivePlatform) -> tuple[int, int]:
    agent, controlplane = platform.agents[0].process, platform.controlplane.process
    assert agent is not None and controlplane is not None
    return agent.pid, controlplane.pid


def _host(platform: LivePlatform, *, drop_caches: bool) -> dict[str, float]:
    """The machine and the two services now; with ``drop_caches``, memory without the page cache (the
    kept disks' pages and the records' are not what a hibernated sandbox holds)."""
    if drop_caches:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
        time.sleep(0.5)
    agent_pid, cp_pid = _pids(platform)
    state = platform.agents[0].state_dir
    store = state / "disks"
    prefix = str(state)
    return {
        "available_mib": meminfo_kib("MemAvailable") / 1024,
        "sunreclaim_mib": meminfo_kib("SUnreclaim") / 1024,
        "agent_rss_mib": _rss_mib(agent_pid),
        "controlplane_rss_mib": _rss_mib(cp_pid),
        "agent_fds": _fds(agent_pid),
        "agent_cpu_s": _cpu_s(agent_pid),
        "controlplane_cpu_s": _cpu_s(cp_pid),
        "store_used_mib": _used_bytes(store) / MIB if os.path.ismount(store) else 0.0,
        "host_fs_used_mib": _used_bytes(state) / MIB,
        "agent_mounts": sum(1 for mount in _mounts() if mount.startswith(prefix)),
        "agent_loops": sum(1 for line in _loops().splitlines() if prefix in line),
        "agent_slots": len(os.listdir(state / "slots")) if (state / "slots").is_dir() else 0,
        "netns": len(_netns()),
        "load1": load_average()[0],
    }


# -- the API --------------------------------------------------------------------------------------


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, f"{response.status_code} {response.text[:500]}"
    return response.json()["data"]


class Bench:
    def __init__(self, platform: LivePlatform, count: int, concurrency: int) -> None:
        self.platform = platform
        self.count = count
        self.concurrency = concurrency
        users = math.ceil(count / PER_USER)
        self.keys = [platform.api_key("enterprise", credits=1_000_000) for _ in range(users)]
        self.http = httpx.Client(
            base_url=platform.url, timeout=300, limits=httpx.Limits(max_connections=concurrency + 4)
        )
        self.made: dict[str, str] = {}  # sandbox id -> its user's key, every one created
        self.parts: dict[str, dict[str, Any]] = {}
        self.hibernated: list[str] = []
        self.times: dict[str, list[float]] = {"create": [], "hibernate": []}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def call(self, method: str, path: str, key: str, **options: Any) -> httpx.Response:
        return self.http.request(method, path, headers={"X-API-Key": key}, **options)

    def one(self, index: int) -> None:
        """Creates sandbox ``index``, writes its id to its disk and hibernates it."""
        if self.stop.is_set():
            return
        key = self.keys[index // PER_USER]
        started = time.perf_counter()
        for attempt in range(5):  # a full warm pool or host answers 503/507 for a moment
            answer = self.call("POST", "/v1/sandboxes", key, json={"shape": SHAPE})
            if answer.status_code == 200 or answer.status_code < 500 or attempt == 4:
                break
            time.sleep(1 + attempt)
        if answer.status_code != 200:
            with self.lock:
                self.errors.append(f"create {index}: {answer.status_code} {answer.text[:300]}")
            self.stop.set()
            return
        sandbox_id = str(answer.json()["data"]["id"])
        created = time.perf_counter()
        with self.lock:
            self.made[sandbox_id] = key
        try:
            result = _ok(
                self.call(
                    "POST",
                    f"/v1/sandboxes/{sandbox_id}/exec",
                    key,
                    json={"cmd": "sh", "args": ["-c", f"echo {sandbox_id} > /root/id"]},
                )
            )
            assert result["result"]["exit_code"] == 0, result
            parts = slot_parts(self.platform.agents[0].state_dir, sandbox_id)
            paused = time.perf_counter()
            view = _ok(
                self.call("POST", f"/v1/sandboxes/{sandbox_id}/pause", key, json={"keep_memory": False})
            )
            assert view["status"] == "paused" and view.get("hibernated") is True, view
        except Exception as exc:
            with self.lock:
                self.errors.append(f"{sandbox_id}: {exc!r}"[:500])
            self.stop.set()
            return
        done = time.perf_counter()
        with self.lock:
            self.parts[sandbox_id] = parts
            self.hibernated.append(sandbox_id)
            self.times["create"].append((created - started) * 1000)
            self.times["hibernate"].append((done - paused) * 1000)

    def fill(self, budget_s: float) -> list[dict[str, Any]]:
        """Creates and hibernates up to ``count`` within ``budget_s``; answers the curve every 10 %."""
        curve: list[dict[str, Any]] = []
        step = max(self.count // 10, 1)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            pending: set[concurrent.futures.Future[None]] = set()
            next_index, marked = 0, 0
            while next_index < self.count or pending:
                while (
                    next_index < self.count and len(pending) < self.concurrency * 2 and not self.stop.is_set()
                ):
                    pending.add(pool.submit(self.one, next_index))
                    next_index += 1
                if self.stop.is_set():
                    next_index = self.count
                done, pending = concurrent.futures.wait(
                    pending, timeout=5, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in done:
                    future.result()
                if time.monotonic() - started > budget_s and not self.stop.is_set():
                    self.errors.append(f"time budget of {budget_s:.0f} s reached")
                    self.stop.set()
                while len(self.hibernated) >= marked + step or (
                    not pending and marked < len(self.hibernated)
                ):
                    marked = min(marked + step, len(self.hibernated))
                    hosts = self.call("GET", "/v1/hosts", self.keys[0]).json()["data"]["data"]
                    point = {
                        "hibernated": len(self.hibernated),
                        "elapsed_s": round(time.monotonic() - started, 1),
                        "host_status": [host.get("status") for host in hosts],
                        **_host(self.platform, drop_caches=False),
                    }
                    curve.append(point)
                    print(json.dumps(point), flush=True)
        return curve

    def destroy_all(self) -> None:
        ids = list(self.made)
        if not ids:
            return

        def destroy(sandbox_id: str) -> None:
            with_key = self.made[sandbox_id]
            for _ in range(3):
                try:
                    answer = self.call("DELETE", f"/v1/sandboxes/{sandbox_id}", with_key)
                    if answer.status_code in (200, 404):
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(1)

        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            list(pool.map(destroy, ids))
        deadline = time.monotonic() + 600
        agent = self.platform.agents[0]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        while time.monotonic() < deadline:
            listed = httpx.get(agent.url + "/internal/v1/sandboxes", headers=headers, timeout=120)
            if listed.status_code == 200 and not listed.json():
                return
            time.sleep(2)
        raise AssertionError("the host agent still holds sandboxes 10 minutes after their destroy")


def _p50_ms(calls: int, work: Any) -> dict[str, Any]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        work()
        samples.append((time.perf_counter() - started) * 1000)
    return summarize(samples)


def _heartbeat(platform: LivePlatform) -> dict[str, Any]:
    """The beat's report as the agent builds it (``Registrar.payload``) from its own views, its size,
    and the control plane's time to take one (replayed: the same host, the same sandboxes)."""
    agent = platform.agents[0]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    listing: dict[str, Any] = {}

    def list_views() -> None:
        answer = httpx.get(agent.url + "/internal/v1/sandboxes", headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        listing["views"], listing["bytes"] = answer.json(), len(answer.content)

    agent_list = _p50_ms(5, list_views)
    info = httpx.get(agent.url + "/internal/v1/info", headers=headers, timeout=60).json()
    reports = [
        {
            "id": view["id"],
            "status": view["status"],
            "oom_kills": view.get("oom_kills", 0),
            "last_activity_at": view.get("last_activity_at"),
        }
        for view in listing["views"]
    ]
    beat = {
        "id": info["id"],
        "url": agent.url,
        "free_mib": info["free_mib"],
        "total_mib": info["total_mib"],
        "vm_count": info["vm_count"],
        "rootfses": info["rootfses"],
        "buildable": info.get("buildable", []),
        "labels": info.get("labels", {}),
        "runtime": info["runtime"],
        "status": "active",
        "sandboxes": reports,
    }
    body = json.dumps(beat).encode()
    # The beat an agent sends once the control plane has said it holds the same hibernated sandboxes
    # (paddock_core/heartbeat.py): them left out, their count and digest instead.
    asleep = [view["id"] for view in listing["views"] if view.get("hibernated")]
    summarised = {
        **beat,
        "sandboxes": [
            report
            for report, view in zip(reports, listing["views"], strict=True)
            if not view.get("hibernated")
        ],
        "hibernated": {"count": len(asleep), "digest": ids_digest(asleep), "listed": False},
    }
    summarised_body = json.dumps(summarised).encode()

    def poster(content: bytes, answers: list[str]) -> Callable[[], None]:
        def post_beat() -> None:
            answer = httpx.post(
                platform.url + "/internal/v1/hosts/heartbeat",
                content=content,
                headers={**headers, "Content-Type": "application/json"},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            answers.append(str(answer.json().get("hibernated_summary")))

        return post_beat

    listed_answers: list[str] = []
    summary_answers: list[str] = []
    listed_ms = _p50_ms(5, poster(body, listed_answers))
    first_summary_ms = _p50_ms(1, poster(summarised_body, summary_answers))  # reads the ids once
    summary_ms = _p50_ms(5, poster(summarised_body, summary_answers))  # the digest trusted 30 s
    assert set(summary_answers) == {"ok"}, summary_answers  # it holds the same set: they stay out
    return {
        "reports": len(reports),
        "report_bytes": len(body),
        "controlplane_fold_ms": listed_ms,
        "summarised_reports": len(summarised["sandboxes"]),
        "summarised_bytes": len(summarised_body),
        "controlplane_fold_summarised_first_ms": first_summary_ms,
        "controlplane_fold_summarised_ms": summary_ms,
        "agent_list_ms": agent_list,
        "agent_list_bytes": listing["bytes"],
    }


def _idle_cpu(platform: LivePlatform, seconds: float = 20.0) -> dict[str, float]:
    agent_pid, cp_pid = _pids(platform)
    before = (_cpu_s(agent_pid), _cpu_s(cp_pid))
    time.sleep(seconds)
    after = (_cpu_s(agent_pid), _cpu_s(cp_pid))
    return {
        "agent_cpu_ms_per_s": (after[0] - before[0]) * 1000 / seconds,
        "controlplane_cpu_ms_per_s": (after[1] - before[1]) * 1000 / seconds,
    }


def _restart(platform: LivePlatform, expected: int) -> dict[str, Any]:
    """SIGTERM, then a new agent on the same state: until it answers, and until it lists all of them."""
    agent = platform.agents[0]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    started = time.perf_counter()
    agent.stop(signal.SIGTERM, timeout_s=300)
    stopped = time.perf_counter()
    agent.start(timeout_s=900)
    answering = time.perf_counter()
    listed = httpx.get(agent.url + "/internal/v1/sandboxes", headers=headers, timeout=300).json()
    held = sum(1 for view in listed if view.get("hibernated"))
    assert held >= expected, f"the restarted agent holds {held} hibernated sandboxes, not {expected}"
    return {
        "stop_ms": (stopped - started) * 1000,
        "start_ms": (answering - stopped) * 1000,
        "listed_ms": (time.perf_counter() - stopped) * 1000,
        "hibernated_held": held,
        "agent_rss_mib": _rss_mib(_pids(platform)[0]),
        "agent_fds": _fds(_pids(platform)[0]),
    }


def _wakes(bench: Bench, picks: int) -> dict[str, Any]:
    """Random hibernated ones woken (their file is back) and hibernated again."""
    wake_ms: list[float] = []
    for sandbox_id in random.sample(bench.hibernated, min(picks, len(bench.hibernated))):
        key = bench.made[sandbox_id]
        started = time.perf_counter()
        view = _ok(bench.call("POST", f"/v1/sandboxes/{sandbox_id}/resume", key))
        wake_ms.append((time.perf_counter() - started) * 1000)
        assert view["status"] == "running", view
        result = _ok(
            bench.call(
                "POST", f"/v1/sandboxes/{sandbox_id}/exec", key, json={"cmd": "cat", "args": ["/root/id"]}
            )
        )
        assert result["result"]["stdout"].strip() == sandbox_id, result
        view = _ok(bench.call("POST", f"/v1/sandboxes/{sandbox_id}/pause", key, json={"keep_memory": False}))
        assert view.get("hibernated") is True, view
    return summarize(wake_ms)


def run(count: int, concurrency: int, budget_s: float, runtime: str) -> dict[str, Any]:
    guest = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    platform: LivePlatform | None = None
    bench: Bench | None = None
    host_before = {"netns": _netns(), "mounts": len(_mounts()), "loops": len(_loops().splitlines())}
    results: dict[str, Any] = {"count_asked": count, "concurrency": concurrency, "runtime": runtime}
    try:
        ensure_agent_binary(guest)
        platform = start_platform(
            guest,
            agent_options={
                "runtime": runtime,
                "pool_size": POOL_SIZE,
                "extra_env": {"PADDOCK_HOST_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S)},
            },
        )
        bench = Bench(platform, count, concurrency)
        time.sleep(3)  # the warm pool fills
        results["before"] = _host(platform, drop_caches=True)
        results["idle_before"] = _idle_cpu(platform, 10)
        fill_started = time.monotonic()
        results["curve"] = bench.fill(budget_s)
        results["fill_s"] = time.monotonic() - fill_started
        results["errors"] = bench.errors
        results["times_ms"] = bench.times
        hibernated = len(bench.hibernated)
        results["hibernated"] = hibernated
        time.sleep(5)  # the warm pool fills again
        results["after"] = after = _host(platform, drop_caches=True)
        held = held_of_slots(platform.agents[0].state_dir, bench.parts)
        results["held_by_hibernated"] = held[:50]
        kept = platform.agents[0].state_dir / "disks" / "snapshots" / "snap_hibernated"
        sample = kept / bench.hibernated[0] if bench.hibernated else kept
        results["kept_files"] = sorted(path.name for path in sample.iterdir()) if sample.is_dir() else []
        records = platform.agents[0].state_dir / "sandboxes"
        results["record_bytes"] = sum(
            (records / f"{sandbox_id}.json").stat().st_size for sandbox_id in bench.hibernated
        ) / max(hibernated, 1)
        before = results["before"]
        results["per_hibernated"] = {
            key: (after[key] - before[key]) / max(hibernated, 1)
            for key in (
                "available_mib",
                "sunreclaim_mib",
                "agent_rss_mib",
                "controlplane_rss_mib",
                "agent_fds",
                "store_used_mib",
                "host_fs_used_mib",
                "agent_mounts",
                "agent_loops",
                "agent_slots",
            )
        }
        results["idle"] = _idle_cpu(platform)
        results["heartbeat"] = _heartbeat(platform)
        picks = iter(random.choices(bench.hibernated, k=200))

        def get_one() -> None:
            sandbox_id = next(picks)
            view = _ok(bench.call("GET", f"/v1/sandboxes/{sandbox_id}", bench.made[sandbox_id]))
            assert view.get("hibernated") is True, view

        results["get_ms"] = _p50_ms(200, get_one)
        results["list_ms"] = _p50_ms(
            20, lambda: _ok(bench.call("GET", "/v1/sandboxes", bench.keys[0], params={"limit": 100}))
        )
        results["wake_ms"] = _wakes(bench, 5)
        results["restart"] = _restart(platform, hibernated)
        results["wake_after_restart_ms"] = _wakes(bench, 3)
        results["after_restart"] = _host(platform, drop_caches=True)
    finally:
        try:
            if bench is not None:
                destroy_started = time.monotonic()
                try:
                    bench.destroy_all()
                finally:
                    results["destroy_s"] = time.monotonic() - destroy_started
                    bench.http.close()
        finally:
            try:
                if platform is not None:
                    state_dir = platform.agents[0].state_dir
                    platform.stop()  # checks the agent left nothing behind, or raises
                    results["leftovers"] = leftovers(state_dir)
            finally:
                shutil.rmtree(guest, ignore_errors=True)
    ours = {f"pdk-{part['slot']}" for part in bench.parts.values()} if bench is not None else set()
    results["host_after_cleanup"] = {
        "netns_of_its_slots": sorted(_netns() & ours),
        "mounts": len(_mounts()) - host_before["mounts"],
        "loops": len(_loops().splitlines()) - host_before["loops"],
    }
    return results


def report(results: dict[str, Any]) -> str:
    per, before, after = results["per_hibernated"], results["before"], results["after"]
    beat, restart = results["heartbeat"], results["restart"]
    lines = [
        f"## Hibernation at scale: {results['hibernated']} hibernated sandboxes on one {results['runtime']} host",
        "",
        f"created and hibernated {results['hibernated']} of {results['count_asked']} in {results['fill_s']:.0f} s,"
        f" {results['concurrency']} at a time; stopped by: {results['errors'] or 'nothing'}",
        "",
        "| | before | with all hibernated | per hibernated sandbox |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("available_mib", "MemAvailable, caches dropped (MiB)"),
        ("sunreclaim_mib", "unreclaimable slab (MiB)"),
        ("agent_rss_mib", "host agent RSS (MiB)"),
        ("controlplane_rss_mib", "control plane RSS (MiB)"),
        ("agent_fds", "host agent open files"),
        ("store_used_mib", "disk store used (MiB)"),
        ("host_fs_used_mib", "host file system used (MiB)"),
        ("agent_mounts", "mounts under the agent's state"),
        ("agent_loops", "loop devices of the agent"),
        ("agent_slots", "slots (warm pool)"),
    ):
        lines.append(f"| {label} | {before[key]:.1f} | {after[key]:.1f} | {per[key]:+.4f} |")
    idle, idle_before = results["idle"], results["idle_before"]
    lines += [
        "",
        f"- each hibernated sandbox still holds of its slot: {results['held_by_hibernated'] or 'nothing'}"
        f" (slot directory, netns, mount, loop device, cgroup, init process, address, checked for each);"
        f" it keeps {results['kept_files']} in the disk store and a {results['record_bytes']:.0f}-byte record",
        f"- create p50 {summarize(results_times(results, 'create'))['p50']:.0f} ms,"
        f" hibernate p50 {summarize(results_times(results, 'hibernate'))['p50']:.0f} ms"
        f" (p99 {summarize(results_times(results, 'hibernate'))['p99']:.0f})",
        f"- idle CPU, host agent: {idle_before['agent_cpu_ms_per_s']:.1f} → {idle['agent_cpu_ms_per_s']:.1f} ms/s;"
        f" control plane: {idle_before['controlplane_cpu_ms_per_s']:.1f} →"
        f" {idle['controlplane_cpu_ms_per_s']:.1f} ms/s (a beat every {HEARTBEAT_S:.0f} s)",
        f"- heartbeat: {beat['reports']} reports, {beat['report_bytes'] / 1024:.0f} KiB;"
        f" the control plane folds one in {beat['controlplane_fold_ms']['p50']:.0f} ms p50;"
        f" the agent lists its sandboxes in {beat['agent_list_ms']['p50']:.0f} ms"
        f" ({beat['agent_list_bytes'] / 1024:.0f} KiB)",
        f"- heartbeat with the hibernated summarised (what an agent sends once the control plane holds the"
        f" same set): {beat['summarised_reports']} reports, {beat['summarised_bytes'] / 1024:.1f} KiB;"
        f" folded in {beat['controlplane_fold_summarised_ms']['p50']:.1f} ms p50"
        f" ({beat['controlplane_fold_summarised_first_ms']['p50']:.1f} ms for the first, which reads their ids)",
        f"- GET /v1/sandboxes/{{id}} p50 {results['get_ms']['p50']:.1f} ms,"
        f" GET /v1/sandboxes (100 of {PER_USER}) p50 {results['list_ms']['p50']:.1f} ms",
        f"- wake of a random one p50 {results['wake_ms']['p50']:.0f} ms (max {results['wake_ms']['max']:.0f});"
        f" after the restart {results['wake_after_restart_ms']['p50']:.0f} ms",
        f"- host agent restart: stop {restart['stop_ms']:.0f} ms, start until it answers"
        f" {restart['start_ms']:.0f} ms, until it lists all {restart['hibernated_held']}"
        f" {restart['listed_ms']:.0f} ms",
        f"- destroy of all: {results['destroy_s']:.0f} s; leftovers: {results['leftovers'] or 'none'};"
        f" host after cleanup: {results['host_after_cleanup']}",
    ]
    return "\n".join(lines)


def results_times(results: dict[str, Any], key: str) -> list[float]:
    return list(results["times_ms"][key])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=500, help="sandboxes created and hibernated")
    parser.add_argument("--concurrency", type=int, default=4, help="creates and hibernates at a time (≤ 30)")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="stop creating after this long")
    parser.add_argument("--runtime", default="crun", choices=["crun", "runc"])
    args = parser.parse_args(argv)
    assert 1 <= args.concurrency <= 30, "a user may run 30 at once"
    load = load_average()
    results = run(args.count, args.concurrency, args.budget_s, args.runtime)
    results["load_at_start"] = load
    results["load_at_end"] = load_average()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    text = report(results)
    command = (
        f".venv/bin/python -m bench.hibernate_scale --count {args.count} --concurrency {args.concurrency}"
    )
    text += f"\n\n`{command}`; load average at start {load}, at end {results['load_at_end']}\n"
    (RESULTS / f"hibernate-scale-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
    (RESULTS / f"hibernate-scale-{stamp}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
