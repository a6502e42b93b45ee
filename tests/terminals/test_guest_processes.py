"""Managed processes in the guest agent binary, outside any container (``--listen PATH``).

They pin what the host agent and the control plane build on: a PTY shell reads typed input and sees
its window size change, output survives the client that started it and is replayed after ``after``,
waits report exit codes, signals and kills reach the process tree, and the ring stays bounded.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.guest import GuestClient
from paddock_hostagent.guest.build import BINARY_NAME
from paddock_hostagent.guest.process_client import (
    GuestProcesses,
    GuestProcessNotFoundError,
    GuestProcessStateError,
    GuestSpawnError,
    ProcessExit,
    ProcessOutput,
    StartRequest,
)

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "TERM": "xterm", "HOME": "/tmp"}


@pytest.fixture
def procs(guest_binary_dir: Path, tmp_path: Path) -> Iterator[GuestProcesses]:
    socket_path = tmp_path / "g.sock"
    process = subprocess.Popen([str(guest_binary_dir / BINARY_NAME), "--listen", str(socket_path)])
    deadline = time.monotonic() + 5
    while not socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert socket_path.exists(), "the guest agent did not listen"
    try:
        yield GuestProcesses(GuestClient(socket_path))
    finally:
        process.kill()
        process.wait()


async def read_until(procs: GuestProcesses, process_id: str, needle: bytes, after: int = 0) -> bytes:
    """Connects, and collects output until ``needle`` appears (5 s at most)."""
    seen = b""
    async with asyncio.timeout(5):
        async with procs.connect(process_id, after) as stream:
            async for event in stream:
                if isinstance(event, ProcessOutput):
                    seen += event.data
                    if needle in seen:
                        return seen
                else:
                    break
    raise AssertionError(f"{needle!r} not in output {seen!r}")


async def test_pty_bash_reads_typed_input_and_resizes(procs: GuestProcesses) -> None:
    info = await procs.start(StartRequest("bash", ["--norc", "--noprofile"], ENV, "/tmp", pty=(24, 80)))
    assert info["kind"] == "pty" and info["state"] == "running"
    pid = info["process_id"]
    await procs.input(pid, b"stty size; echo typed-$((6*7))\n")
    out = await read_until(procs, pid, b"typed-42")
    assert b"24 80" in out
    resized = await procs.resize(pid, 40, 132)
    assert (resized["rows"], resized["cols"]) == (40, 132)
    newest = resized["output"]["newest_seq"]
    await procs.input(pid, b"stty size\n")
    assert b"40 132" in await read_until(procs, pid, b"40 132", after=newest)
    await procs.input(pid, b"exit 7\n")
    done = await procs.wait(pid, tree=False, timeout_ms=5000)
    assert done["state"] == "exited" and done["exit_code"] == 7 and done["leader_exited"]


async def test_output_is_replayed_after_the_client_went_away(procs: GuestProcesses) -> None:
    script = "for i in 1 2 3; do echo line$i; done; echo err >&2; sleep 30"
    info = await procs.start(StartRequest("sh", ["-c", script], ENV))
    pid = info["process_id"]
    await read_until(procs, pid, b"line3")  # connected, then gone: the process lives on
    got = await procs.get(pid)
    assert got["state"] == "running"
    events: list[ProcessOutput] = []
    async with procs.connect(pid, 0) as stream:
        async with asyncio.timeout(5):
            async for event in stream:
                assert isinstance(event, ProcessOutput)
                events.append(event)
                if b"err" in b"".join(e.data for e in events if e.stream == "stderr"):
                    break
    assert b"".join(e.data for e in events if e.stream == "stdout") == b"line1\nline2\nline3\n"
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and seqs[0] == 1
    async with procs.connect(pid, seqs[-2]) as stream:  # only what came after seq N
        async with asyncio.timeout(5):
            first = await anext(aiter(stream))
    assert isinstance(first, ProcessOutput) and first.seq == seqs[-1]
    killed = await procs.kill(pid, 2000)
    assert killed["state"] in ("terminating", "exited")
    done = await procs.wait(pid, tree=True, timeout_ms=5000)
    assert done["tree_exited"] and done["signal_number"] == signal.SIGTERM


async def test_connect_ends_with_the_exit_frame(procs: GuestProcesses) -> None:
    info = await procs.start(StartRequest("sh", ["-c", "echo hi; exit 3"], ENV))
    events = []
    async with asyncio.timeout(5):
        async with procs.connect(info["process_id"], 0) as stream:
            events = [event async for event in stream]
    assert events[-1] == ProcessExit(3, 0)
    assert b"".join(e.data for e in events if isinstance(e, ProcessOutput)) == b"hi\n"


async def test_signals_stdin_close_and_errors(procs: GuestProcesses) -> None:
    info = await procs.start(StartRequest("cat", [], ENV))
    pid = info["process_id"]
    assert (await procs.input(pid, b"abc\n"))["input_seq"] == 1
    assert b"abc" in await read_until(procs, pid, b"abc")
    with pytest.raises(GuestProcessStateError):
        await procs.resize(pid, 10, 10)  # no terminal
    assert await procs.stdin_close(pid) == {"ok": True}
    done = await procs.wait(pid, tree=False, timeout_ms=5000)
    assert done["exit_code"] == 0  # cat saw end of input

    sleeper = await procs.start(StartRequest("sleep", ["60"], ENV))
    timed_out = await procs.wait(sleeper["process_id"], tree=False, timeout_ms=100)
    assert timed_out["state"] == "running"
    await procs.signal(sleeper["process_id"], signal.SIGUSR1)
    done = await procs.wait(sleeper["process_id"], tree=False, timeout_ms=5000)
    assert done["signal_number"] == signal.SIGUSR1 and done["exit_code"] == 128 + signal.SIGUSR1
    with pytest.raises(GuestProcessNotFoundError):
        await procs.get("proc_nope")
    with pytest.raises(GuestSpawnError, match="no-such-command"):
        await procs.start(StartRequest("no-such-command", [], ENV))
    listed = await procs.list()
    assert {p["process_id"] for p in listed["processes"]} >= {pid, sleeper["process_id"]}


async def test_kill_reaches_the_whole_tree_and_grace_ends_in_sigkill(procs: GuestProcesses) -> None:
    script = "trap '' TERM; (trap '' TERM; sleep 60) & echo started; wait"
    info = await procs.start(StartRequest("bash", ["-c", script], ENV))
    pid = info["process_id"]
    await read_until(procs, pid, b"started")
    await procs.kill(pid, 300)
    done = await procs.wait(pid, tree=True, timeout_ms=5000)
    assert done["tree_exited"] and done["signal_number"] == signal.SIGKILL


async def test_the_output_ring_is_bounded(procs: GuestProcesses) -> None:
    info = await procs.start(StartRequest("sh", ["-c", "head -c 3000000 /dev/zero"], ENV))
    done = await procs.wait(info["process_id"], tree=False, timeout_ms=10000)
    output = done["output"]
    assert output["bytes"] <= (1 << 20) + 65536 and output["oldest_seq"] > 1
    async with procs.connect(info["process_id"], 0) as stream:
        assert stream.process["output"]["oldest_seq"] == output["oldest_seq"]
        async with asyncio.timeout(5):
            first = await anext(aiter(stream))
    assert isinstance(first, ProcessOutput) and first.seq == output["oldest_seq"]
