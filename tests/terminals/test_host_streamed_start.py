"""A process's streamed start (``POST …/processes/stream``, ``HostAgentClient.start_streaming``) in real
sandboxes: over the kept channel and over HTTP it gives the same process and output; the stream keeps
pace with a slow reader without losing a byte; leaving it early leaves the process running; an agent
from before the call is served by the three calls it stands for."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from paddock_hostagent import channelclient, channelwire
from paddock_hostagent.client import HostAgentClient
from paddock_hostagent.schemas import ProcessFrame, ProcessStreamBody
from tests.hostagent.conftest import TOKEN, AgentProcess

pytestmark = pytest.mark.root


def same_output(got: bytes, want: bytes) -> str | None:
    """``None`` when equal, else a short account of where they part: pytest's own diff of two outputs
    of megabytes runs for minutes (a lost head of ``seq 1 600000`` once read as a hung test)."""
    if got == want:
        return None
    at = next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want))
    )
    return f"{len(got)} bytes against {len(want)}, first difference at {at}: {got[at : at + 24]!r}"


async def collect(frames: AsyncGenerator[ProcessFrame, None], *, pause_s: float = 0.0) -> dict[str, Any]:
    """stdout, stderr and the exit frame of a stream, read ``pause_s`` apart, and the output the stream
    said was lost (``oldest_available_seq``)."""
    out: dict[str, Any] = {"stdout": b"", "stderr": b"", "exit": None, "seqs": [], "gaps": []}
    async with asyncio.timeout(60):
        try:
            async for frame in frames:
                if frame.oldest_available_seq is not None:
                    out["gaps"].append((frame.seq, frame.oldest_available_seq))
                if frame.type == "data":
                    out[frame.stream or "stdout"] += base64.b64decode(frame.data_base64 or "")
                    out["seqs"].append(frame.seq)
                    await asyncio.sleep(pause_s)
                elif frame.type == "exit":
                    out["exit"] = frame
                    break
        finally:
            await frames.aclose()
    assert out["exit"] is not None, "the stream ended without the process's exit"
    return out


async def test_a_streamed_start_answers_alike_over_the_channel_and_over_http(
    host: HostAgentClient, sandbox: dict[str, Any], agent: AgentProcess
) -> None:
    script = "printf 'out ✓\\n'; echo err >&2; read -r line || echo 'stdin closed'; exit 7"
    body = ProcessStreamBody(cmd="bash", args=["-c", script], close_stdin=True)
    async with HostAgentClient(agent.url, TOKEN, channel=False) as http:
        answers = []
        for client in (host, http):
            started = await client.start_streaming(sandbox["id"], body)
            assert started is not None
            view, frames = started
            assert view.pid > 0 and view.cmd == "bash" and view.state in ("running", "exited")
            answers.append(await collect(frames))
    assert host.channel is not None and host.channel.is_open
    for answer in answers:
        assert answer["stdout"] == "out ✓\nstdin closed\n".encode()
        assert answer["stderr"] == b"err\n"
        assert (answer["exit"].exit_code, answer["exit"].signal) == (7, None)


async def test_a_slow_reader_gets_every_byte_and_the_channel_serves_others_meanwhile(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    """Output well past the stream's window (1 MiB) read slowly: the agent waits for the reader's
    credit instead of filling the control plane's memory, and the reader gets all of it in order."""
    started = await host.start_streaming(sandbox["id"], ProcessStreamBody(cmd="seq", args=["1", "600000"]))
    assert started is not None
    _, frames = started
    reading = asyncio.create_task(collect(frames, pause_s=0.002))
    await asyncio.sleep(0.5)
    # The channel's other calls go on while the stream waits for its reader.
    other = await host.exec(sandbox["id"], cmd="echo", args=["meanwhile"], env={})
    assert other.stdout == "meanwhile\n"
    answer = await reading
    expected = "".join(f"{n}\n" for n in range(1, 600001)).encode()
    assert len(expected) > 3 * channelwire.STREAM_WINDOW_BYTES
    assert answer["gaps"] == []
    problem = same_output(answer["stdout"], expected)
    assert problem is None, problem
    assert answer["exit"].exit_code == 0
    assert answer["seqs"] == sorted(answer["seqs"])
    assert host.channel is not None and host.channel.is_open


async def test_a_reader_past_its_buffer_goes_on_over_http_without_a_gap(
    host: HostAgentClient, sandbox: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that overran the window (here: a buffer made smaller than the window) has its stream
    cancelled, and the client reads the rest over HTTP from the last output it gave."""
    monkeypatch.setattr(channelclient, "MAX_STREAM_BUFFER_BYTES", 64 << 10)
    script = "seq 1 100000; sleep 1; echo done"
    started = await host.start_streaming(sandbox["id"], ProcessStreamBody(cmd="bash", args=["-c", script]))
    assert started is not None
    _, frames = started
    answer = await collect(frames, pause_s=0.01)
    expected = "".join(f"{n}\n" for n in range(1, 100001)) + "done\n"
    assert answer["gaps"] == []
    problem = same_output(answer["stdout"], expected.encode())
    assert problem is None, problem
    assert answer["exit"].exit_code == 0
    assert host.channel is not None and host.channel.is_open


async def test_leaving_a_stream_early_leaves_the_process_running(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    body = ProcessStreamBody(cmd="bash", args=["-c", "echo ready; sleep 30"], close_stdin=True)
    started = await host.start_streaming(sandbox["id"], body)
    assert started is not None
    view, frames = started
    async with asyncio.timeout(10):
        async for frame in frames:
            if frame.type == "data":
                assert base64.b64decode(frame.data_base64 or "") == b"ready\n"
                break
    await frames.aclose()
    await asyncio.sleep(0.3)
    listed = {p.process_id: p for p in (await host.list_processes(sandbox["id"])).processes}
    assert listed[view.process_id].state == "running"
    killed = await host.kill_process(sandbox["id"], view.process_id, 0)
    assert killed.process_id == view.process_id


async def test_errors_come_before_any_frame(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    from paddock_hostagent.client import SandboxMissingError, SpawnFailedError

    with pytest.raises(SpawnFailedError):
        await host.start_streaming(sandbox["id"], ProcessStreamBody(cmd="/no/such/program"))
    with pytest.raises(SandboxMissingError):
        await host.start_streaming("sb-nosuchbox", ProcessStreamBody(cmd="true"))


async def test_an_agent_from_before_the_call_answers_none() -> None:
    """Its ``/{process_id}`` route takes no POST: 405, and the caller makes the three calls instead."""
    import httpx

    async with HostAgentClient("http://127.0.0.1:9", TOKEN, channel=False) as client:
        client._http = httpx.AsyncClient(
            base_url="http://127.0.0.1:9/internal/v1/",
            transport=httpx.MockTransport(
                lambda request: httpx.Response(405, json={"detail": "Method Not Allowed"})
            ),
        )
        assert await client.start_streaming("sb-1", ProcessStreamBody(cmd="true")) is None
