"""The control plane's request latency with Prometheus metrics on and off, in one run (issue 35's goal:
at most 3% more at p50).

    .venv/bin/python -m bench.metrics_bench [--requests 2000]

Starts a platform (``tests.live``: a control plane and a host agent), creates one sandbox, then starts
two more control planes on the platform's database, identical but for ``PADDOCK_METRICS``: one with
the metrics on, one with ``PADDOCK_METRICS=0`` (no middleware, no ``/metrics``; checked). Their own
background work is off (reconciler at an hour, no webhook or template workers), so both serve only
the bench. Requests go one at a time, alternating between the two (on, off, off, on, on, off …), so
whatever else loads the box falls on both alike: an authenticated read that goes through FastAPI's routing
(``GET /v1/whoami``) and one the fast lane answers (``GET /v1/sandboxes/{id}``). Prints p50 / p99 per
side and the ratio on/off; never fails on a time.

On a loaded box the two sides' p50 still differ by a few percent either way from run to run, more than
the middleware costs; so it also prints that cost alone, measured in process and free of the network:
the mean time of a request to a bare Starlette route through the ASGI stack with and without
``MetricsMiddleware``, alternated in blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from bench.stats import percentile


def middleware_cost_us(requests: int = 20_000, blocks: int = 6) -> tuple[float, float]:
    """Mean µs per request of a bare Starlette route, without and with the metrics middleware."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from paddock_core import metrics

    async def thing(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    def app(on: bool) -> Starlette:
        built = Starlette(routes=[Route("/v1/things/{thing_id}", thing)])
        if on:
            metrics.install(built, metrics.ServiceMetrics("bench"))
        return built

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/things/abc",
        "headers": [],
        "query_string": b"",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "scheme": "http",
        "root_path": "",
        "http_version": "1.1",
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: object) -> None:
        return None

    async def run() -> tuple[float, float]:
        apps = {False: app(False), True: app(True)}
        totals = {False: 0.0, True: 0.0}
        for block in range(blocks + 1):
            for on, asgi in apps.items():
                started = time.perf_counter()
                for _ in range(requests // blocks):
                    await asgi(dict(scope), receive, send)
                if block:  # the first block warms up
                    totals[on] += time.perf_counter() - started
        count = (requests // blocks) * blocks
        return totals[False] / count * 1e6, totals[True] / count * 1e6

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="timed requests per route and side")
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()

    from tests.live import ControlPlaneProcess, start_platform

    from paddock_hostagent.guest.build import ensure_agent_binary

    routes = ("GET /v1/whoami", "GET /v1/sandboxes/{id} (fast lane)")
    samples: dict[tuple[str, str], list[float]] = {
        (side, route): [] for side in ("on", "off") for route in routes
    }
    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    try:
        ensure_agent_binary(guest_dir)
        platform = start_platform(guest_dir)
        sides: dict[str, ControlPlaneProcess] = {}
        try:
            key = platform.api_key()
            with httpx.Client(base_url=platform.url, headers={"X-API-Key": key}, timeout=60) as api:
                created = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})
                assert created.status_code == 200, created.text
                sandbox_id = created.json()["data"]["id"]
                try:
                    for side, switch in (("on", "1"), ("off", "0")):
                        sides[side] = ControlPlaneProcess(
                            state_dir=Path(tempfile.mkdtemp(prefix=f"pdkbench-cp-{side}-")),
                            extra_env={
                                "PADDOCK_METRICS": switch,
                                "PADDOCK_CP_DATABASE_URL": platform.controlplane.database_url,
                                "PADDOCK_CP_RECONCILE_INTERVAL_S": "3600",
                                "PADDOCK_CP_WEBHOOK_WORKER_ENABLED": "false",
                                "PADDOCK_CP_TEMPLATE_WORKER_ENABLED": "false",
                            },
                        )
                        sides[side].start()
                    clients = {
                        side: httpx.Client(base_url=process.url, headers={"X-API-Key": key}, timeout=60)
                        for side, process in sides.items()
                    }
                    try:
                        assert clients["on"].get("/metrics").status_code == 200
                        assert clients["off"].get("/metrics").status_code == 404
                        for route, path in zip(
                            routes, ("/v1/whoami", f"/v1/sandboxes/{sandbox_id}"), strict=True
                        ):
                            for index in range(args.warmup + args.requests):
                                pair = ("on", "off") if index % 2 == 0 else ("off", "on")
                                for side in pair:  # each side first in every other pair
                                    http = clients[side]
                                    started = time.perf_counter()
                                    response = http.get(path)
                                    elapsed = (time.perf_counter() - started) * 1000
                                    assert response.status_code == 200, response.text
                                    if index >= args.warmup:
                                        samples[(side, route)].append(elapsed)
                    finally:
                        for http in clients.values():
                            http.close()
                finally:
                    api.delete(f"/v1/sandboxes/{sandbox_id}")
        finally:
            for process in sides.values():
                process.stop()
                process.remove()
            platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)

    print(f"\n{'request':<38} {'metrics on p50/p99':>20} {'off p50/p99':>16} {'on/off p50':>11}")
    for route in routes:
        on, off = samples[("on", route)], samples[("off", route)]
        ratio = percentile(on, 50) / percentile(off, 50)
        print(
            f"{route:<38} {percentile(on, 50):9.3f} / {percentile(on, 99):7.3f} "
            f"{percentile(off, 50):7.3f} / {percentile(off, 99):6.3f} {ratio:10.3f}×"
        )
    print(f"({args.requests} requests per route and side after {args.warmup} warm-up, alternated; ms)")
    off_us, on_us = middleware_cost_us()
    print(
        f"the middleware alone, in process: {off_us:.1f} µs → {on_us:.1f} µs per request (+{on_us - off_us:.1f} µs)"
    )


if __name__ == "__main__":
    main()
