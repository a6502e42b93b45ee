"""What a snapshot costs (issue #34): the time to take one and to boot a sandbox from one, against a fork
of the same sandbox, after the sandbox wrote ``size`` MB.

    .venv/bin/python -m bench.snapshots_bench [--sizes 100,2048] [--rounds 5] [--runtime crun]

One ``tests.live`` platform (control plane + one host agent of ``runtime``), started here. For each size a
sandbox writes ``size`` MB of random bytes to its disk, then each round, through the public API:

- snapshot: ``POST /v1/sandboxes/{id}/snapshots`` answered (``api``), and the host agent's own time for it
  (``host``: ``snapshot_ms`` of its ``sandbox_snapshotted`` log line: freeze, syncfs, clone, thaw, rename);
- boot from it: ``POST /v1/sandboxes`` with ``rootfs`` = the snapshot, answered ``running`` (``api``), and
  the sandbox's ``spawn_ms`` (the host's time from taking a slot to the guest agent answering);
- fork: ``POST …/fork`` until the child is ``running`` (``api``, polled every 5 ms), and its ``spawn_ms``.

Each booted sandbox is checked to hold the file (its size), then destroyed; the snapshot is deleted. The
host's warm pool refills between steps, untimed, as it would between requests. Needs root and the
debian:13 image. Never fails on a time.
"""

from __future__ import annotations

import argparse
import json
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

SHAPE = "s-1vcpu-1gb"
REFILL_S = 1.0


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()["data"]


def _sh(http: httpx.Client, sandbox_id: str, script: str) -> str:
    result = _ok(http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}))
    out = result["result"]
    assert out["exit_code"] == 0, out
    return str(out["stdout"])


def _wait_running(http: httpx.Client, sandbox_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:  # ends: running, or the assertion
        sandbox = _ok(http.get(f"/v1/sandboxes/{sandbox_id}"))
        if sandbox["status"] != "forking":
            assert sandbox["status"] == "running", sandbox
            return dict(sandbox)
        assert time.monotonic() < deadline, "fork still not running after 120 s"
        time.sleep(0.005)


def _host_snapshot_ms(platform: LivePlatform, snapshot_id: str) -> float:
    for line in platform.agents[0].log_path.read_text(errors="replace").splitlines():
        if snapshot_id in line and "sandbox_snapshotted" in line:
            return float(json.loads(line)["snapshot_ms"])
    raise AssertionError(f"no sandbox_snapshotted line for {snapshot_id}")


def _phases(platform: LivePlatform, event: str) -> dict[str, list[float]]:
    """The host agent's ``<step>_ms`` of each ``event`` line (``snapshot_boot_phases``, ``fork_phases``)."""
    found: dict[str, list[float]] = {}
    for line in platform.agents[0].log_path.read_text(errors="replace").splitlines():
        if f'"{event}"' not in line:
            continue
        for key, value in json.loads(line).items():
            if key.endswith("_ms") and isinstance(value, int | float):
                found.setdefault(f"{event.removesuffix('_phases')}.{key}", []).append(float(value))
    return found


def _destroy(http: httpx.Client, sandbox_id: str) -> None:
    assert http.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 200


def run(sizes: list[int], rounds: int, runtime: str) -> dict[str, dict[str, list[float]]]:
    guest = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    results: dict[str, dict[str, list[float]]] = {}
    platform: LivePlatform | None = None
    try:
        ensure_agent_binary(guest)
        platform = start_platform(guest, agent_options={"runtime": runtime})
        with platform.http(platform.api_key("enterprise"), timeout=300) as http:
            for size in sizes:
                out: dict[str, list[float]] = {
                    "snapshot_api": [],
                    "snapshot_host": [],
                    "boot_api": [],
                    "boot_spawn": [],
                    "fork_api": [],
                    "fork_spawn": [],
                }
                disk_mib = max(4096, size * 2 + 1024)
                source = _ok(http.post("/v1/sandboxes", json={"shape": SHAPE, "disk_mib": disk_mib}))["id"]
                _sh(http, source, f"head -c {size}M /dev/urandom > /root/big.bin")
                expected = f"{size << 20}\n"
                for _ in range(rounds):
                    time.sleep(REFILL_S)
                    started = time.perf_counter()
                    snap = _ok(http.post(f"/v1/sandboxes/{source}/snapshots", json={}))
                    out["snapshot_api"].append((time.perf_counter() - started) * 1000)
                    out["snapshot_host"].append(_host_snapshot_ms(platform, snap["id"]))
                    time.sleep(REFILL_S)
                    started = time.perf_counter()
                    booted = _ok(http.post("/v1/sandboxes", json={"shape": SHAPE, "rootfs": snap["id"]}))
                    out["boot_api"].append((time.perf_counter() - started) * 1000)
                    assert booted["status"] == "running", booted
                    out["boot_spawn"].append(float(booted["spawn_ms"]))
                    assert _sh(http, booted["id"], "stat -c %s /root/big.bin") == expected
                    _destroy(http, booted["id"])
                    assert http.delete(f"/v1/snapshots/{snap['id']}").status_code == 200
                    time.sleep(REFILL_S)
                    started = time.perf_counter()
                    child = _ok(http.post(f"/v1/sandboxes/{source}/fork", json={}))
                    child = _wait_running(http, child["id"])
                    out["fork_api"].append((time.perf_counter() - started) * 1000)
                    out["fork_spawn"].append(float(child["spawn_ms"]))
                    assert _sh(http, child["id"], "stat -c %s /root/big.bin") == expected
                    _destroy(http, child["id"])
                _destroy(http, source)
                results[f"{size}MB"] = out
            for event in ("snapshot_boot_phases", "fork_phases"):
                results[f"phases (all sizes), {event}"] = _phases(platform, event)
    finally:
        try:
            if platform is not None:
                platform.stop()
        finally:
            shutil.rmtree(guest, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100", help="MB written before the snapshots, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", default="crun", choices=["crun", "runc"])
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    results = run(sizes, args.rounds, args.runtime)
    print(f"snapshots on {args.runtime}, {args.rounds} rounds (ms)")
    print(f"{'size':>8} {'step':>14} {'p50':>9} {'p90':>9} {'min':>9} {'max':>9}")
    for size, out in results.items():
        for step, values in out.items():
            s = summarize(values)
            print(f"{size:>8} {step:>14} {s['p50']:9.1f} {s['p90']:9.1f} {s['min']:9.1f} {s['max']:9.1f}")
    json.dump(results, sys.stderr)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
