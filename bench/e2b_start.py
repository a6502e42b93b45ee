"""What a template's start command costs an E2B create (docs/e2b.md, Start and ready commands).

    .venv/bin/python -m bench.e2b_start [--creates 8]

One ``tests.live`` platform with its E2B API (``bench.e2b.e2b_platform``) and two E2B templates built
in the run from ``base`` (devbox:1) by the unmodified SDK: ``plain``, with no commands, and ``web``,
whose start command is ``python3 -m http.server 8000`` with ``wait_for_port(8000)``. Timed, each create
``POOL_SETTLE_S`` after the one before, in turn:

- ``plain: create`` (the floor): ``Sandbox.create(plain)``, a create with nothing to start;
- ``web: create → page``: ``Sandbox.create(web)`` and one ``curl`` of its page, which answers at once;
- ``plain: create, start, poll → page`` (the peer: what a user does without a start command):
  ``Sandbox.create(plain)``, ``commands.run(server, background=True)``, then one command that polls
  the page every 20 ms until it answers;
- ``server alone``: in one running sandbox, the server's own time from its start to a listening port,
  timed inside the sandbox (``ss`` polled every 5 ms), the command's own floor.

``web ÷ plain`` is what the start command adds to a create; ``web ÷ by hand`` against doing it oneself.
Writes ``bench/results/e2b-start-<time>.json`` and ``.md``. Needs root. Never fails on a time.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from typing import Any

from bench.e2b import POOL_SETTLE_S, e2b_platform, finish, run_meta, timed
from bench.stats import summarize

SERVER = "python3 -m http.server 8000 --directory /srv/www"
PAGE = "curl -sf http://127.0.0.1:8000/index.html"
POLL = "until curl -sf -o /dev/null http://127.0.0.1:8000/index.html; do sleep 0.02; done"
#: The server's start-to-listening inside a sandbox, in microseconds, on a port of its own.
SERVER_ALONE = (
    "s=$(date +%s%N); python3 -m http.server 8001 >/dev/null 2>&1 & p=$!; "
    'until [ -n "$(ss -Htln sport = :8001)" ]; do sleep 0.005; done; '
    "e=$(date +%s%N); kill $p; wait $p 2>/dev/null; echo $(( (e - s) / 1000 ))"
)


def measure(creates: int) -> dict[str, list[float]]:
    import httpx

    from e2b import Sandbox, Template, wait_for_port

    samples: dict[str, list[float]] = {}
    suffix = secrets.token_hex(3)
    plain, web = f"bench-plain-{suffix}", f"bench-web-{suffix}"
    base = Template().from_base_image().run_cmd("mkdir -p /srv/www && echo served > /srv/www/index.html")
    Template.build(base, plain)
    Template.build(
        Template()
        .from_base_image()
        .run_cmd("mkdir -p /srv/www && echo served > /srv/www/index.html")
        .set_start_cmd(SERVER, wait_for_port(8000)),
        web,
    )
    try:
        for name in (plain, web):  # untimed: the first create of an image fills its pool
            Sandbox.create(name).kill()
        for _ in range(creates):
            time.sleep(POOL_SETTLE_S)
            box = timed(samples.setdefault("plain: create", []), lambda: Sandbox.create(plain))
            box.kill()

            time.sleep(POOL_SETTLE_S)
            started = time.perf_counter()
            box = Sandbox.create(web)
            assert box.commands.run(PAGE).stdout == "served\n"
            samples.setdefault("web: create → page", []).append((time.perf_counter() - started) * 1000)
            box.kill()

            time.sleep(POOL_SETTLE_S)
            started = time.perf_counter()
            box = Sandbox.create(plain)
            box.commands.run(SERVER, background=True)
            box.commands.run(POLL, timeout=30)
            samples.setdefault("plain: create, start, poll → page", []).append(
                (time.perf_counter() - started) * 1000
            )
            box.kill()
        box = Sandbox.create(plain)
        try:
            for _ in range(creates):
                micros = int(box.commands.run(SERVER_ALONE, timeout=30).stdout.strip())
                samples.setdefault("server alone (in the sandbox)", []).append(micros / 1000)
        finally:
            box.kill()
    finally:
        with httpx.Client(
            base_url=os.environ["E2B_API_URL"], headers={"X-API-Key": os.environ["E2B_API_KEY"]}
        ) as http:
            for name in (plain, web):
                http.delete(f"/templates/{name}")
    return samples


def render(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# A template's start command in an E2B create, {meta['at']}",
        "",
        f"- Git: `{meta['git']}`. Load average at start {meta['load_start']}, at end {meta['load_end']}.",
        "- Templates `plain` and `web` from `base` (devbox:1); `web` starts `python3 -m http.server` and is",
        "  ready on `wait_for_port(8000)`. **Absolute numbers are noisy** (a shared 2-vCPU VM).",
        "",
        "| row | p50 ms | p90 ms | n |",
        "|---|---|---|---|",
    ]
    for row, stats in results.items():
        lines.append(f"| {row} | {stats['p50']:.1f} | {stats['p90']:.1f} | {stats['n']} |")
    web = results["web: create → page"]["p50"]
    lines += [
        "",
        f"- web ÷ plain create (what the start command adds): {web / results['plain: create']['p50']:.2f}×",
        f"- web ÷ by hand (create, start, poll): {web / results['plain: create, start, poll → page']['p50']:.2f}×",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--creates", type=int, default=8, help="recorded creates of each kind")
    args = parser.parse_args(argv)
    meta = run_meta()
    with e2b_platform():
        samples = measure(args.creates)
    finish("e2b-start", meta, {row: summarize(values) for row, values in samples.items()}, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
