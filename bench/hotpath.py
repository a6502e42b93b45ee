"""Steady-state latency of the hot requests, layer by layer, on one long-lived sandbox.

    .venv/bin/python -m bench.hotpath [--requests 500]

Starts a control plane and a host agent (``tests.live``), creates one sandbox and times, after a
warm-up, the same request at each layer: the guest agent's socket (what the host agent calls), the
host agent's internal HTTP API, its kept channel (what the control plane calls), the public API with plain httpx, and the
SDK; a pause + resume pair on the host agent and through the API; plus ``GET /v1/sandboxes/{id}`` and ``/healthz`` for the cost of an HTTP hop. ``make bench``
measures exec inside a full lifecycle round (after a 100 MB write, a fork and two destroys); this is
the number a long-running agent sees. Prints p50 / p90 in ms; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def timed(call: Callable[[], object], requests: int, warmup: int = 50) -> str:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return f"{samples[len(samples) // 2]:6.2f} / {samples[int(len(samples) * 0.9)]:6.2f}"


def channel_exec_ms(agent_url: str, token: str, sandbox_id: str, requests: int) -> str:
    """Exec through ``HostAgentClient`` (what the control plane calls): over the kept channel."""
    from paddock_hostagent.client import HostAgentClient

    async def run() -> list[float]:
        async with HostAgentClient(agent_url, token) as client:
            samples = []
            for index in range(requests + 50):
                started = time.perf_counter()
                result = await client.exec(sandbox_id, cmd="true", args=[], env={})
                if result.exit_code != 0:
                    raise RuntimeError(f"`true` exited {result.exit_code}")
                if index >= 50:
                    samples.append((time.perf_counter() - started) * 1000)
            if client.channel is None or not client.channel.is_open:
                raise RuntimeError("the kept channel was not used")
            return sorted(samples)

    samples = asyncio.run(run())
    return f"{samples[len(samples) // 2]:6.2f} / {samples[int(len(samples) * 0.9)]:6.2f}"


def pause_resume(http: httpx.Client, sandbox_path: str) -> None:
    """One pause and one resume; raises when either is refused, so a broken layer cannot look fast."""
    for action in ("pause", "resume"):
        http.post(f"{sandbox_path}/{action}").raise_for_status()


def guest_exec_ms(socket_path: Path, requests: int) -> str:
    from paddock_hostagent.guest.client import ExecRequest, GuestClient

    async def run() -> list[float]:
        guest = GuestClient(socket_path)
        samples = []
        for index in range(requests + 50):
            started = time.perf_counter()
            async with guest.exec(ExecRequest("true", [], {"PATH": "/usr/bin:/bin"})) as session:
                async for _ in session:
                    pass
            if index >= 50:
                samples.append((time.perf_counter() - started) * 1000)
        return sorted(samples)

    samples = asyncio.run(run())
    return f"{samples[len(samples) // 2]:6.2f} / {samples[int(len(samples) * 0.9)]:6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()

    from tests.hostagent.conftest import TOKEN
    from tests.live import start_platform

    from paddock import Client, RetryPolicy
    from paddock_hostagent.guest.build import ensure_agent_binary

    guest_dir = Path(tempfile.mkdtemp(prefix="pdkbench-guest-"))
    try:
        ensure_agent_binary(guest_dir)
        platform = start_platform(
            guest_dir,
            cp_env={"PADDOCK_CP_RECONCILE_INTERVAL_S": "1.0"},
            agent_options={"extra_env": {"PADDOCK_HOST_HEARTBEAT_INTERVAL_S": "2.0"}},
        )
        try:
            key = platform.api_key()
            agent = platform.agents[0]
            with (
                Client(platform.url, key, timeout=60, retry=RetryPolicy(max_retries=0)) as client,
                httpx.Client(base_url=platform.url, headers={"X-Api-Key": key}) as api,
                httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {TOKEN}"}) as internal,
            ):
                sandbox = client.sandboxes.create("s-1vcpu-256mb", rootfs="debian:13")
                try:
                    record = json.loads((agent.state_dir / "sandboxes" / f"{sandbox.id}.json").read_text())
                    socket_path = Path(record["driver_state"]["slot"]["dir"]) / "guest.sock"
                    body = {"cmd": "true", "args": [], "env": {}, "stream": False}
                    pairs = max(args.requests // 5, 20)
                    rows = [
                        ("exec `true`: guest agent socket", guest_exec_ms(socket_path, args.requests)),
                        (
                            "exec `true`: host agent internal API",
                            timed(
                                lambda: internal.post(f"/internal/v1/sandboxes/{sandbox.id}/exec", json=body),
                                args.requests,
                            ),
                        ),
                        (
                            "exec `true`: host agent kept channel",
                            channel_exec_ms(agent.url, TOKEN, sandbox.id, args.requests),
                        ),
                        (
                            "exec `true`: public API, httpx",
                            timed(
                                lambda: api.post(f"/v1/sandboxes/{sandbox.id}/exec", json={"cmd": "true"}),
                                args.requests,
                            ),
                        ),
                        ("exec `true`: SDK `sandbox.run`", timed(lambda: sandbox.run("true"), args.requests)),
                        (
                            "pause + resume: host agent internal API",
                            timed(
                                lambda: pause_resume(internal, f"/internal/v1/sandboxes/{sandbox.id}"), pairs
                            ),
                        ),
                        (
                            "pause + resume: public API, httpx",
                            timed(lambda: pause_resume(api, f"/v1/sandboxes/{sandbox.id}"), pairs),
                        ),
                        (
                            "GET /v1/sandboxes/{id}",
                            timed(lambda: api.get(f"/v1/sandboxes/{sandbox.id}"), args.requests),
                        ),
                        ("GET /healthz (one HTTP hop)", timed(lambda: api.get("/healthz"), args.requests)),
                    ]
                finally:
                    sandbox.destroy()
        finally:
            platform.stop()
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)
    print(f"\n{'request':<40} p50 / p90 ms ({args.requests} each, after 50 warm-up)")
    for label, value in rows:
        print(f"{label:<40} {value}")


if __name__ == "__main__":
    main()
