"""What each HTTP client stack in Paddock costs per request, so each keeps its place only by a number.

    .venv/bin/python -m bench.http_clients [--requests 2000] [--rounds 3]

A request crosses four stacks in this codebase (ARCHITECTURE.md, "HTTP stacks"):
- ``httpx``: the SDK's general path (streams, uploads, TLS, proxies), the CLI, tests;
- ``paddock._wire``: the SDK's direct path for plain JSON calls to an ``http://`` control plane;
- ``aiohttp``: the control plane's calls to host agents and webhook deliveries (and web3's provider);
- ``httptools``: the ingress proxy's HTTP/1.1 parser (server side; ``bench.ingress_bench`` measures it).

This section measures the three client stacks on the same request: ``GET /v1/sandboxes/{id}`` to the
floor server (``bench.floor_server``: bare Starlette on uvicorn answering a real sandbox view's bytes),
sequentially on one kept-alive connection, in this process. It reports the client's CPU per request
(``time.process_time``: the server runs in its own process, so this is the client's work alone) and the
wall p50. The floor is a raw socket sending the same request bytes and reading the answer to its
``Content-Length`` (what any HTTP/1.1 client must do); httpx is the peer. The stacks take turns, round
after round, so whatever else loads the box falls on all of them alike. Never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx

from bench.http_bench import free_port, wait_http
from bench.stats import percentile
from paddock._wire import AsyncWire, Wire, origin_for

#: A sandbox view as the control plane answers it (the size matters, not the values).
BODY = json.dumps(
    {
        "status": "success",
        "data": {
            "id": "sb_0123456789abcdef",
            "name": "bench",
            "status": "running",
            "shape": "s-1vcpu-1gb",
            "rootfs": "debian:13",
            "host_id": "host-1",
            "created_at": "2026-12-02T06:00:00Z",
            "envs": ["HOME"],
            "ingress": {"enabled": False, "url": None},
            "auto_pause_after_seconds": None,
            "networks": [],
            "disks": [],
        },
    }
)
PATH = "/v1/sandboxes/sb_0123456789abcdef"


class RawSocket:
    """The floor: the request's bytes once, and a read to the answer's ``Content-Length``."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.request = (
            f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\n\r\n".encode()
        )

    def get(self) -> bytes:
        self.sock.sendall(self.request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += self.sock.recv(65536)
        return body


Sync = Callable[[], object]
Async = Callable[[], Awaitable[object]]


def timed_sync(call: Sync, n: int) -> tuple[float, list[float]]:
    """CPU µs per request and the wall times in ms."""
    walls = []
    cpu0 = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        call()
        walls.append((time.perf_counter() - started) * 1000)
    return (time.process_time() - cpu0) / n * 1e6, walls


async def timed_async(call: Async, n: int) -> tuple[float, list[float]]:
    walls = []
    cpu0 = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        await call()
        walls.append((time.perf_counter() - started) * 1000)
    return (time.process_time() - cpu0) / n * 1e6, walls


def check(body: bytes | str) -> None:
    text = body.decode() if isinstance(body, bytes) else body
    if json.loads(text)["data"]["id"] != "sb_0123456789abcdef":
        raise RuntimeError(f"unexpected answer: {text[:200]}")


async def one_round(port: int, n: int, results: dict[str, list[tuple[float, list[float]]]]) -> None:
    base = f"http://127.0.0.1:{port}"
    origin = origin_for(base)
    assert origin is not None

    raw = RawSocket(port)
    check(raw.get())
    results.setdefault("raw socket (floor)", []).append(timed_sync(raw.get, n))
    raw.sock.close()

    with httpx.Client(base_url=base) as client:
        check(client.get(PATH).content)
        results.setdefault("httpx Client (peer)", []).append(timed_sync(lambda: client.get(PATH), n))

    wire = Wire(origin, {"Accept": "application/json"}, 30.0)
    check(wire.request("GET", PATH, {}).content)
    results.setdefault("paddock._wire Wire", []).append(timed_sync(lambda: wire.request("GET", PATH, {}), n))
    wire.close()

    async with httpx.AsyncClient(base_url=base) as aclient:
        check((await aclient.get(PATH)).content)
        results.setdefault("httpx AsyncClient", []).append(await timed_async(lambda: aclient.get(PATH), n))

    awire = AsyncWire(origin, {"Accept": "application/json"}, 30.0)
    check((await awire.request("GET", PATH, {})).content)
    results.setdefault("paddock._wire AsyncWire", []).append(
        await timed_async(lambda: awire.request("GET", PATH, {}), n)
    )
    await awire.aclose()

    async with aiohttp.ClientSession(base) as session:

        async def aio_get() -> bytes:
            async with session.get(PATH) as resp:
                return await resp.read()

        check(await aio_get())
        results.setdefault("aiohttp ClientSession", []).append(await timed_async(aio_get, n))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        bodies = Path(tmp) / "bodies.json"
        bodies.write_text(json.dumps({"sandbox": BODY}))
        server = subprocess.Popen([sys.executable, "-m", "bench.floor_server", str(port), str(bodies)])
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", server)
            results: dict[str, list[tuple[float, list[float]]]] = {}
            for _ in range(args.rounds):
                asyncio.run(one_round(port, args.requests, results))
        finally:
            server.terminate()
            server.wait(10)

    floor_cpu = min(cpu for cpu, _ in results["raw socket (floor)"])
    peer_cpu = min(cpu for cpu, _ in results["httpx Client (peer)"])
    print(
        f"{args.requests} sequential GETs × {args.rounds} rounds; client CPU per request is the best round's"
    )
    print(f"{'stack':28} {'CPU µs/req':>11} {'× floor':>8} {'× httpx':>8} {'wall p50 ms':>12} {'p90 ms':>8}")
    for name, rounds in results.items():
        cpu = min(c for c, _ in rounds)
        walls = [w for _, ws in rounds for w in ws]
        print(
            f"{name:28} {cpu:11.0f} {cpu / floor_cpu:8.1f} {cpu / peer_cpu:8.2f} "
            f"{percentile(walls, 50):12.3f} {percentile(walls, 90):8.3f}"
        )


if __name__ == "__main__":
    main()
