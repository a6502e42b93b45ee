"""What a local volume costs (issue #34, docs/volumes.md): making one, a create that mounts one against a
plain create, a live attach and detach, and writing to it against writing to the sandbox's own disk.

    .venv/bin/python -m bench.volumes_bench [--rounds 5] [--runtime crun] [--write-mb 200]

One ``tests.live`` platform (control plane + one host agent of ``runtime``), started here. Each round,
through the public API:

- ``volume_create``: ``POST /v1/volumes`` of 1 GiB answered (a sparse file and mkfs.xfs on the host);
- ``create_plain`` / ``create_with_volume``: ``POST /v1/sandboxes`` answered ``running``, without and with
  the volume mounted (the host's mount and its placement in the sandbox are inside the second);
- ``attach`` / ``detach``: ``POST`` and ``DELETE /v1/sandboxes/{id}/volumes`` on a running sandbox;
- ``write_volume_s`` / ``write_rootdisk_s``: ``dd`` of ``write-mb`` MB with ``conv=fsync`` in the sandbox,
  to the volume and to its own disk (seconds; a volume's flushes reach the host's disk, a root disk's
  are dropped: docs/volumes.md).

Needs root and the debian:13 image. Never fails on a time.
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


def _since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _dd_seconds(http: httpx.Client, sandbox_id: str, path: str, write_mb: int) -> float:
    script = f"s=$(date +%s%N); dd if=/dev/zero of={path} bs=1M count={write_mb} conv=fsync 2>/dev/null;"
    script += f" e=$(date +%s%N); rm -f {path}; echo $(( (e - s) / 1000000 ))"
    result = _ok(http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}))
    out = result["result"]
    assert out["exit_code"] == 0, out
    return float(out["stdout"]) / 1000


def run(rounds: int, runtime: str, write_mb: int) -> dict[str, list[float]]:
    guest = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    out: dict[str, list[float]] = {
        name: []
        for name in (
            "volume_create",
            "create_plain",
            "create_with_volume",
            "attach",
            "detach",
            "write_volume_s",
            "write_rootdisk_s",
        )
    }
    platform: LivePlatform | None = None
    try:
        ensure_agent_binary(guest)
        platform = start_platform(guest, agent_options={"runtime": runtime})
        with platform.http(platform.api_key("enterprise"), timeout=300) as http:
            for index in range(rounds):
                started = time.perf_counter()
                volume = _ok(http.post("/v1/volumes", json={"name": f"b{index}", "size_mib": 1024}))
                out["volume_create"].append(_since(started))
                time.sleep(REFILL_S)
                started = time.perf_counter()
                plain = _ok(http.post("/v1/sandboxes", json={"shape": SHAPE}))
                out["create_plain"].append(_since(started))
                time.sleep(REFILL_S)
                body = {"shape": SHAPE, "volumes": [{"volume_id": volume["id"], "mount_path": "/vol"}]}
                started = time.perf_counter()
                holder = _ok(http.post("/v1/sandboxes", json=body))
                out["create_with_volume"].append(_since(started))
                assert holder["status"] == "running", holder
                out["write_volume_s"].append(_dd_seconds(http, holder["id"], "/vol/dd.bin", write_mb))
                out["write_rootdisk_s"].append(_dd_seconds(http, holder["id"], "/root/dd.bin", write_mb))
                _ok(http.delete(f"/v1/sandboxes/{holder['id']}/volumes/{volume['id']}"))
                path = f"/v1/sandboxes/{plain['id']}/volumes"
                started = time.perf_counter()
                _ok(http.post(path, json={"volume_id": volume["id"], "mount_path": "/v"}))
                out["attach"].append(_since(started))
                started = time.perf_counter()
                _ok(http.delete(f"{path}/{volume['id']}"))
                out["detach"].append(_since(started))
                for sandbox_id in (plain["id"], holder["id"]):
                    _ok(http.delete(f"/v1/sandboxes/{sandbox_id}"))
                _ok(http.delete(f"/v1/volumes/{volume['id']}"))  # detached above: free at once
    finally:
        try:
            if platform is not None:
                platform.stop()
        finally:
            shutil.rmtree(guest, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", default="crun", choices=["crun", "runc"])
    parser.add_argument("--write-mb", type=int, default=200)
    args = parser.parse_args(argv)
    results = run(args.rounds, args.runtime, args.write_mb)
    print(
        f"volumes on {args.runtime}, {args.rounds} rounds (ms; write_* in s for {args.write_mb} MB with fsync)"
    )
    print(f"{'step':>20} {'p50':>9} {'p90':>9} {'min':>9} {'max':>9}")
    for step, values in results.items():
        s = summarize(values)
        print(f"{step:>20} {s['p50']:9.2f} {s['p90']:9.2f} {s['min']:9.2f} {s['max']:9.2f}")
    json.dump(results, sys.stderr)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
