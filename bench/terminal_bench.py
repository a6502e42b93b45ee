"""Keystroke echo round trip: the WebSocket shell and the SSH gateway vs ``crun exec -t`` on the host.

    .venv/bin/python -m bench.terminal_bench [--keystrokes 300] [--json out.json]

One ``tests.live`` platform (control plane with the SSH gateway on 127.0.0.1, one crun host agent) and
one debian:13 sandbox. In each path ``cat`` runs on a PTY in the sandbox and one byte is written; the
time until that byte comes back (echoed by the sandbox's PTY) is one sample:

- ``shell-ws``: ``/v1/sandboxes/{id}/shell-ws`` with the ``websockets`` client (public API → host agent
  → guest agent, input as a request, output from the connect stream);
- ``ssh``: the gateway with asyncssh's client (``cat`` on a PTY, the same managed-process path);
- ``crun exec -t`` (the floor): ``crun exec -t <container> cat`` on a local pty, straight into the
  container's namespaces, no Paddock process in the path.

The three alternate keystroke by keystroke so they see the same load. Needs root. Never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import shutil
import subprocess
import sys
import time
import tty
from pathlib import Path
from typing import Any

import asyncssh
from websockets.asyncio.client import ClientConnection, connect

from bench.stats import summarize

REPO = Path(__file__).resolve().parent.parent
RUNTIME_ROOT = Path("/run/paddock/crun")  # the host agent's default runtime_root / runtime


async def _ws_until(ws: ClientConnection, needle: bytes) -> None:
    seen = b""
    while needle not in seen:
        message = await ws.recv()
        if isinstance(message, bytes):
            seen += message


async def _ssh_until(process: asyncssh.SSHClientProcess[bytes], needle: bytes) -> None:
    seen = b""
    while needle not in seen:
        seen += await process.stdout.read(4096)


def _pty_until(fd: int, needle: bytes, timeout_s: float = 10.0) -> None:
    seen, deadline = b"", time.monotonic() + timeout_s
    while needle not in seen:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no echo of {needle!r}: {seen[-200:]!r}")
        if select.select([fd], [], [], 0.5)[0]:
            seen += os.read(fd, 4096)


def _container_id(sandbox_id: str, agent_state_dir: Path) -> str:
    """The sandbox's crun container, as its host agent recorded it (a sandbox claimed from the warm
    pool runs in its slot's container, ``parked-<slot>``)."""
    record = json.loads((agent_state_dir / "sandboxes" / f"{sandbox_id}.json").read_text())
    container_id = str(record["driver_state"].get("container_id") or sandbox_id)
    listed = subprocess.run(
        ["crun", "--root", str(RUNTIME_ROOT), "list", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    if container_id not in listed:
        raise RuntimeError(f"no crun container {container_id} under {RUNTIME_ROOT}: {listed}")
    return container_id


async def measure(
    url: str,
    api_key: str,
    ssh_port: int,
    key: asyncssh.SSHKey,
    sandbox_id: str,
    n: int,
    agent_state_dir: Path,
) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"shell-ws": [], "ssh": [], "crun exec -t": []}
    ws_url = url.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox_id}/shell-ws"
    leader, follower = os.openpty()
    tty.setraw(follower)  # only the container's PTY echoes, not this one
    crun = subprocess.Popen(
        ["crun", "--root", str(RUNTIME_ROOT), "exec", "-t", _container_id(sandbox_id, agent_state_dir), "cat"],
        stdin=follower, stdout=follower, stderr=follower, start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    try:
        async with (
            connect(ws_url, additional_headers={"X-Api-Key": api_key}) as ws,
            asyncssh.connect(
                "127.0.0.1", ssh_port, username=sandbox_id, client_keys=[key], known_hosts=None
            ) as conn,
        ):
            await ws.send(b"exec cat\n")
            await _ws_until(ws, b"exec cat")
            process = await conn.create_process("cat", term_type="xterm", encoding=None)
            await asyncio.sleep(1.0)  # every cat is up
            for index in range(n + 20):
                byte = bytes([ord("a") + index % 26])
                started = time.perf_counter()
                await ws.send(byte)
                await _ws_until(ws, byte)
                ws_ms = (time.perf_counter() - started) * 1000
                started = time.perf_counter()
                process.stdin.write(byte)
                await _ssh_until(process, byte)
                ssh_ms = (time.perf_counter() - started) * 1000
                started = time.perf_counter()
                os.write(leader, byte)
                _pty_until(leader, byte)
                crun_ms = (time.perf_counter() - started) * 1000
                if index >= 20:  # the first keystrokes warm caches and connections
                    samples["shell-ws"].append(ws_ms)
                    samples["ssh"].append(ssh_ms)
                    samples["crun exec -t"].append(crun_ms)
            process.close()
    finally:
        crun.kill()
        crun.wait()
        os.close(leader)
    return {path: summarize(values) for path, values in samples.items()}


def render(results: dict[str, Any]) -> str:
    floor = results["crun exec -t"]["p50"]
    lines = ["| path | n | p50 ms | p90 ms | p99 ms | p50 vs crun exec -t |", "|---|---|---|---|---|---|"]
    for path, row in results.items():
        lines.append(
            f"| {path} | {row['n']} | {row['p50']:.2f} | {row['p90']:.2f} | {row['p99']:.2f} | "
            f"{row['p50'] - floor:+.2f} ms |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keystrokes", type=int, default=300, help="recorded keystrokes per path")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tests.hostagent.conftest import free_port, image_cache
    from tests.live import start_platform

    from paddock_hostagent.guest.build import ensure_agent_binary
    from paddock_hostagent.images import ImageStore

    ImageStore(image_cache()).build("debian:13")
    guest = Path(f"/tmp/pdkbench-guest-{os.getpid()}")
    guest.mkdir(exist_ok=True)
    try:
        ensure_agent_binary(guest)
        ssh_port = free_port()
        key = asyncssh.generate_private_key("ssh-ed25519")
        platform = start_platform(
            guest, cp_env={"PADDOCK_CP_SSH_PORT": str(ssh_port)}, agent_options={"runtime": "crun"}
        )
        try:
            api_key = platform.api_key()
            with platform.http(api_key, timeout=60) as http:
                body = {
                    "shape": "s-1vcpu-1gb",
                    "rootfs": "debian:13",
                    "ssh_pubkeys": [key.export_public_key().decode().strip()],
                }
                created = http.post("/v1/sandboxes", json=body)
                created.raise_for_status()
                sandbox_id = created.json()["data"]["id"]
                try:
                    results = asyncio.run(
                        measure(
                            platform.url,
                            api_key,
                            ssh_port,
                            key,
                            sandbox_id,
                            args.keystrokes,
                            platform.agents[0].state_dir,
                        )
                    )
                finally:
                    http.delete(f"/v1/sandboxes/{sandbox_id}")
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
