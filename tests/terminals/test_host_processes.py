"""Managed processes in real sandboxes, through the host agent's internal API and ``HostAgentClient``."""

from __future__ import annotations

import asyncio
import base64
import signal
from typing import Any

import pytest

from paddock_hostagent.client import HostAgentClient, ProcessMissingError, ProcessStateError, SpawnFailedError
from paddock_hostagent.schemas import (
    ProcessFrame,
    ProcessPty,
    ProcessResizeBody,
    ProcessSignalBody,
    ProcessStartBody,
)
from tests.hostagent.conftest import AgentProcess, Sandboxes

pytestmark = pytest.mark.root


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def output_until(
    host: HostAgentClient, sandbox_id: str, process_id: str, needle: bytes, after: int = 0
) -> bytes:
    seen = b""
    async with asyncio.timeout(10):
        frames = await host.connect_process(sandbox_id, process_id, after)
        try:
            async for frame in frames:
                if frame.type == "data":
                    seen += base64.b64decode(frame.data_base64 or "")
                    if needle in seen:
                        return seen
                elif frame.type == "exit":
                    break
        finally:
            await frames.aclose()
    raise AssertionError(f"{needle!r} not in {seen!r}")


async def test_pty_shell_in_a_sandbox(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    sid = sandbox["id"]
    proc = await host.start_process(sid, ProcessStartBody(pty=ProcessPty(rows=30, cols=100)))
    assert proc.kind == "pty" and proc.cmd == "bash" and proc.state == "running"
    await host.process_input(sid, proc.process_id, b64(b"stty size; tty; echo $TERM\n"))
    out = await output_until(host, sid, proc.process_id, b"xterm-256color")
    assert b"30 100" in out and b"/dev/pts/" in out
    resized = await host.resize_process(sid, proc.process_id, ProcessResizeBody(rows=50, cols=70))
    await host.process_input(sid, proc.process_id, b64(b"stty size\n"))
    assert b"50 70" in await output_until(
        host, sid, proc.process_id, b"50 70", after=resized.output.newest_seq
    )
    await host.process_input(sid, proc.process_id, b64(b"exit 5\n"))
    done = await host.wait_process(sid, proc.process_id, scope="leader", timeout_ms=10000)
    assert done.state == "exited" and done.exit_code == 5 and done.finished_at is not None


async def test_errors_are_the_contracts(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    sid = sandbox["id"]
    with pytest.raises(ProcessMissingError):
        await host.get_process(sid, "proc_missing")
    with pytest.raises(SpawnFailedError, match="nope-cmd"):
        await host.start_process(sid, ProcessStartBody(cmd="nope-cmd"))
    proc = await host.start_process(sid, ProcessStartBody(cmd="sleep", args=["60"]))
    with pytest.raises(ProcessStateError):
        await host.resize_process(sid, proc.process_id, ProcessResizeBody(rows=5))
    signalled = await host.signal_process(sid, proc.process_id, ProcessSignalBody(signal="SIGTERM"))
    assert signalled.process_id == proc.process_id
    done = await host.wait_process(sid, proc.process_id, scope="tree", timeout_ms=10000)
    assert done.signal == "SIGTERM" and done.tree_exited
    listed = await host.list_processes(sid)
    assert proc.process_id in [p.process_id for p in listed.processes]


async def test_heartbeat_frame_shape() -> None:
    assert ProcessFrame(type="heartbeat").model_dump(exclude_none=True) == {"type": "heartbeat"}


async def test_processes_survive_a_host_agent_restart(make_agent: Any) -> None:
    agent: AgentProcess = make_agent()
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        sandbox = await tracker.create(name="keeps-procs")
        script = "echo before-restart; while sleep 0.2; do echo tick; done"
        proc = await host.start_process(sandbox["id"], ProcessStartBody(cmd="bash", args=["-c", script]))
        await output_until(host, sandbox["id"], proc.process_id, b"tick")

    agent.stop(signal.SIGKILL)  # a crash of the host agent; the sandbox and its guest keep running
    agent.start()

    async with agent.client() as host:
        tracker.host = host
        again = await host.get_process(sandbox["id"], proc.process_id)
        assert again.state == "running" and again.pid == proc.pid
        replayed = await output_until(host, sandbox["id"], proc.process_id, b"tick\ntick\n")
        assert replayed.startswith(b"before-restart\n")
        await host.kill_process(sandbox["id"], proc.process_id, 0)
        done = await host.wait_process(sandbox["id"], proc.process_id, scope="tree", timeout_ms=10000)
        assert done.signal == "SIGKILL"
        await tracker.destroy_all()
