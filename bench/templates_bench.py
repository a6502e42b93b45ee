"""What templates cost: a Dockerfile build through the API against ``podman build`` of the same
Dockerfile in the same run, the cached rebuild, and create → running from a template against debian:13.

    .venv/bin/python -m bench.templates_bench [--rounds 2] [--boots 5]

One ``tests.live`` platform (control plane + one host agent with buildah), started here. Per round:

- build: ``POST /v1/templates`` until ``ready`` (wall time through the API: submit, the worker's claim,
  buildah bud with RUN steps under crun in the build netns, the export to a rootfs, the log records),
  split into phases by the build log's timestamps (``PHASES``). Each round's Dockerfile starts with a
  fresh ``RUN echo <nonce>``, so nothing is cached; one uncounted warm-up build first imports the base
  into buildah (once per host), as podman's import is outside its timings;
- floor: ``podman build`` (from Debian, storage in a temporary root) of the same Dockerfile from the
  same debian:13 tree imported once, ``--network host`` (no namespace to prepare: a lower bound);
- a new account's first build: the round's Dockerfile with another nonce, by an account that never
  built here (its builder store is made for it; the base is read from the host's catalog store);
- cached: the round's Dockerfile submitted again under another name (every step from the layer cache);
- create → running: ``POST /v1/sandboxes`` with ``rootfs`` = the template, and with ``debian:13``.

RUN steps fetch from the Debian archive (apt-get). Needs root, buildah, podman and the debian:13 image.
Prints the table and writes it, with the samples, the ratio to podman and the load before and after, to
``bench/results/templates-<time>.md`` and ``.json``. Never fails on a time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from tests.hostagent.conftest import image_cache
from tests.live import LivePlatform, start_platform

from bench.stats import summarize
from paddock_hostagent.guest.build import ensure_agent_binary

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = "s-1vcpu-1gb"
BODY = (
    "RUN apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*\n"
    "WORKDIR /srv/app\n"
    "RUN echo built > /srv/app/marker.txt\n"
)


def dockerfile(base: str, nonce: str) -> str:
    return f"FROM {base}\nRUN echo {nonce}\n{BODY}"


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()["data"]


#: Where a build's time goes, from its log frames' timestamps: (phase, line that starts it). A phase
#: ends where the next one starts; ``record`` ends when the API first answers ``ready``.
PHASES = (
    ("queue", None),  # submit → the worker's attempt starts on the host
    ("base+netns", "attempt "),  # the FROM image offered to buildah (imported once per host), netns
    ("buildah bud", "buildah bud:"),
    ("export", "exporting the image"),
    ("record", "ready in "),
)


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _phases(http: httpx.Client, template_id: str, submitted: float, ended: float) -> dict[str, float]:
    frames = [json.loads(line) for line in http.get(f"/v1/templates/{template_id}/logs").text.splitlines()]
    marks = [submitted]
    for _, prefix in PHASES[1:]:
        hit = next((f for f in frames if str(f.get("line", "")).startswith(prefix or "")), None)
        marks.append(_ts(hit["ts"]) if hit else marks[-1])
    marks.append(ended)
    return {name: max(marks[i + 1] - marks[i], 0.0) for i, (name, _) in enumerate(PHASES)}


def _build(http: httpx.Client, name: str, text: str) -> tuple[float, str, dict[str, float]]:
    started = time.perf_counter()
    submitted = time.time()
    template = _ok(http.post("/v1/templates", json={"name": name, "dockerfile": text}))
    deadline = time.monotonic() + 900
    while True:  # ends: ready, or the assertions
        status = _ok(http.get(f"/v1/templates/{template['id']}"))["status"]
        if status != "pending" and status != "building":
            assert status == "ready", http.get(f"/v1/templates/{template['id']}/logs").text[-3000:]
            took, ended = time.perf_counter() - started, time.time()
            return took, str(template["id"]), _phases(http, str(template["id"]), submitted, ended)
        assert time.monotonic() < deadline, "build still running after 900 s"
        time.sleep(0.05)


def _boot_ms(http: httpx.Client, rootfs: str) -> float:
    started = time.perf_counter()
    sandbox = _ok(http.post("/v1/sandboxes", json={"shape": SHAPE, "rootfs": rootfs, "disk_mib": 2048}))
    took = (time.perf_counter() - started) * 1000
    assert sandbox["status"] == "running", sandbox
    _ok(http.delete(f"/v1/sandboxes/{sandbox['id']}"))
    return took


class Podman:
    """``podman`` with its own storage under a temporary root, removed afterwards."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pdkbench-podman-"))

    def __call__(self, *args: str, stdin: bytes | None = None) -> None:
        argv = ["podman", "--root", str(self.root / "storage"), "--runroot", str(self.root / "run"), *args]
        done = subprocess.run(argv, input=stdin, capture_output=True, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]

    def import_tree(self, tree: Path, tag: str) -> None:
        tar = subprocess.run(["tar", "-C", str(tree), "-c", "."], capture_output=True, check=True).stdout
        self("import", "-", tag, stdin=tar)

    def build(self, text: str) -> float:
        context = Path(tempfile.mkdtemp(prefix="pdkbench-ctx-"))
        try:
            (context / "Dockerfile").write_text(text)
            started = time.perf_counter()
            self("build", "--isolation", "oci", "--network", "host", "--pull-never", "-q", str(context))
            return time.perf_counter() - started
        finally:
            shutil.rmtree(context, ignore_errors=True)

    def close(self) -> None:
        with contextlib.suppress(AssertionError):
            self("rmi", "--all", "--force")
        storage = str(self.root)
        mounted = [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(storage)
        ]
        for point in sorted(mounted, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def run(rounds: int, boots: int) -> dict[str, list[float]]:
    guest = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    out: dict[str, list[float]] = {
        "build": [],
        "podman": [],
        "new_account": [],
        "cached": [],
        "boot_tpl": [],
        "boot_debian": [],
    }
    out.update({f"phase {name}": [] for name, _ in PHASES})
    out.update({f"cached phase {name}": [] for name, _ in PHASES})
    podman = Podman()
    platform: LivePlatform | None = None
    try:
        ensure_agent_binary(guest)
        platform = start_platform(guest)
        podman.import_tree(image_cache() / "debian_13" / "rootfs", "localhost/bench/debian13:latest")
        with platform.http(platform.api_key("pro"), timeout=900) as http:
            # Warm-up, not counted: the base goes into buildah once per host, as podman's import above
            # is once per run and outside its timings.
            _, warm, _ = _build(http, "bench-warm-up", "FROM debian:13\nRUN true\n")
            _ok(http.delete(f"/v1/templates/{warm}"))
            template_id = ""
            for index in range(rounds):
                nonce = secrets.token_hex(6)
                took, template_id, phases = _build(http, f"bench-{index}", dockerfile("debian:13", nonce))
                out["build"].append(took)
                for name, value in phases.items():
                    out[f"phase {name}"].append(value)
                out["podman"].append(podman.build(dockerfile("localhost/bench/debian13:latest", nonce)))
                # An account that never built on this host: its store is new (made, mounted), and the
                # base comes from the host's catalog store (drivers/build/basestore.py).
                with platform.http(platform.api_key("pro"), timeout=900) as newcomer:
                    took, first, _ = _build(
                        newcomer, f"bench-{index}-new-account", dockerfile("debian:13", secrets.token_hex(6))
                    )
                    out["new_account"].append(took)
                    _ok(newcomer.delete(f"/v1/templates/{first}"))
                took, again, phases = _build(http, f"bench-{index}-again", dockerfile("debian:13", nonce))
                out["cached"].append(took)
                for name, value in phases.items():
                    out[f"cached phase {name}"].append(value)
                _ok(http.delete(f"/v1/templates/{again}"))
            _boot_ms(http, template_id)  # first boots pay the page cache; not counted
            _boot_ms(http, "debian:13")
            for _ in range(boots):  # interleaved, so drift hits both alike
                out["boot_tpl"].append(_boot_ms(http, template_id))
                out["boot_debian"].append(_boot_ms(http, "debian:13"))
            for item in _ok(http.get("/v1/templates"))["data"]:
                _ok(http.delete(f"/v1/templates/{item['id']}"))
    finally:
        try:
            if platform is not None:
                platform.stop()
        except AssertionError as leftover:  # reported, and the numbers are still printed
            print(f"warning: teardown: {leftover}", file=sys.stderr)
        finally:
            try:
                podman.close()
            finally:
                shutil.rmtree(guest, ignore_errors=True)
    return out


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def table(results: dict[str, list[float]]) -> list[str]:
    lines = [f"{'operation':40s} {'p50':>9s} {'min':>9s} {'max':>9s} {'unit':>5s} {'n':>3s}"]

    def row(label: str, values: list[float], unit: str) -> None:
        stats = summarize(values)
        lines.append(
            f"{label:40s} {stats['p50']:9.2f} {stats['min']:9.2f} {stats['max']:9.2f} {unit:>5s} {stats['n']:3d}"
        )

    row("template build via API (no cache)", results["build"], "s")
    for name, _ in PHASES:
        row(f"  {name}", results[f"phase {name}"], "s")
    row("floor: podman build, same Dockerfile", results["podman"], "s")
    if results.get("new_account"):  # not in results from before the row was added
        row("a new account's first build (no cache)", results["new_account"], "s")
    row("template rebuild via API (cached)", results["cached"], "s")
    for name, _ in PHASES:
        row(f"  {name}", results[f"cached phase {name}"], "s")
    row("create -> running from the template", results["boot_tpl"], "ms")
    row("create -> running from debian:13", results["boot_debian"], "ms")
    build, podman = summarize(results["build"])["p50"], summarize(results["podman"])["p50"]
    lines.append(f"build ÷ podman build (p50): {build / podman:.2f}×")
    if results.get("new_account"):
        first = summarize(results["new_account"])["p50"]
        lines.append(f"a new account's first build ÷ podman build (p50): {first / podman:.2f}×")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--boots", type=int, default=5)
    args = parser.parse_args(argv)
    started, load_before = dt.datetime.now(dt.UTC), _load()
    results = run(args.rounds, args.boots)
    lines = table(results)
    print("\n".join(lines))
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    command = f"python -m bench.templates_bench --rounds {args.rounds} --boots {args.boots}"
    meta = {"started_at": started.isoformat(), "command": command, "load_before": load_before,
            "load_after": _load(), "cpus": os.cpu_count()}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"templates-{stamp}.json").write_text(json.dumps({"meta": meta, "samples": results}, indent=1))
    (RESULTS / f"templates-{stamp}.md").write_text(
        f"# Template builds, {meta['started_at']}\n\n`{command}`; {meta['cpus']} CPUs, load (1/5/15 min) "
        f"{load_before} before and {meta['load_after']} after.\n\n```\n" + "\n".join(lines) + "\n```\n"
    )
    print(f"written: bench/results/templates-{stamp}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
