"""A volume's files without a sandbox (docs/volumes.md): what one call costs.

    .venv/bin/python -m bench.volume_files [--runs 20]

One platform (a control plane and a host agent, production intervals), one 1 GiB volume, through the
SDK (``client.volumes.files(...)``):

- a 1-byte read and a 4 KiB write while **no sandbox holds the volume**: the first call of a burst
  (``cold``: the host mounts the volume, timed after the mount of the call before has gone) and the
  calls that follow it (the host keeps the volume mounted ``volume_linger_s`` after each call);
- the same while **a sandbox holds it** (the call works on the host's mount of it);
- the floors, in the same run: ``exec true`` in that sandbox (a host call of the same path, no volume
  work) and, for the peer, ``sandbox.files`` reading and writing the same sizes on the volume's mount
  inside the sandbox (what a user without this API would do).

Prints a table and writes ``bench/results/volume-files-<stamp>.json``. Never fails on a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paddock
from bench import machine
from bench import platform as bench_platform
from bench.stats import summarize
from paddock_hostagent.guest.build import ensure_agent_binary
from paddock_hostagent.settings import HostAgentSettings

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = "s-1vcpu-256mb"
#: The host agent's default ``volume_linger_s``: how long a file call's mount outlives it.
LINGER_S = HostAgentSettings.model_fields["volume_linger_s"].default


def timed(runs: int, call: Callable[[int], Any]) -> dict[str, Any]:
    return timed_after(runs, lambda index: None, call)


def timed_after(runs: int, before: Callable[[int], Any], call: Callable[[int], Any]) -> dict[str, Any]:
    """``call`` timed ``runs`` times, each after an untimed ``before``."""
    times = []
    for index in range(runs):
        before(index)
        started = time.perf_counter()
        call(index)
        times.append((time.perf_counter() - started) * 1000)
    return summarize(times)


def unmounted(mount_dir: Path, within_s: float) -> None:
    """Waits until nothing is mounted at ``mount_dir`` (the linger of the call before has ended)."""
    deadline = time.monotonic() + within_s
    mountinfo = Path("/proc/self/mountinfo")
    while any(line.split()[4] == str(mount_dir) for line in mountinfo.read_text().splitlines()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{mount_dir} is still mounted after {within_s} s")
        time.sleep(0.05)


def measure(client: paddock.Client, runs: int, volumes_dir: Path) -> dict[str, Any]:
    volume = client.volumes.create("bench-files", 1024)
    try:
        files = client.volumes.files("bench-files")
        files.write("/one.txt", "x")
        block = b"y" * 4096
        mount_dir = volumes_dir / volume.id / "mnt"
        cold_runs = max(3, runs // 4)  # each waits out a linger

        out: dict[str, Any] = {
            "unheld_read_cold": timed_after(
                cold_runs, lambda i: unmounted(mount_dir, LINGER_S + 10), lambda i: files.read("/one.txt")
            ),
            "unheld_write_cold": timed_after(
                cold_runs,
                lambda i: unmounted(mount_dir, LINGER_S + 10),
                lambda i: files.write(f"/c{i}.bin", block),
            ),
            "unheld_read_burst": timed(runs, lambda i: files.read("/one.txt")),
            "unheld_write_burst": timed(runs, lambda i: files.write(f"/u{i}.bin", block)),
        }
        sandbox = client.sandboxes.create(SHAPE, volumes=[{"volume_id": "bench-files", "mount_path": "/v"}])
        try:
            out["held_read"] = timed(runs, lambda i: files.read("/one.txt"))
            out["held_write"] = timed(runs, lambda i: files.write(f"/h{i}.bin", block))
            out["floor_exec_true"] = timed(runs, lambda i: sandbox.run("true"))
            out["peer_sandbox_read"] = timed(runs, lambda i: sandbox.files.read("/v/one.txt"))
            out["peer_sandbox_write"] = timed(runs, lambda i: sandbox.files.write(f"/v/s{i}.bin", block))
        finally:
            sandbox.destroy(wait=True)
        return out
    finally:
        client.volumes.delete("bench-files")


def markdown(meta: dict[str, Any], result: dict[str, Any]) -> str:
    floor = result["floor_exec_true"]["p50"]
    lines = [
        "# A volume's files without a sandbox",
        "",
        f"`{meta['command']}` at {meta['git_sha']}; load {meta['load_before']} → {meta['load_after']}.",
        "",
        "| call | p50 ms | p90 ms | ÷ exec true |",
        "|---|---|---|---|",
    ]
    for name, stats in result.items():
        lines.append(f"| {name} | {stats['p50']:.1f} | {stats['p90']:.1f} | {stats['p50'] / floor:.2f}× |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    ensure_agent_binary(guest_dir)
    load_before = machine.load_average()
    live = bench_platform.start(guest_dir, pool_size=2)
    try:
        with paddock.Client(api_key=live.api_key(), base_url=live.url) as client:
            result = measure(client, args.runs, live.agents[0].state_dir / "volumes")
    finally:
        live.stop()
        shutil.rmtree(guest_dir, ignore_errors=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    meta = {
        "stamp": stamp,
        "command": f"python -m bench.volume_files --runs {args.runs}",
        "load_before": load_before,
        "load_after": machine.load_average(),
        **machine.facts(),
    }
    text = markdown(meta, result)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"volume-files-{stamp}.json").write_text(
        json.dumps({"meta": meta, "results": result}, indent=1)
    )
    (RESULTS / f"volume-files-{stamp}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
