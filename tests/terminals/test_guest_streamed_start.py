"""A process's streamed start in the guest agent binary (``GuestProcesses.start_streaming``, the half of
``POST …/processes/stream`` and of E2B's ``commands.run`` inside the sandbox), outside any container.

The stream gives every byte from the process's first one, however long the host takes to read the
start's answer: the guest keeps only the newest 1 MiB of a process's output in its ring, so a stream
that subscribed only once the host had read that answer lost the head of a fast command's output when
the host was slow (a loaded machine: `seq 1 600000` came back as its last 1 MiB). A guest from before
the stream flag is still served, as before, by a connect sent after the start's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.guest import process_client
from paddock_hostagent.guest.build import BINARY_NAME
from paddock_hostagent.guest.process_client import (
    GuestProcesses,
    ProcessExit,
    ProcessOutput,
    ProcessStream,
    StartRequest,
)
from tests.hostagent import guestbin
from tests.terminals.test_host_streamed_start import same_output

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp"}
#: The last commit whose guest agent had no stream flag on START (it subscribes on a later CONNECT).
OLD_GUEST_COMMIT = "37a0883"
#: Far more than the guest's ring (PROC_RING_BYTES, 1 MiB) and less than a subscriber's backlog (16 MiB).
SEQ_LAST = 600_000
SEQ_OUTPUT = "".join(f"{n}\n" for n in range(1, SEQ_LAST + 1)).encode()


@pytest.fixture
def procs(guest_binary_dir: Path, tmp_path: Path) -> Iterator[GuestProcesses]:
    for client in guestbin.serve(guest_binary_dir / BINARY_NAME, tmp_path / "g.sock"):
        yield GuestProcesses(client)


@pytest.fixture
def old_procs(tmp_path: Path) -> Iterator[GuestProcesses]:
    for client in guestbin.serve(guestbin.build_old(OLD_GUEST_COMMIT, tmp_path), tmp_path / "old.sock"):
        yield GuestProcesses(client)


async def _read(stream: ProcessStream) -> tuple[bytes, list[int], ProcessExit | None]:
    """The stream's output, its sequence numbers and its exit (10 s at most)."""
    data, seqs, exit_ = bytearray(), [], None
    async with asyncio.timeout(10):
        try:
            async for event in stream:
                if isinstance(event, ProcessOutput):
                    data += event.data
                    seqs.append(event.seq)
                else:
                    exit_ = event
        finally:
            stream.close()
    return bytes(data), seqs, exit_


async def test_a_slow_host_still_gets_the_head_of_a_fast_commands_output(
    procs: GuestProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host reads the start's answer only once the command has exited (a host slowed by load, made
    certain here): the stream still begins at the command's first byte."""
    read_reply = process_client._read_reply
    held: list[str] = []

    async def slow_read_reply(conn: Any) -> dict[str, Any]:
        reply = await read_reply(conn)
        if not held and "process_id" in reply:  # the start's answer
            held.append(reply["process_id"])
            done = await procs.wait(reply["process_id"], tree=False, timeout_ms=10_000)
            assert done["state"] == "exited", done
        return reply

    monkeypatch.setattr(process_client, "_read_reply", slow_read_reply)
    view, stream = await procs.start_streaming(
        StartRequest("seq", ["1", str(SEQ_LAST)], ENV), close_stdin=True
    )
    assert held == [view["process_id"]], "the seam did not hold the start's answer"
    data, seqs, exit_ = await _read(stream)
    problem = same_output(data, SEQ_OUTPUT)
    assert problem is None, problem
    assert seqs == list(range(1, len(seqs) + 1))
    assert exit_ is not None and (exit_.exit_code, exit_.signal) == (0, 0)


@pytest.mark.parametrize("pty", [None, (24, 80)], ids=["pipes", "pty"])
async def test_stdin_closed_at_the_start_reaches_the_command(
    procs: GuestProcesses, pty: tuple[int, int] | None
) -> None:
    script = "read -r line && echo got:$line || echo stdin-closed"
    request = StartRequest("bash", ["--norc", "--noprofile", "-c", script], ENV, pty=pty)
    view, stream = await procs.start_streaming(request, close_stdin=True)
    assert view["state"] in ("running", "exited")
    data, _, exit_ = await _read(stream)
    assert data.replace(b"\r\n", b"\n").endswith(b"stdin-closed\n"), data
    assert exit_ is not None and exit_.exit_code == 0


async def test_a_guest_from_before_the_stream_flag_is_served_by_a_later_connect(
    old_procs: GuestProcesses,
) -> None:
    """A sandbox started before this host agent keeps its guest: the stream and stdin's close still
    work there (the start's answer does not say it streams, so the connect follows it)."""
    script = "echo out; echo err >&2; read -r line || echo stdin-closed; exit 3"
    view, stream = await old_procs.start_streaming(
        StartRequest("bash", ["-c", script], ENV), close_stdin=True
    )
    assert "streaming" not in view
    data, _, exit_ = await _read(stream)
    assert sorted(data.splitlines()) == [b"err", b"out", b"stdin-closed"]
    assert exit_ is not None and exit_.exit_code == 3
    listed = await old_procs.get(view["process_id"])
    assert listed["state"] == "exited"
