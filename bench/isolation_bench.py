"""Isolation tiers side by side: what each tier costs through Paddock, and what its raw runtime costs.

    .venv/bin/python -m bench.isolation_bench [--runs 10] [--tiers crun,runc,gvisor] [--json FILE]

For each tier (``crun``, ``runc``: the container tier; ``gvisor``: runsc), one ``tests.live`` platform
whose host agent runs that runtime, driven through the SDK like a user: create → running, exec
round trip (``true``, after the first), pause, resume, fork → running, destroy. Beside it the floor of
the same runtime, raw: ``run -d`` of the image's rootfs read-only (``sleep infinity``), ``exec true``,
``pause``, ``resume``, ``delete -f`` (runsc with ``--network=none --ignore-cgroups`` and the platform the
agent chose; the raw runtime has no fork, so fork has no floor). ``× floor`` is Paddock's p50 over the
raw runtime's. The VM tier adds itself to ``TIERS``.

Needs root and the debian:13 image. Never fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.stats import summarize

#: Tier -> the host agent's runtime setting.
TIERS = {"crun": "crun", "runc": "runc", "gvisor": "runsc"}
OPS = ("create", "exec", "pause", "resume", "fork", "destroy")
SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048


def timed(samples: dict[str, list[float]], op: str, work: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    value = work()
    samples.setdefault(op, []).append((time.perf_counter() - started) * 1000)
    return value


# -- Paddock, through the SDK -----------------------------------------------------------------------


def paddock_rounds(runtime: str, runs: int, warmup: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    from tests.hostagent.conftest import TOKEN, image_cache
    from tests.live import start_platform

    from paddock import Client
    from paddock_hostagent.guest.build import ensure_agent_binary
    from paddock_hostagent.images import ImageStore

    ImageStore(image_cache()).build("debian:13")
    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    try:
        ensure_agent_binary(guest_dir)
        platform = start_platform(guest_dir, agent_options={"runtime": runtime, "pool_size": 2})
    except BaseException:
        shutil.rmtree(guest_dir, ignore_errors=True)
        raise
    samples: dict[str, list[float]] = {}
    try:
        agent = platform.agents[0]
        info = httpx.get(agent.url + "/internal/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        key = platform.api_key(plan="enterprise", credits=1_000_000)
        with Client(platform.url, key, timeout=300) as client:
            for index in range(warmup + runs):
                into = samples if index >= warmup else {}
                box = timed(
                    into,
                    "create",
                    lambda: client.sandboxes.create(SHAPE, rootfs="debian:13", disk_mib=DISK_MIB),
                )
                try:
                    box.run("true")  # the first command of a sandbox is apart (connections, caches)
                    for _ in range(3):
                        result = timed(into, "exec", lambda b=box: b.run("true"))
                        assert result.exit_code == 0, result
                    timed(into, "pause", box.pause)
                    timed(into, "resume", box.resume)
                    child = timed(into, "fork", box.fork)
                    child.destroy(wait=True)
                finally:
                    timed(into, "destroy", lambda b=box: b.destroy(wait=True))
        return samples, {"runtime": info.get("runtime"), "labels": host_labels(platform.url, key)}
    finally:
        try:
            platform.stop()
        finally:
            shutil.rmtree(guest_dir, ignore_errors=True)


def host_labels(url: str, key: str) -> dict[str, str]:
    listed = httpx.get(url + "/v1/hosts", headers={"X-Api-Key": key}).json()["data"]
    hosts = listed.get("data", []) if isinstance(listed, dict) else listed
    return dict(hosts[0].get("labels", {})) if hosts else {}


# -- the floor: the raw runtime ---------------------------------------------------------------------


def raw_rounds(runtime: str, rootfs: Path, runs: int, warmup: int) -> dict[str, list[float]]:
    binary = shutil.which(runtime)
    if binary is None:
        return {}
    bundle = Path(tempfile.mkdtemp(prefix=f"pdkbench-iso-{runtime}-", dir="/var/tmp"))
    root = f"/run/pdkbench-iso-{os.getpid()}-{runtime}"
    subprocess.run([binary, "spec", "--bundle", str(bundle)], check=True, capture_output=True, cwd=bundle)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(rootfs), "readonly": True}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["sleep", "infinity"]
    (bundle / "config.json").write_text(json.dumps(config))
    base = [binary, "--root", root]
    run = ["run", "-d", "-b", str(bundle)]
    if runtime == "crun":
        base.append("--cgroup-manager=cgroupfs")
    if runtime == "runsc":
        base += [f"--platform={runsc_platform()}", "--network=none", "--ignore-cgroups"]
        run = ["run", "--detach", "--bundle", str(bundle)]
    samples: dict[str, list[float]] = {}
    # A file, not a pipe: a detached container inherits the runtime's stdio, and a pipe never closes.
    errors = open(bundle / "errors.log", "w+b")  # noqa: SIM115

    def call(into: dict[str, list[float]], op: str, argv: list[str]) -> None:
        def work() -> None:
            done = subprocess.run(
                [*base, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors
            )
            if done.returncode != 0:
                errors.seek(0)
                raise RuntimeError(f"{runtime} {argv[0]}: {errors.read().decode(errors='replace')[-300:]}")

        timed(into, op, work)

    try:
        for index in range(warmup + runs):
            into = samples if index >= warmup else {}
            name = f"pdkbench-iso-{os.getpid()}-{index}"
            try:
                call(into, "create", [*run, name])
                call({}, "exec", ["exec", name, "true"])
                for _ in range(3):
                    call(into, "exec", ["exec", name, "true"])
                call(into, "pause", ["pause", name])
                call(into, "resume", ["resume", name])
            finally:
                call(into, "destroy", ["delete", "--force" if runtime == "runsc" else "-f", name])
    finally:
        errors.close()
        shutil.rmtree(bundle, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return samples


def runsc_platform() -> str:
    from paddock_hostagent.host import choose_runsc_platform

    return choose_runsc_platform(os.environ.get("PADDOCK_HOST_RUNSC_PLATFORM", "auto"))


# -- the run ---------------------------------------------------------------------------------------


def run(runs: int, warmup: int, tiers: list[str] | None = None) -> dict[str, Any]:
    from tests.hostagent.conftest import image_cache

    from paddock_hostagent.images import ImageStore

    rootfs = ImageStore(image_cache()).build("debian:13")
    out: dict[str, Any] = {"runs": runs, "tiers": {}, "errors": {}}
    for tier in tiers or list(TIERS):
        runtime = TIERS[tier]
        if shutil.which(runtime) is None:
            out["errors"][tier] = f"{runtime} is not installed"
            continue
        print(f"isolation bench: {tier} …", file=sys.stderr, flush=True)
        try:
            paddock, facts = paddock_rounds(runtime, runs, warmup)
            floor = raw_rounds(runtime, rootfs, runs, warmup)
        except Exception as exc:  # one tier that cannot run must not hide the others
            out["errors"][tier] = repr(exc)
            continue
        out["tiers"][tier] = {
            "runtime": runtime,
            "labels": facts["labels"],
            "paddock": {op: summarize(samples) for op, samples in paddock.items()},
            "floor": {op: summarize(samples) for op, samples in floor.items()},
        }
    return out


def measure(runs: int, warmup: int) -> dict[str, Any]:
    """``run`` for bench/run.py: a tier that could not run fails the section (the others' numbers are in
    the message)."""
    result = run(runs, warmup)
    if result["errors"]:
        raise RuntimeError(f"isolation tiers failed: {result['errors']}\n{markdown(result)}")
    return result


def p50(stats: dict[str, Any] | None) -> float | None:
    if not stats or not stats.get("n"):
        return None
    return float(stats["p50"])


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "## Isolation tiers: Paddock per tier against its raw runtime, same run",
        "",
        f"{result['runs']} recorded rounds per tier; p50 in ms; exec is a `true` round trip after the first;",
        "the floor is the raw runtime (`run -d` of the image read-only, `exec`, `pause`, `resume`, `delete -f`).",
        "",
        "| tier | operation | Paddock p50 | raw runtime p50 | × floor |",
        "|---|---|---|---|---|",
    ]
    for tier, data in result["tiers"].items():
        for op in OPS:
            ours, floor = p50(data["paddock"].get(op)), p50(data["floor"].get(op))
            if ours is None:
                continue
            floor_text = f"{floor:.1f}" if floor is not None else "– (no raw fork)"
            ratio = f"{ours / floor:.1f}×" if floor else "–"
            lines.append(f"| {tier} ({data['runtime']}) | {op} | {ours:.1f} | {floor_text} | {ratio} |")
    if result["errors"]:
        lines += [
            "",
            "Tiers that could not run: " + "; ".join(f"{t}: {e}" for t, e in result["errors"].items()),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--tiers", help="comma-separated: " + ",".join(TIERS))
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("isolation bench needs root (sandboxes, cgroups, mounts)", file=sys.stderr)
        return 2
    tiers = [t.strip() for t in args.tiers.split(",")] if args.tiers else None
    result = run(args.runs, args.warmup, tiers)
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
