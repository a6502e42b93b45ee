"""What hibernation costs (issue #34, docs/hibernation.md): the time to hibernate a sandbox and to wake it,
and what a hibernated sandbox still costs the host in memory.

    .venv/bin/python -m bench.hibernate_bench [--count 20] [--mb 50] [--runtime crun]

One ``tests.live`` platform (control plane + one host agent of ``runtime``), started here. ``count``
sandboxes (``s-1vcpu-256mb``) each write ``mb`` MB to their disk and hold 32 MB in ``/dev/shm``
(memory), then, through the public API:

- hibernate: ``POST …/pause {"keep_memory": false}`` answered ``paused`` (``api``), and the host agent's
  own time (``host``: ``hibernate_ms`` of its ``sandbox_hibernated`` line: freeze, syncfs, clone, record,
  container and slot taken down);
- memory: the host's ``MemAvailable`` (caches dropped) with all of them running, against before they were
  made; then, once woken and hibernated again, with all of them hibernated against just after they were
  destroyed, back to back: what a hibernated sandbox still holds on the host (``hibernated_mib``; its
  agent record is ``record_bytes`` on disk);
- wake: ``POST …/resume`` answered ``running`` (``api``), and the host's ``wake_ms`` (a slot taken, the kept
  disk cloned onto it, the container booted, networks, disks and volumes put back); each woken sandbox is
  checked to hold its file.

The warm pool refills between steps, untimed. Needs root and the debian:13 image. Never fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from tests.live import LivePlatform, start_platform

from bench.stats import summarize
from paddock_hostagent.guest.build import ensure_agent_binary

SHAPE = "s-1vcpu-256mb"
REFILL_S = 0.5


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()["data"]


def _sh(http: httpx.Client, sandbox_id: str, script: str) -> str:
    result = _ok(http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}))
    out = result["result"]
    assert out["exit_code"] == 0, out
    return str(out["stdout"])


def _mem_available_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _memory(platform: LivePlatform) -> dict[str, float]:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")  # the kept disks' pages are not what is measured
    time.sleep(0.5)
    process = platform.agents[0].process
    assert process is not None
    return {"available_mib": _mem_available_mib(), "agent_rss_mib": _rss_mib(process.pid)}


def _host_ms(platform: LivePlatform, event: str, key: str, sandbox_id: str) -> list[float]:
    found = []
    for line in platform.agents[0].log_path.read_text(errors="replace").splitlines():
        if f'"{event}"' in line and sandbox_id in line:
            found.append(float(json.loads(line)[key]))
    return found


def _boot_phases(platform: LivePlatform, sandbox_id: str) -> dict[str, float]:
    """The phases of the last boot of ``sandbox_id`` from its kept disk (``snapshot_boot_phases``)."""
    phases: dict[str, float] = {}
    for line in platform.agents[0].log_path.read_text(errors="replace").splitlines():
        if '"snapshot_boot_phases"' in line and sandbox_id in line:
            fields = json.loads(line)
            phases = {
                key: float(value)
                for key, value in fields.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)
            }
    return phases


def run(count: int, mb: int, runtime: str) -> dict[str, Any]:
    guest = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    platform: LivePlatform | None = None
    times: dict[str, list[float]] = {
        "hibernate_api": [],
        "hibernate_host": [],
        "hibernate_copy": [],
        "hibernate_commit": [],
        "hibernate_teardown": [],
        "wake_api": [],
        "wake_host": [],
    }
    memory: dict[str, dict[str, float]] = {}
    try:
        ensure_agent_binary(guest)
        platform = start_platform(guest, agent_options={"runtime": runtime})
        with platform.http(platform.api_key("enterprise"), timeout=300) as http:
            time.sleep(2 * REFILL_S)
            memory["before"] = _memory(platform)
            ids = []
            for _ in range(count):
                sandbox_id = _ok(http.post("/v1/sandboxes", json={"shape": SHAPE}))["id"]
                _sh(
                    http,
                    sandbox_id,
                    f"head -c {mb}M /dev/urandom > /root/data.bin; sha256sum /root/data.bin > /root/data.sum;"
                    " dd if=/dev/zero of=/dev/shm/held bs=1M count=32 status=none",
                )
                ids.append(sandbox_id)
            time.sleep(2 * REFILL_S)
            memory["running"] = _memory(platform)
            for sandbox_id in ids:
                time.sleep(REFILL_S)
                started = time.perf_counter()
                view = _ok(http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": False}))
                times["hibernate_api"].append((time.perf_counter() - started) * 1000)
                assert view["status"] == "paused" and view.get("hibernated") is True, view
                for phase in ("hibernate", "copy", "commit", "teardown"):
                    times["hibernate_host" if phase == "hibernate" else f"hibernate_{phase}"] += _host_ms(
                        platform, "sandbox_hibernated", f"{phase}_ms", sandbox_id
                    )
            time.sleep(2 * REFILL_S)
            memory["hibernated"] = _memory(platform)
            for sandbox_id in ids:
                time.sleep(REFILL_S)
                started = time.perf_counter()
                view = _ok(http.post(f"/v1/sandboxes/{sandbox_id}/resume"))
                times["wake_api"].append((time.perf_counter() - started) * 1000)
                assert view["status"] == "running", view
                times["wake_host"] += _host_ms(platform, "sandbox_woken", "wake_ms", sandbox_id)
                for phase, ms in _boot_phases(platform, sandbox_id).items():
                    times.setdefault(f"wake_{phase}", []).append(ms)
                assert "OK" in _sh(http, sandbox_id, "sha256sum -c /root/data.sum")
            # What the hibernated ones still hold, measured back to back: all hibernated, then all gone.
            for sandbox_id in ids:
                view = _ok(http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": False}))
                assert view.get("hibernated") is True, view
            time.sleep(2 * REFILL_S)
            memory["hibernated_again"] = _memory(platform)
            records = platform.agents[0].state_dir / "sandboxes"
            record_bytes = sum((records / f"{sandbox_id}.json").stat().st_size for sandbox_id in ids) / count
            for sandbox_id in ids:
                assert http.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 200
            for sandbox_id in ids:
                deadline = time.monotonic() + 60
                while _ok(http.get(f"/v1/sandboxes/{sandbox_id}"))["status"] != "destroyed":
                    assert time.monotonic() < deadline, sandbox_id
                    time.sleep(0.1)
            memory["destroyed"] = _memory(platform)
    finally:
        try:
            if platform is not None:
                platform.stop()
        finally:
            shutil.rmtree(guest, ignore_errors=True)
    before, running = memory["before"], memory["running"]
    again, destroyed = memory["hibernated_again"], memory["destroyed"]
    per = {
        "running_mib": (before["available_mib"] - running["available_mib"]) / count,
        "hibernated_mib": (destroyed["available_mib"] - again["available_mib"]) / count,
        "record_bytes": record_bytes,
    }
    return {"times_ms": times, "memory": memory, "per_sandbox": per}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--count", type=int, default=20, help="sandboxes hibernated and woken, one at a time (at most 30)"
    )
    parser.add_argument("--mb", type=int, default=50, help="MB each writes to its disk first")
    parser.add_argument("--runtime", default="crun", choices=["crun", "runc"])
    args = parser.parse_args(argv)
    results = run(args.count, args.mb, args.runtime)
    print(f"hibernation on {args.runtime}, {args.count} sandboxes, {args.mb} MB written each (ms)")
    print(f"{'step':>16} {'p50':>9} {'p90':>9} {'p99':>9} {'min':>9} {'max':>9}")
    for step, values in results["times_ms"].items():
        s = summarize(values)
        print(f"{step:>16} {s['p50']:9.1f} {s['p90']:9.1f} {s['p99']:9.1f} {s['min']:9.1f} {s['max']:9.1f}")
    per = results["per_sandbox"]
    print(
        f"host memory per sandbox (MemAvailable, caches dropped): running {per['running_mib']:.1f} MiB"
        f" (against before they were made), hibernated {per['hibernated_mib']:.2f} MiB (against just after"
        f" they were destroyed); its record {per['record_bytes']:.0f} bytes"
    )
    json.dump(results, sys.stderr)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
