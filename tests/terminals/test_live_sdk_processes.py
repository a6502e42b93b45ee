"""``sandbox.processes`` in the SDK (async source and generated sync twin) against a live platform."""

from __future__ import annotations

import asyncio

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = pytest.mark.root
SHAPE = "s-1vcpu-1gb"


async def test_async_processes_pty_input_resize_reconnect_and_wait(live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, rootfs="debian:13") as sb,
    ):
        proc = await sb.processes.start(pty=(24, 80))
        assert isinstance(proc, paddock.ManagedProcess) and proc.kind == "pty" and proc.cmd == "bash"
        await sb.processes.send_input(proc.process_id, "stty size; echo sdk-$((3*3))\n")
        seen, last_seq = b"", 0
        async with asyncio.timeout(15):
            async for frame in sb.processes.connect(proc.process_id):
                if frame["type"] == "data":
                    seen += frame["data"]
                    last_seq = frame["seq"]
                    if b"sdk-9" in seen:
                        break
        assert b"24 80" in seen
        resized = await sb.processes.resize(proc.process_id, 30, 120)
        assert resized.output["newest_seq"] >= last_seq
        await sb.processes.send_input(proc.process_id, "stty size\n")
        later = b""
        async with asyncio.timeout(15):
            async for frame in sb.processes.connect(proc.process_id, after=last_seq):
                if frame["type"] == "data":
                    later += frame["data"]
                    if b"30 120" in later:
                        break
        assert b"sdk-9" not in later  # only what came after last_seq
        assert proc.process_id in [p.process_id for p in await sb.processes.list()]
        sleeper = await sb.processes.start("sleep", ["100"])
        await sb.processes.signal(sleeper.process_id, "SIGTERM")
        done = await sb.processes.wait(sleeper.process_id, timeout_ms=10000)
        assert done.signal == "SIGTERM" and done.exit_code == 143
        await sb.processes.kill(proc.process_id, grace_ms=500)
        ended = await sb.processes.wait(proc.process_id, scope="tree", timeout_ms=10000)
        assert ended.tree_exited


def test_sync_processes_stdin_and_exit_code(live: LivePlatform) -> None:
    with (
        paddock.Client(live.url, live.api_key()) as client,
        client.sandboxes.create(SHAPE, rootfs="debian:13") as sb,
    ):
        cat = sb.processes.start("bash", ["-c", "cat; exit 6"], cwd="/tmp")
        assert sb.processes.send_input(cat.process_id, b"line\n") == 1
        sb.processes.close_stdin(cat.process_id)
        done = sb.processes.wait(cat.process_id, timeout_ms=10000)
        assert done.exit_code == 6 and done.cwd == "/tmp"
        frames = list(sb.processes.connect(cat.process_id))
        assert b"".join(f["data"] for f in frames if f["type"] == "data") == b"line\n"
        assert frames[-1]["type"] == "exit" and frames[-1]["exit_code"] == 6
        with pytest.raises(paddock.NotFoundError):
            sb.processes.get("proc_0000000000000000")
