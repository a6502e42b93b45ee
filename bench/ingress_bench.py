"""What the ingress proxy adds: the same request to an app in a sandbox, direct vs through the proxy.

    .venv/bin/python -m bench.ingress_bench [--requests 500] [--transfer-mib 256]

One ``tests.live`` platform (control plane with the ingress listener on 127.0.0.1, one host agent), one
running sandbox with ingress on, ``tests/network/sandbox_app.pl`` listening on port 8000 inside it.
Measured from the host, alternating the two paths request by request so both see the same load:

- ``GET /hello`` on one kept-alive connection (the proxy's steady state: route cached, upstream
  connection reused) — floor: the same request to ``<sandbox ip>:8000`` directly;
- ``GET /hello`` on a new connection each time (``Connection: close``) — the proxy also dials the
  sandbox for each;
- a download (``GET /zeros``) and an upload (``POST /sink``) of ``--transfer-mib`` MiB (MiB/s), streamed
  through (the app in perl is part of both paths' cost).

The client is a minimal blocking socket client (no HTTP library overhead in the numbers). Added latency
is p50(proxy) − p50(direct). Needs root and the debian:13 image. Never fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import summarize

REPO = Path(__file__).resolve().parent.parent


def _recv_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside the body")
        body += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head[:200]!r}")
    return body


def _request(host: str, *, close: bool = False) -> bytes:
    return (
        f"GET /hello HTTP/1.1\r\nHost: {host}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    ).encode()


def measure(
    direct: tuple[str, int], proxy: tuple[str, int], ingress_host: str, requests: int, transfer_mib: int
) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[float]] = {}

    def add(op: str, ms: float) -> None:
        samples.setdefault(op, []).append(ms)

    paths = {"direct": (direct, f"{direct[0]}:{direct[1]}"), "proxy": (proxy, ingress_host)}
    kept = {name: socket.create_connection(address) for name, (address, _) in paths.items()}
    try:
        for sock in kept.values():
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for warmup in (True, False):
            for _ in range(20 if warmup else requests):
                for name, (_, host) in paths.items():
                    started = time.perf_counter()
                    kept[name].sendall(_request(host))
                    _recv_response(kept[name])
                    if not warmup:
                        add(f"keep-alive GET, {name}", (time.perf_counter() - started) * 1000)
        for _ in range(max(50, requests // 4)):
            for name, (address, host) in paths.items():
                started = time.perf_counter()
                with socket.create_connection(address) as sock:
                    sock.sendall(_request(host, close=True))
                    _recv_response(sock)
                add(f"new connection GET, {name}", (time.perf_counter() - started) * 1000)
    finally:
        for sock in kept.values():
            sock.close()
    results = {op: summarize(values) for op, values in samples.items()}
    block = os.urandom(1 << 20)
    for name, (address, host) in paths.items():
        with socket.create_connection(address) as sock:
            started = time.perf_counter()
            sock.sendall(f"GET /zeros?mib={transfer_mib} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            received = _count_body(sock)
            seconds = time.perf_counter() - started
        assert received == transfer_mib << 20, received
        results[f"download {transfer_mib} MiB, {name}"] = {"mib_per_s": transfer_mib / seconds}
        with socket.create_connection(address) as sock:
            started = time.perf_counter()
            sock.sendall(
                f"POST /sink HTTP/1.1\r\nHost: {host}\r\nContent-Length: {transfer_mib << 20}\r\n\r\n".encode()
            )
            for _ in range(transfer_mib):
                sock.sendall(block)
            answer = _recv_response(sock)
            seconds = time.perf_counter() - started
        assert answer == f"bytes={transfer_mib << 20}\n".encode(), answer
        results[f"upload {transfer_mib} MiB, {name}"] = {"mib_per_s": transfer_mib / seconds}
    return results


def _count_body(sock: socket.socket) -> int:
    """Reads a Content-Length response and returns the body length, without keeping the bytes."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.partition(b":")[2])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    received = len(rest)
    while received < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        received += len(chunk)
    return received


def render(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| operation | n | p50 ms | p90 ms | p99 ms | MiB/s |", "|---|---|---|---|---|---|"]
    for op, row in results.items():
        if "mib_per_s" in row:
            lines.append(f"| {op} | | | | | {row['mib_per_s']:.0f} |")
        else:
            lines.append(f"| {op} | {row['n']} | {row['p50']:.3f} | {row['p90']:.3f} | {row['p99']:.3f} | |")
    lines.append("")
    for kind in ("keep-alive GET", "new connection GET"):
        added = results[f"{kind}, proxy"]["p50"] - results[f"{kind}, direct"]["p50"]
        lines.append(f"added by the proxy, {kind}: p50 {added:+.3f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=500, help="recorded keep-alive requests per path")
    parser.add_argument("--transfer-mib", type=int, default=256, help="size of the download and upload")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tests.hostagent.conftest import image_cache
    from tests.network.ingress_support import (
        APP_PORT,
        create_sandbox,
        ingress_host,
        start_app,
        start_ingress_platform,
    )

    from paddock_hostagent.guest.build import ensure_agent_binary
    from paddock_hostagent.images import ImageStore

    ImageStore(image_cache()).build("debian:13")
    guest = Path(f"/tmp/pdkbench-guest-{os.getpid()}")
    guest.mkdir(exist_ok=True)
    try:
        ensure_agent_binary(guest)
        platform, proxy_port = start_ingress_platform(guest)  # default log level: one line per request
        try:
            with platform.http(platform.api_key()) as http:
                sandbox = create_sandbox(http, ingress_enabled=True)
                start_app(http, sandbox["id"])
                results = measure(
                    (sandbox["ip"], APP_PORT),
                    ("127.0.0.1", proxy_port),
                    f"{ingress_host(sandbox['id'])}:{proxy_port}",
                    args.requests,
                    args.transfer_mib,
                )
                http.delete(f"/v1/sandboxes/{sandbox['id']}")
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
