"""How long the ``paddock`` CLI takes to start, against the interpreter's own floor.

    .venv/bin/python -m bench.cli_startup [--runs 10]

Times, as whole processes (what a user waits for), ``paddock --help``, ``paddock admin --help`` and
``paddock sandbox ls --help``, next to the floor ``python -c pass``, a peer, ``python -c "import
httpx"`` (the HTTP client every client command needs once it talks to a server), and a two-command
typer app's ``--help`` (the CLI framework's own cost: typer, and rich to draw the help). The commands take
turns, run after run, so whatever else loads the box falls on all of them alike. Prints p50 / p90 in ms
and each command's p50 as a multiple of the floor's and of the peer's; never fails on a time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.stats import percentile

BIN = Path(sys.executable).parent

TYPER_APP = """
import typer
app = typer.Typer()
app.command()(lambda: None)
app.command("other")(lambda: None)
app()
"""

COMMANDS: dict[str, list[str]] = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    'python -c "import httpx" (peer)': [sys.executable, "-c", "import httpx"],
    "two-command typer app --help": [sys.executable, "-c", TYPER_APP, "--help"],
    "paddock --help": [str(BIN / "paddock"), "--help"],
    "paddock admin --help": [str(BIN / "paddock"), "admin", "--help"],
    "paddock sandbox ls --help": [str(BIN / "paddock"), "sandbox", "ls", "--help"],
}


def run_once(argv: list[str]) -> float:
    """Milliseconds from spawn to exit; the command must succeed."""
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


ENV = {**os.environ, "COLUMNS": "100"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="timed runs per command")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per command first")
    args = parser.parse_args()

    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for index in range(args.warmup + args.runs):
        for name, argv in COMMANDS.items():
            elapsed = run_once(argv)
            if index >= args.warmup:
                samples[name].append(elapsed)

    floor = percentile(samples["python -c pass (floor)"], 50)
    peer = percentile(samples['python -c "import httpx" (peer)'], 50)
    print(f"\n{'command':<34} {'p50 / p90 ms':>16} {'× floor':>8} {'× peer':>7}")
    for name, values in samples.items():
        p50 = percentile(values, 50)
        print(f"{name:<34} {p50:7.1f} / {percentile(values, 90):6.1f} {p50 / floor:7.2f}× {p50 / peer:6.2f}×")
    print(
        f"({args.runs} runs per command after {args.warmup} warm-up, taking turns; wall time of the process)"
    )


if __name__ == "__main__":
    main()
