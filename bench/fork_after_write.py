"""The FIRST fork after a write (issue #36), through the API, on a quiet box or beside a neighbour.

``python -m bench.fork_after_write [--runs N] [--neighbour] [--out DIR]`` starts a control plane and a
host agent as ``bench.run`` does (its warm pool of 2), then times fork → running through the SDK, each
fork the first one after what its source just did (never a settled one), the cases alternating run
after run so that a change of load on the shared box does not pass for a difference between them:

- ``synced_<big>`` / ``synced_<small>``: the source just wrote ``big`` (1 GiB) / ``small`` (10 MiB) of
  random data and synced its filesystem (``sync -f``: a plain ``sync`` is ``sync(2)``, which writes back
  every filesystem of the host, the disk store included); their ratio is the issue's
  ``fork(1 GiB) / fork(10 MiB)``;
- ``fresh_<mib>``: the source just wrote 100 MiB without ``sync``;
- ``files_<n>``: the source just created 20,000 empty files; ``files_<n>_after_2s``: the same,
  forked 2 s later (XFS's log worker, each second on an agent's host, has written them home by then);
- ``settled_<mib>``: the bench's settled sources (``bench.lifecycle.fork_scale``): 100 MiB and 2 GiB
  written and synced once, forked once untimed first.

``--neighbour``: another sandbox writes its own disk at full speed the whole time (``dd`` of 1 GiB
with ``oflag=direct`` in a loop); its throughput is reported. The floor, measured in the same run and
the same disk store: ``FICLONE`` of a file that was just written (``big`` MiB, buffered, so its pages
are dirty in the store as the image's are after the sandbox's ``sync``), and ``sync -f`` + ``FICLONE``.
The agent's ``fork_phases`` (p50 per case) say where each case's time went, and ``outside`` what each
fork took beyond them (the control plane, both HTTP hops, the agent around its driver, the SDK's wait
for ``running``). Results:
``bench/results/fork-after-write-<stamp>[-neighbour].{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import machine
from bench import platform as bench_platform
from bench.lifecycle import SHAPE, BenchError, PaddockLifecycle
from bench.stats import summarize

RESULTS = Path(__file__).resolve().parent / "results"
POOL_SIZE = 2
BIG_MIB, SMALL_MIB, FRESH_MIB, FRESH_FILES = 1024, 10, 100, 20_000
FILES_PAUSE_S = 2  # the pause before the later fork of a source that created FRESH_FILES
SETTLED_MIB = (100, 2048)
DISK_MIB = 4096  # every source's disk: room for the 2 GiB settled file, and for 1 GiB rewritten
FICLONE = 0x40049409
NEIGHBOUR = (
    "while :; do dd if=/dev/zero of=/root/big bs=1M count=1024 oflag=direct conv=notrunc 2>>/root/dd.log;"
    " done"
)


class ForkAfterWrite:
    def __init__(self, driver: PaddockLifecycle, log_path: Path, store: Path | None) -> None:
        self.driver = driver
        self.log_path = log_path
        self.store = store
        self.samples = driver.samples
        self.phases: dict[str, list[dict[str, float]]] = {}
        self.sources: list[Any] = []

    def source(self, name: str) -> Any:
        self.driver.wait_pool()
        sandbox = self.driver.running(
            self.driver.client.sandboxes.create(SHAPE, name=name, rootfs="debian:13", disk_mib=DISK_MIB)
        )
        self.sources.append(sandbox)
        return sandbox

    def shell(self, sandbox: Any, script: str) -> None:
        result = sandbox.run("sh", ["-c", script], timeout_s=600)
        if result.exit_code != 0:
            raise BenchError(f"paddock: `{script}` exited {result.exit_code}: {result.stderr[-300:]}")

    def fork(self, sandbox: Any, label: str | None, path: str, size_bytes: int) -> None:
        """One fork → running, the agent's ``fork_phases`` line for it kept under ``label``; checked
        to hold ``path`` at ``size_bytes`` and destroyed, untimed."""
        self.driver.wait_pool()
        log_at = self.log_path.stat().st_size
        started = time.perf_counter()
        child = self.driver.running(sandbox.fork())
        elapsed_ms = (time.perf_counter() - started) * 1000
        try:
            held = child.run("stat", ["-c", "%s", path]).stdout.strip()
            if held != str(size_bytes):
                raise BenchError(f"paddock: the fork holds {held!r} bytes of {path}, not {size_bytes}")
        finally:
            self.driver.destroy(child)
        if label is None:
            return
        self.samples.add(label, elapsed_ms)
        with open(self.log_path, "rb") as log:
            log.seek(log_at)
            for line in log.read().decode(errors="replace").splitlines():
                if '"fork_phases"' in line:
                    event = json.loads(line)
                    phases = {k.removesuffix("_ms"): float(v) for k, v in event.items() if k.endswith("_ms")}
                    # What the fork took outside the driver's steps: the control plane, both HTTP hops,
                    # the agent around its driver, and the SDK's wait for ``running``.
                    phases["outside"] = round(elapsed_ms - sum(phases.values()), 3)
                    self.phases.setdefault(label, []).append(phases)

    def floor(self, label: str, mib: int, *, sync_first: bool) -> None:
        """``FICLONE`` (after ``sync -f`` when ``sync_first``) of a file of the store just written."""
        assert self.store is not None
        work = Path(tempfile.mkdtemp(prefix=".bench-floor-", dir=self.store))
        try:
            source, target = work / "source.img", work / "target.img"
            chunk = os.urandom(1 << 20)
            with open(source, "wb") as out:
                for _ in range(mib):
                    out.write(chunk)
            started = time.perf_counter()
            if sync_first:
                subprocess.run(["sync", "-f", str(source)], check=True)
            with open(source, "rb") as src, open(target, "wb") as dst:
                fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
            self.samples.add(label, (time.perf_counter() - started) * 1000)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def run(self, runs: int) -> None:
        writer = self.source("faw-writer")
        # Its own source: the XFS log of one that just unlinked 20,000 files would make the next
        # case's fork freeze it (``QUIESCE_REPLAY_BB``) for a reason that is not that case's.
        filer = self.source("faw-files")
        later = self.source("faw-files-later")  # the same, forked a little later: its own, for that reason
        for size in SETTLED_MIB:
            settled = self.source(f"faw-settled-{size}")
            self.shell(settled, f"head -c {size}M /dev/urandom > /root/fill && sync")
            self.fork(settled, None, "/root/fill", size << 20)  # the settled rows fork it once first
            setattr(self, f"settled_{size}", settled)
        for index in range(runs):
            print(f"bench: fork-after-write run {index + 1}/{runs}", file=sys.stderr, flush=True)
            for mib in (BIG_MIB, SMALL_MIB):
                self.shell(
                    writer, f"rm -f /root/w && head -c {mib}M /dev/urandom > /root/w && sync -f /root/w"
                )
                self.fork(writer, f"synced_{mib}", "/root/w", mib << 20)
            self.shell(writer, f"rm -f /root/w && head -c {FRESH_MIB}M /dev/urandom > /root/w")
            self.fork(writer, f"fresh_{FRESH_MIB}", "/root/w", FRESH_MIB << 20)
            where = f"/root/files-{index}"
            make_files = f"mkdir {where} && cd {where} && seq -f f%g {FRESH_FILES} | xargs touch"
            self.shell(filer, make_files)
            self.fork(filer, f"files_{FRESH_FILES}", f"{where}/f{FRESH_FILES}", 0)
            self.shell(filer, f"rm -rf {where}")
            # The same, forked a little later, as a user forks after an install rather than during it.
            self.shell(later, make_files)
            time.sleep(FILES_PAUSE_S)
            self.fork(later, f"files_{FRESH_FILES}_after_{FILES_PAUSE_S}s", f"{where}/f{FRESH_FILES}", 0)
            self.shell(later, f"rm -rf {where}")
            for size in SETTLED_MIB:
                self.fork(getattr(self, f"settled_{size}"), f"settled_{size}", "/root/fill", size << 20)
            if self.store is not None:
                self.floor(f"floor_clone_{BIG_MIB}", BIG_MIB, sync_first=False)
                self.floor(f"floor_sync_clone_{BIG_MIB}", BIG_MIB, sync_first=True)

    def close(self) -> None:
        for sandbox in self.sources:
            self.driver.destroy(sandbox)


def measure(runs: int, neighbour: bool) -> dict[str, Any]:
    from tests.hostagent.conftest import TOKEN, image_cache

    from paddock_hostagent.guest.build import ensure_agent_binary
    from paddock_hostagent.images import ImageStore

    ImageStore(image_cache()).build("debian:13")
    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    result: dict[str, Any] = {
        "runs": runs,
        "neighbour": neighbour,
        "load_average_start": machine.load_average(),
    }
    try:
        ensure_agent_binary(guest_dir)
        platform = bench_platform.start(guest_dir, pool_size=POOL_SIZE)
        try:
            agent = platform.agents[0]
            key = platform.api_key(plan="enterprise", credits=1_000_000)
            driver = PaddockLifecycle(platform.url, key, agent.url, TOKEN, POOL_SIZE)
            store = agent.state_dir / "disks"
            bench = ForkAfterWrite(driver, agent.log_path, store if store.is_dir() else None)
            try:
                noisy = None
                if neighbour:
                    noisy = bench.source("faw-neighbour")
                    noisy.run_background("sh", ["-c", NEIGHBOUR])
                    time.sleep(3)  # its writeback under way
                bench.run(runs)
                if noisy is not None:
                    dd_log = noisy.run("tail", ["-n", "40", "/root/dd.log"]).stdout
                    rates = [
                        line.rsplit(",", 1)[-1].strip() for line in dd_log.splitlines() if "copied" in line
                    ]
                    result["neighbour_dd_rates"] = rates[-10:]
            finally:
                bench.close()
                driver.close()
            result["forks"] = {label: summarize(values) for label, values in bench.samples.values.items()}
            result["phases_p50"] = {
                label: {
                    step: summarize([event.get(step, 0.0) for event in events])["p50"]
                    for step in sorted({step for event in events for step in event})
                }
                for label, events in bench.phases.items()
            }
            # Each fork's, in order: a p50 hides which forks froze their source or replayed a log.
            result["phases"] = bench.phases
        finally:
            platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)
    result["load_average_end"] = machine.load_average()
    big, small = result["forks"].get(f"synced_{BIG_MIB}"), result["forks"].get(f"synced_{SMALL_MIB}")
    if big and small:
        result["ratio_synced_big_over_small_p50"] = round(big["p50"] / small["p50"], 2)
    return result


def measured(runs: int, neighbour: bool) -> dict[str, Any]:
    """``measure`` with when and at which commit it ran (what ``markdown`` heads its table with)."""
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"started_at": started, "git": machine.git_sha(), **measure(runs, neighbour)}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# First fork after a write, {'beside a neighbour writing' if result['neighbour'] else 'quiet'}",
        "",
        f"git {result['git']}, {result['started_at']}, {result['runs']} runs, load average "
        f"{result['load_average_start']} at the start, {result['load_average_end']} at the end",
        "",
        "| case | p50 ms | p90 ms | min | max |",
        "|---|---|---|---|---|",
    ]
    for label, stats in result["forks"].items():
        lines.append(
            f"| {label} | {stats['p50']:.1f} | {stats['p90']:.1f} | {stats['min']:.1f} | {stats['max']:.1f} |"
        )
    if "ratio_synced_big_over_small_p50" in result:
        lines += [
            "",
            f"fork({BIG_MIB} MiB) / fork({SMALL_MIB} MiB), synced, p50: {result['ratio_synced_big_over_small_p50']}",
        ]
    if result.get("neighbour_dd_rates"):
        lines += ["", f"neighbour's dd, last rounds: {', '.join(result['neighbour_dd_rates'])}"]
    lines += [
        "",
        "Agent `fork_phases`, p50 ms per step (`outside`: the fork's time outside them, through the API):",
        "",
    ]
    steps = sorted({step for phases in result["phases_p50"].values() for step in phases})
    lines += ["| case | " + " | ".join(steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for label, phases in result["phases_p50"].items():
        lines.append(f"| {label} | " + " | ".join(f"{phases.get(step, 0):.1f}" for step in steps) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="forks per case (default 10)")
    parser.add_argument("--neighbour", action="store_true", help="beside a sandbox writing its disk flat out")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default bench/results)")
    parser.add_argument("--tag", default="", help="a word added to the results' name (e.g. before/after)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench needs root (namespaces, cgroups, mounts)", file=sys.stderr)
        return 2
    result = measured(args.runs, args.neighbour)
    stem = "fork-after-write-" + result["started_at"].replace(":", "").replace("-", "")
    stem += "-neighbour" if args.neighbour else "-quiet"
    stem += f"-{args.tag}" if args.tag else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    text = markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    print(f"bench: wrote {args.out / stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
