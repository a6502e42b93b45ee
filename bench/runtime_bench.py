"""Sandbox lifecycle latency through the host agent's HTTP API, against raw OCI runtimes in the same run.

    sudo .venv/bin/python -m bench.runtime_bench                    # 20 rounds, the agent's default runtime
    sudo .venv/bin/python -m bench.runtime_bench --rounds 50 --runtime runc

Rows (milliseconds, p50 / p90):
- paddock: a host agent process on 127.0.0.1, driven by ``HostAgentClient`` (what the control plane uses):
  create -> running (guest agent answering), exec ``true`` (buffered round trip), pause, resume,
  fork (running source), destroy. Before each create and fork the warm pool is allowed to refill,
  untimed, as it would between requests on a live host; exec, pause and resume are measured after the
  refill has finished too.
- raw runc / raw crun: ``run -d`` of ``sleep infinity`` on the same image (read-only rootfs, no overlay,
  no network namespace setup), ``exec true``, ``pause``, ``resume``, ``delete -f``: the floor.

Needs root and the debian:13 image (built on first use). Prints a table; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import httpx

from paddock_hostagent.client import HostAgentClient
from paddock_hostagent.images import ImageStore
from paddock_hostagent.schemas import CreateSandboxBody, ForkBody

TOKEN = "bench-host-token-0123456789"
DISK_MIB = 2048


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):7.1f} / {percentile(values, 0.9):7.1f}"


# -- the floor: raw OCI runtimes --------------------------------------------------------------------


def raw_runtime_rounds(runtime: str, rootfs: Path, rounds: int) -> dict[str, list[float]]:
    binary = shutil.which(runtime)
    if binary is None:
        return {}
    bundle = Path(tempfile.mkdtemp(prefix=f"bench-{runtime}-"))
    subprocess.run([binary, "spec", "--bundle", str(bundle)], check=True, capture_output=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(rootfs), "readonly": True}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["sleep", "infinity"]
    (bundle / "config.json").write_text(json.dumps(config))
    base = [binary, "--root", f"/run/paddock-bench/{runtime}"]
    if runtime == "crun":
        base.append("--cgroup-manager=cgroupfs")
    timings: dict[str, list[float]] = {op: [] for op in ("create", "exec", "pause", "resume", "destroy")}

    errors = open(bundle / "errors.log", "w+b")  # noqa: SIM115 - not a pipe: a detached container inherits it

    def timed(op: str, argv: list[str]) -> None:
        started = time.perf_counter()
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors)
        timings[op].append((time.perf_counter() - started) * 1000)
        if result.returncode != 0:
            errors.seek(0)
            raise RuntimeError(
                f"{' '.join(argv[-3:])}: {errors.read().decode(errors='replace').strip()[-300:]}"
            )

    try:
        for index in range(rounds):
            name = f"bench-{runtime}-{os.getpid()}-{index}"
            try:
                timed("create", [*base, "run", "-d", "-b", str(bundle), name])
                timed("exec", [*base, "exec", name, "true"])
                timed("pause", [*base, "pause", name])
                timed("resume", [*base, "resume", name])
            finally:
                timed("destroy", [*base, "delete", "-f", name])
    except RuntimeError as exc:
        print(f"raw {runtime} failed: {exc}", file=sys.stderr)
    finally:
        errors.close()
        shutil.rmtree(bundle, ignore_errors=True)
    return timings


# -- the host agent ----------------------------------------------------------------------------------


def start_agent(
    state_dir: Path, image_dir: Path, runtime: str, pool_size: int
) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_HOST_TOKEN": TOKEN,
            "PADDOCK_HOST_PORT": str(port),
            "PADDOCK_HOST_STATE_DIR": str(state_dir),
            "PADDOCK_HOST_IMAGE_DIR": str(image_dir),
            "PADDOCK_HOST_RUNTIME": runtime,
            "PADDOCK_HOST_POOL_SIZE": str(pool_size),
            "PADDOCK_HOST_POOL_DISK_MIB": str(DISK_MIB),
            "PADDOCK_HOST_SUBNET": f"10.253.{os.getpid() % 250}.0/24",
            "PADDOCK_HOST_NFT_TABLE": f"pdkbench{os.getpid()}",
            "PADDOCK_HOST_LOG_LEVEL": "warning",
        }
    )
    log = open(state_dir.parent / "agent.log", "ab")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "paddock_hostagent.main"], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("host agent did not start; see " + str(state_dir.parent / "agent.log"))


async def wait_pool(host: HostAgentClient, pool_size: int) -> None:
    for _ in range(600):
        if (await host.info()).warm_slots >= pool_size:
            return
        await asyncio.sleep(0.05)


async def agent_rounds(
    url: str, rounds: int, pool_size: int, execs: int
) -> tuple[dict[str, list[float]], str]:
    ops = ("http floor", "create", "exec", "pause", "resume", "fork", "destroy")
    timings: dict[str, list[float]] = {op: [] for op in ops}

    async def timed(op: str, work: Awaitable[object]) -> object:
        started = time.perf_counter()
        result = await work
        timings[op].append((time.perf_counter() - started) * 1000)
        return result

    async with HostAgentClient(url, TOKEN) as host:
        runtime = (await host.info()).runtime
        spec = {"rootfs": "debian:13", "vcpu": 1, "mem_mib": 512, "cpu_quota_pct": None, "disk_mib": DISK_MIB}
        for index in range(rounds):
            parent, child = f"sb-bench-{index}", f"sb-bench-{index}-fork"
            await wait_pool(host, pool_size)
            await timed(
                "create", host.create_sandbox(CreateSandboxBody(id=parent, name=f"bench-{index}", **spec))
            )
            try:
                await wait_pool(host, pool_size)  # measure the rest on a quiet host, not during a refill
                for _ in range(execs):
                    await timed("http floor", host._http.get(url + "/healthz"))
                    await timed("exec", host.exec(parent, cmd="true", args=[], env={}))
                await timed("pause", host.pause_sandbox(parent))
                await timed("resume", host.resume_sandbox(parent))
                await wait_pool(host, pool_size)
                await timed(
                    "fork", host.fork_sandbox(parent, ForkBody(new_id=child, name="fork", start_paused=False))
                )
            finally:
                await timed("destroy", host.destroy_sandbox(child))
                await timed("destroy", host.destroy_sandbox(parent))
    return timings, runtime


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--execs", type=int, default=10, help="exec round trips per round")
    parser.add_argument("--runtime", default="auto", choices=["auto", "crun", "runc"])
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument(
        "--image-dir",
        type=Path,
        default=Path(os.environ.get("PADDOCK_HOST_IMAGE_DIR", "/var/lib/paddock/images")),
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("runtime_bench needs root", file=sys.stderr)
        return 2

    rootfs = ImageStore(args.image_dir).build("debian:13")
    floors = {runtime: raw_runtime_rounds(runtime, rootfs, args.rounds) for runtime in ("runc", "crun")}

    work_dir = Path(tempfile.mkdtemp(prefix="pdkbench-"))
    process, url = start_agent(work_dir / "state", args.image_dir, args.runtime, args.pool_size)
    try:
        timings, runtime = asyncio.run(agent_rounds(url, args.rounds, args.pool_size, args.execs))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        subprocess.run(["nft", "delete", "table", "ip", f"pdkbench{os.getpid()}"], capture_output=True)
        subprocess.run(["nft", "delete", "table", "ip", f"pdkbench{os.getpid()}_egress"], capture_output=True)
        shutil.rmtree(work_dir, ignore_errors=True)

    print(f"\nhost agent on {runtime}, {args.rounds} rounds, {args.execs} execs per round; ms p50 / p90")
    header = f"{'operation':<10} {'paddock':>17} {'raw runc':>17} {'raw crun':>17}"
    print(header)
    print("-" * len(header))
    for op in ("http floor", "create", "exec", "pause", "resume", "fork", "destroy"):
        row = [summary(timings.get(op, []))] + [summary(floors[r].get(op, [])) for r in ("runc", "crun")]
        print(f"{op:<10} {row[0]:>17} {row[1]:>17} {row[2]:>17}")
    print(
        "\nhttp floor: GET /healthz from the same client, the round trip every API call pays."
        "\nraw runtimes: no overlay, no netns, no guest agent; exec is `<runtime> exec`, pause is `<runtime> pause`."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
