"""Density: idle sandboxes created one after another through the API until a cap, a limit or memory stops it.

The run stops at ``cap`` (a time budget, not a limit of Paddock), at the first refused create (its
error code is the stop reason) or when the host's MemAvailable falls under 10 %. Then, with every
sandbox idle:

- host memory per sandbox, accounted: its memory cgroup's usage (what its limit counts: the guest agent
  and anything it runs) + the growth of unreclaimable kernel memory (slab, page tables, stacks: netns,
  veth, loop device, overlay) + the growth of the control plane's and host agent's RSS, per sandbox;
- as a cross-check, the fall of MemAvailable per sandbox (noisy: every other process on the machine
  moves it); the guest agent's RSS (PID 1 of the sandbox) is shown too;
- how many would fit: MemAvailable at the start ÷ accounted memory per sandbox (extrapolated), and
  the host's schedulable memory ÷ the shape's memory (the scheduler's own stop; the bench's agent
  overcommits memory ``OVERCOMMIT``×, ``PADDOCK_HOST_MEMORY_OVERCOMMIT``);
- how it scales: create time around 1, 100, 500 and 1,000 live sandboxes (the creates just before each
  mark; at 1 live, ten created and destroyed beside the first), exec ``true`` p50 on a live sandbox at 1 live and at the end, and the host agent's open file
  descriptors and the host's loop devices at the start and the end.
Per-user caps (plans) are avoided by spreading the sandboxes over enterprise users.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lifecycle import DISK_MIB, SHAPE, SHAPE_MIB
from bench.machine import load_average, meminfo_kib
from bench.profiling import py_spy_recording
from bench.stats import Samples, summarize

PER_USER = 25
# The bench agent's memory overcommit. Admission keeps promised ÷ ratio of the machine's available
# memory for what the sandboxes may still grow into: at 12× that stopped a run at 945 × 256 MiB
# on this 24 GiB host (bench/results/20261125T204517Z.md); 16× leaves room for 1,000.
OVERCOMMIT = 16
DISK_OVERCOMMIT = 40  # and disk: 1,000 sparse 2 GiB disks on ~70 GiB free (idle ones hold a few MiB)
MARKS = (1, 100, 500, 1000)  # live counts at which create time is reported
MARK_WINDOW = 10  # creates just before each mark
SPACED = 10  # creates one at a time, the pools refilled between, at 1 live and at the end
EXECS = 30
RESULTS = Path(__file__).parent / "results"


def open_fds(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return 0


def loop_devices() -> int:
    return sum(1 for _ in Path("/sys/block").glob("loop*/loop/backing_file"))


def exec_p50(sandbox: Any, samples: Samples, label: str) -> None:
    for _ in range(EXECS):
        with samples.time(label):
            sandbox.run("true")


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def kernel_kib() -> int:
    """Kernel memory nobody can reclaim: unreclaimable slab, page tables, kernel stacks."""
    return sum(meminfo_kib(field) for field in ("SUnreclaim", "PageTables", "KernelStack"))


def memory_cgroup(sandbox_id: str, agent_state_dir: Path) -> Path | None:
    """The sandbox's memory cgroup: the path its host agent recorded (a sandbox claimed from the warm
    pool keeps its slot's cgroup), else one named after it."""
    root = Path("/sys/fs/cgroup/memory")
    if not root.is_dir():  # a pure cgroup2 machine
        root = Path("/sys/fs/cgroup")
    try:
        record = json.loads((agent_state_dir / "sandboxes" / f"{sandbox_id}.json").read_text())
        recorded = root / record["driver_state"]["cgroups_path"].lstrip("/")
        if recorded.is_dir():
            return recorded
    except (OSError, ValueError, KeyError):
        pass
    for found in root.glob(f"**/paddock*/{sandbox_id}"):
        if found.is_dir():
            return found
    return None


def cgroup_usage(group: Path) -> tuple[int, int]:
    """(usage bytes, rss bytes) of a v1 or v2 memory cgroup."""
    usage_file = group / "memory.usage_in_bytes"
    if not usage_file.exists():
        usage_file = group / "memory.current"
    usage = int(usage_file.read_text().split()[0])
    rss = 0
    for line in (group / "memory.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in ("total_rss", "anon"):
            rss = int(value)
    return usage, rss


def _log_lines(path: Path | None) -> list[dict[str, Any]]:
    """The JSON lines of a service's log (others skipped); none when it cannot be read."""
    if path is None:
        return []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def _stdout_path(pid: int) -> Path | None:
    """Where a child service writes its log (its stdout), if a file."""
    try:
        target = Path(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        return None
    return target if target.is_file() else None


def _at(event: dict[str, Any]) -> float:
    try:
        return dt.datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return 0.0


def create_split(spaced: list[dict[str, Any]], agent_log: Path | None, cp_log: Path | None) -> dict[str, Any]:
    """Where each spaced create's time went, from the services' own logs and the answer's ``spawn_ms``:

    - ``api``: the SDK's create, end to end;
    - ``controlplane_request``: the control plane's ``POST /v1/sandboxes`` (its request log line, the
      one that ended within this create: they are made one at a time);
    - ``host_call``: the control plane's call to the host (the answer's ``spawn_ms``);
    - ``agent_call``: the host agent's handling of that call (its ``channel_call``/``request`` line);
    - ``agent_bring_up``: its boot, from admission to the record saved (``sandbox_created``'s spawn_ms);
    - the driver's ``create_phases`` (``slot``, ``claim``; a cold boot's ``identity`` … ``guest``), and
      whether it claimed a parked sandbox.
    The control plane's own part is ``controlplane_request - host_call``; the link's
    ``host_call - agent_call``."""
    agent_events = _log_lines(agent_log)
    cp_events = _log_lines(cp_log)
    by_sandbox: dict[str, dict[str, Any]] = {}
    calls: dict[str, float] = {}
    for event in agent_events:
        name = event.get("event")
        if name in ("create_phases", "sandbox_created") and event.get("sandbox_id"):
            by_sandbox.setdefault(event["sandbox_id"], {})[name] = event
        elif (name == "channel_call" and event.get("op") == "create") or (
            name == "request"
            and event.get("method") == "POST"
            and event.get("path") == "/internal/v1/sandboxes"
        ):
            calls[str(event.get("request_id"))] = float(event.get("duration_ms", 0))
    posts = [
        e
        for e in cp_events
        if e.get("event") == "request" and e.get("method") == "POST" and e.get("path") == "/v1/sandboxes"
    ]
    rows = []
    for create in spaced:
        row: dict[str, Any] = {"id": create["id"], "api": create["api_ms"], "host_call": create["spawn_ms"]}
        post = next((e for e in posts if create["started_at"] <= _at(e) <= create["ended_at"] + 0.05), None)
        if post is not None:
            row["controlplane_request"] = float(post["duration_ms"])
        found = by_sandbox.get(create["id"], {})
        created = found.get("sandbox_created")
        if created is not None:
            row["agent_bring_up"] = float(created.get("spawn_ms") or 0)
            if str(created.get("request_id")) in calls:
                row["agent_call"] = calls[str(created.get("request_id"))]
        phases = found.get("create_phases")
        if phases is not None:
            row["parked"] = bool(phases.get("parked"))
            row["warm_slot"] = bool(phases.get("warm_slot"))
            for key, value in phases.items():
                if key.endswith("_ms"):
                    row[key.removesuffix("_ms")] = float(value)
        rows.append(row)
    parts = sorted({key for row in rows for key, value in row.items() if isinstance(value, float)})
    return {
        "creates": rows,
        "p50_ms": {part: summarize([row[part] for row in rows if part in row])["p50"] for part in parts},
        "parked": sum(1 for row in rows if row.get("parked")),
        "not_parked": sum(1 for row in rows if row.get("parked") is False),
    }


def guest_rss_kib(group: Path) -> int:
    for procs in ("cgroup.procs", "tasks"):
        path = group / procs
        if path.exists():
            pids = [int(p) for p in path.read_text().split()]
            return min((rss_kib(pid) for pid in pids[:1]), default=0)
    return 0


def _recorded(label: str, pids: dict[str, int]) -> contextlib.AbstractContextManager[None]:
    """With ``PADDOCK_BENCH_PY_SPY`` set to py-spy's path, records each service while the block runs,
    into ``bench/results/density-<time>-<service>-<label>.raw``: the Python each ran at that many live
    sandboxes, the creates' and what runs beside them (``profiling.py_spy_recording``)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    slug = "-".join(label.replace("(", "").replace(")", "").split())
    outputs = {pid: RESULTS / f"density-{stamp}-{name}-{slug}.raw" for name, pid in pids.items()}
    return py_spy_recording(os.environ.get("PADDOCK_BENCH_PY_SPY") or None, outputs)


def run(
    base_url: str,
    new_key: Any,
    cp_pid: int,
    agent_pid: int,
    agent_url: str,
    agent_token: str,
    agent_state_dir: Path,
    pool_size: int,
    cap: int,
) -> dict[str, Any]:
    from paddock import APIError, Client, RetryPolicy

    agent = httpx.Client(base_url=agent_url, headers={"Authorization": f"Bearer {agent_token}"}, timeout=30)

    def wait_pool() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and agent.get("/internal/v1/info").json()["warm_slots"] < pool_size:
            time.sleep(0.1)

    def spaced_creates(label: str) -> list[float]:
        """Creates as a user makes them now and then, each after the pools refilled (so each claims a
        parked sandbox), by an account of their own (the others are at their plan's cap)."""
        times: list[float] = []
        with (
            Client(base_url, new_key(), timeout=300, retry=RetryPolicy(max_retries=0)) as client,
            _recorded(label, {"controlplane": cp_pid, "agent": agent_pid}),
        ):
            for index in range(SPACED):
                wait_pool()
                time.sleep(1.0)  # the freed slot's parked sandbox boots after the slot is back
                started_at = time.time()
                started = time.perf_counter()
                extra = client.sandboxes.create(
                    SHAPE, name=f"spaced-{index}", rootfs="debian:13", disk_mib=DISK_MIB
                )
                times.append((time.perf_counter() - started) * 1000)
                samples.add(label, times[-1])
                spaced_log.setdefault(label, []).append(
                    {
                        "id": extra.id,
                        "api_ms": times[-1],
                        "spawn_ms": float(extra.info.spawn_ms or 0),
                        "started_at": started_at,
                        "ended_at": time.time(),
                    }
                )
                extra.destroy()
        return times

    wait_pool()
    time.sleep(1)
    start_available = meminfo_kib("MemAvailable")
    start_kernel = kernel_kib()
    start_cp, start_agent = rss_kib(cp_pid), rss_kib(agent_pid)
    start_fds, start_loops = open_fds(agent_pid), loop_devices()
    host_info = agent.get("/internal/v1/info").json()
    samples = Samples()
    creates: list[float] = []
    at_one: list[float] = []
    spaced_at_one: list[float] = []
    spaced_at_end: list[float] = []
    spaced_log: dict[str, list[dict[str, Any]]] = {}
    load_at_live: dict[str, list[float]] = {}  # the box's load as each mark's creates and execs began
    clients: list[Any] = []
    made: list[Any] = []
    stop_reason = f"cap of {cap} reached (time budget)"
    try:
        while len(made) < cap:
            if len(made) % PER_USER == 0:
                clients.append(Client(base_url, new_key(), timeout=300, retry=RetryPolicy(max_retries=0)))
            if meminfo_kib("MemAvailable") < meminfo_kib("MemTotal") // 10:
                stop_reason = "MemAvailable under 10 %"
                break
            try:
                started = time.perf_counter()
                sandbox = clients[-1].sandboxes.create(
                    SHAPE, name=f"dense-{len(made)}", rootfs="debian:13", disk_mib=DISK_MIB
                )
                creates.append((time.perf_counter() - started) * 1000)
                samples.add("create (back to back)", creates[-1])
            except APIError as exc:
                stop_reason = f"create refused: {exc.status} {exc.code}: {exc}"
                break
            except Exception as exc:  # the harness or the product broke: report how far it got
                stop_reason = f"create failed: {type(exc).__name__}: {exc}"
                break
            made.append(sandbox)
            if len(made) == 1:
                exec_p50(sandbox, samples, "exec `true` at 1 live")
                # One create is no sample: beside the first sandbox, MARK_WINDOW more are created and
                # destroyed back to back, as the creates before each later mark are made.
                for index in range(MARK_WINDOW):
                    started = time.perf_counter()
                    extra = clients[-1].sandboxes.create(
                        SHAPE, name=f"dense-one-{index}", rootfs="debian:13", disk_mib=DISK_MIB
                    )
                    at_one.append((time.perf_counter() - started) * 1000)
                    extra.destroy()
                load_at_live["1"] = load_average()
                spaced_at_one = spaced_creates("create (spaced) at 1 live")
        wait_pool()
        time.sleep(2)  # let page cache and lazily started helpers settle
        count = len(made)
        if made:
            load_at_live[str(count)] = load_average()
            exec_p50(made[len(made) // 2], samples, f"exec `true` at {count} live")
            spaced_at_end = spaced_creates(f"create (spaced) at {count} live")
        end_fds, end_loops = open_fds(agent_pid), loop_devices()
        end_available = meminfo_kib("MemAvailable")
        end_kernel = kernel_kib()
        end_cp, end_agent = rss_kib(cp_pid), rss_kib(agent_pid)
        usages, rsses, guests = [], [], []
        for sandbox in made:
            group = memory_cgroup(sandbox.id, agent_state_dir)
            if group is None:
                continue
            usage, rss = cgroup_usage(group)
            usages.append(usage / 2**20)
            rsses.append(rss / 2**20)
            guests.append(guest_rss_kib(group) / 1024)
        per = (lambda kib: kib / 1024 / count) if count else (lambda kib: float("nan"))
        cp_per, agent_per = per(end_cp - start_cp), per(end_agent - start_agent)
        kernel_per = per(end_kernel - start_kernel)
        cgroup_mean = summarize(usages)["mean"]
        # What can be attributed to one sandbox; growth that is negative (noise) counts as nothing.
        accounted = cgroup_mean + max(kernel_per, 0) + max(cp_per, 0) + max(agent_per, 0)
        available_fall = per(start_available - end_available)
        result: dict[str, Any] = {
            "created": count,
            "stop_reason": stop_reason,
            "shape": SHAPE,
            "disk_mib": DISK_MIB,
            "host_mib_per_sandbox": accounted,
            "mem_available_fall_mib_per_sandbox": available_fall,
            "kernel_mib_per_sandbox": kernel_per,
            "controlplane_rss_mib": {"start": start_cp / 1024, "end": end_cp / 1024},
            "hostagent_rss_mib": {"start": start_agent / 1024, "end": end_agent / 1024},
            "controlplane_mib_per_sandbox": cp_per,
            "hostagent_mib_per_sandbox": agent_per,
            "cgroup_usage_mib": summarize(usages),
            "cgroup_rss_mib": summarize(rsses),
            "guest_agent_rss_mib": summarize(guests),
            "mem_available_mib": {"start": start_available / 1024, "end": end_available / 1024},
            "host_total_mib": host_info.get("total_mib"),
            "fit_by_memory_extrapolated": int(start_available / 1024 / accounted) if accounted > 0 else None,
            "fit_by_scheduler": int(host_info.get("total_mib", 0) // SHAPE_MIB),
            "timings": samples.summary(),
            "create_at_live": {
                str(mark): summarize(at_one if mark == 1 else creates[max(mark - MARK_WINDOW, 0) : mark])
                for mark in MARKS
                if len(creates) >= mark
            },
            # One at a time with the pools refilled between: what a create costs a user at that density.
            "create_spaced_at_live": {"1": summarize(spaced_at_one), str(count): summarize(spaced_at_end)}
            if made
            else {},
            # Where each of those creates went, control plane against host agent (create_split).
            "create_spaced_split": {
                label: create_split(rows, agent_state_dir / "agent.log", _stdout_path(cp_pid))
                for label, rows in spaced_log.items()
            },
            "load_at_live": load_at_live,
            "hostagent_fds": {"start": start_fds, "end": end_fds},
            "loop_devices": {"start": start_loops, "end": end_loops},
            "overcommit": OVERCOMMIT,
            "disk_overcommit": DISK_OVERCOMMIT,
        }
        destroy = Samples()
        reclaim_started = time.perf_counter()
        for sandbox in made:
            with destroy.time("destroy"):
                sandbox.destroy()
        made.clear()
        # The API answers a destroy at once and the host reclaims in the background: the run ends when
        # the host holds none of them, or the next section (and the teardown) would race the reclaims.
        deadline = time.monotonic() + 900
        while True:
            try:
                if agent.get("/internal/v1/info").json()["vm_count"] == 0:
                    break
            except httpx.TimeoutException:
                pass  # an agent reclaiming a thousand sandboxes may answer slowly: ask again
            if time.monotonic() > deadline:
                raise RuntimeError("the host still held sandboxes 15 minutes after their destroys")
            time.sleep(0.5)
        result["reclaim_all_s"] = time.perf_counter() - reclaim_started
        result["timings"].update(destroy.summary())
        return result
    finally:
        for sandbox in made:
            with contextlib.suppress(Exception):
                sandbox.destroy()
        for client in clients:
            client.close()
        agent.close()
