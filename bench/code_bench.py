"""What ``sandbox.run_code`` costs: a ``1+1`` cell round trip vs exec of ``python3 -c``, with the floor.

    .venv/bin/python -m bench.code_bench [--runs 50] [--kernel-starts 5] [--json out.json]

One ``tests.live`` platform (control plane and one host agent as processes), one running
``code-interpreter:1`` sandbox (shape s-1vcpu-1gb), measured from the host through the sync SDK,
the three operations alternated round by round so they see the same load:

- ``exec true`` — the floor: one exec round trip (SDK → control plane → host agent → guest) and back;
- ``exec python3 -c 'print(1+1)'`` — a fresh interpreter per call, no state kept;
- ``run_code('1+1')`` on a warm kernel — one exec of the driver's client (``python3 -S``, built-in
  modules only), which hands the cell to the sandbox's kernel server over a unix socket: one execute
  round trip to the kernel, its output streamed back; state kept.

Then ``--kernel-starts`` first calls to fresh contexts (each starts its IPython kernel). Prints a
Markdown table with p50/p90 per operation in ms. Needs root and the code-interpreter:1 image (built on
first use, ~75 s). Never fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import summarize

REPO = Path(__file__).resolve().parent.parent
ROOTFS = "code-interpreter:1"


def measure(sandbox: Any, runs: int, kernel_starts: int) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[float]] = {"exec true": [], "exec python3 -c": [], "run_code 1+1": []}
    operations = {
        "exec true": lambda: sandbox.run("true"),
        "exec python3 -c": lambda: sandbox.run("python3", ["-c", "print(1+1)"]),
        "run_code 1+1": lambda: sandbox.run_code("1+1"),
    }
    first = sandbox.run_code("1+1")  # ships the driver and starts the default kernel: not recorded
    assert first.text == "2", first
    for _ in range(runs):
        for name, operation in operations.items():
            started = time.perf_counter()
            outcome = operation()
            samples[name].append((time.perf_counter() - started) * 1000)
            assert outcome.ok, outcome
    starts: list[float] = []
    for index in range(kernel_starts):
        started = time.perf_counter()
        outcome = sandbox.run_code("1+1", context=f"bench-start-{index}")
        starts.append((time.perf_counter() - started) * 1000)
        assert outcome.kernel_started and outcome.text == "2", outcome
    results = {name: summarize(values) for name, values in samples.items()}
    results["run_code 1+1, kernel start"] = summarize(starts)
    return results


def render(results: dict[str, dict[str, Any]]) -> str:
    floor = results["exec true"]["p50"]
    lines = [
        "| operation | n | p50 ms | p90 ms | p50 − floor ms |",
        "|---|---|---|---|---|",
    ]
    for name, stats in results.items():
        lines.append(
            f"| {name} | {stats['n']} | {stats['p50']:.1f} | {stats['p90']:.1f} | {stats['p50'] - floor:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50, help="recorded rounds of the three operations")
    parser.add_argument("--kernel-starts", type=int, default=5, help="first calls to fresh contexts")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    # The live platform lives in the test tree, importable once the repository root is on the path.
    sys.path.insert(0, str(REPO))
    from tests.hostagent.conftest import image_cache
    from tests.live import start_platform

    import paddock
    from paddock_hostagent.guest.build import ensure_agent_binary
    from paddock_hostagent.images import ImageStore

    ImageStore(image_cache()).build(ROOTFS)
    guest = Path(f"/tmp/pdkbench-guest-{os.getpid()}")
    guest.mkdir(exist_ok=True)
    try:
        ensure_agent_binary(guest)
        platform = start_platform(guest)
        try:
            with (
                paddock.Client(platform.url, platform.api_key()) as client,
                client.sandboxes.create("s-1vcpu-1gb", rootfs=ROOTFS) as sandbox,
            ):
                results = measure(sandbox, args.runs, args.kernel_starts)
        finally:
            platform.stop()
    finally:
        shutil.rmtree(guest, ignore_errors=True)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
