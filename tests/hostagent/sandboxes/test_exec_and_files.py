"""Commands and files in real sandboxes, through the host agent's HTTP API and its client."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from paddock_hostagent.client import (
    BadPathError,
    BadStateError,
    GuestFileNotFoundError,
    HostAgentClient,
    IsDirectoryError,
    SandboxMissingError,
)
from tests.hostagent.conftest import TOKEN, AgentProcess, run, sh

pytestmark = pytest.mark.root


async def frames_of(
    host: HostAgentClient, sandbox_id: str, cmd: str, *args: str, **kw: Any
) -> list[dict[str, Any]]:
    return [frame async for frame in host.exec_stream(sandbox_id, cmd=cmd, args=list(args), env={}, **kw)]


async def test_buffered_exec_returns_output_and_exit_code(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    result = await sh(host, sandbox["id"], "echo out; echo err >&2; exit 42")
    assert result["stdout"] == "out\n"
    assert result["stderr"] == "err\n"
    assert result["exit_code"] == 42
    assert "error" not in result or result["error"] is None
    assert result["exec_ms"] >= 0


async def test_stream_frames_arrive_in_order_and_end_with_one_exit(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.05; done"
    frames = await frames_of(host, sandbox["id"], "bash", "-c", script)
    assert frames[-1] == {"exit_code": 0}
    assert [f for f in frames if "exit_code" in f] == [{"exit_code": 0}]
    output = [f.get("stdout") or f.get("stderr") for f in frames[:-1]]
    assert output == ["out1\n", "err1\n", "out2\n", "err2\n", "out3\n", "err3\n"]


async def test_stream_never_splits_a_multibyte_character(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    # "€" is e2 82 ac: send it in two writes with a pause between, so the bytes arrive in two chunks.
    script = r"printf 'a\xe2\x82'; sleep 0.2; printf '\xac b\n'; printf '\xff\n'"
    frames = await frames_of(host, sandbox["id"], "bash", "-c", script)
    chunks = [f["stdout"] for f in frames if "stdout" in f]
    assert "".join(chunks) == "a€ b\n\ufffd\n"
    assert all("\ufffd" not in chunk for chunk in chunks[:-1]), chunks


async def test_stdin_env_and_cwd(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    result = await run(host, sandbox["id"], "cat", stdin="fed through stdin\n")
    assert result["stdout"] == "fed through stdin\n"
    result = await run(host, sandbox["id"], "cat")
    assert result == result | {"stdout": "", "exit_code": 0}  # no stdin: immediate EOF, no hang
    result = await run(host, sandbox["id"], "printenv", "GREETING", env={"GREETING": "hello wörld"})
    assert result["stdout"] == "hello wörld\n"
    result = await run(host, sandbox["id"], "pwd", cwd="/tmp")
    assert result["stdout"] == "/tmp\n"
    result = await run(host, sandbox["id"], "pwd")
    assert result["stdout"] == "/root\n"


async def test_signal_death_and_missing_command(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    result = await sh(host, sandbox["id"], "kill -KILL $$")
    assert result["exit_code"] == 137
    result = await run(host, sandbox["id"], "definitely-not-installed")
    assert result["exit_code"] == -1
    assert "definitely-not-installed" in result["error"]
    frames = await frames_of(host, sandbox["id"], "definitely-not-installed")
    assert "error" in frames[0] and frames[-1] == {"exit_code": -1}


async def _sleepers(host: HostAgentClient, sandbox_id: str) -> str:
    result = await run(host, sandbox_id, "pgrep", "-a", "sleep")
    return str(result["stdout"])


async def test_leaving_a_stream_kills_the_command_and_its_children(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    stream = host.exec_stream(
        sandbox["id"], cmd="bash", args=["-c", "sleep 300 & sleep 301 & echo started; wait"], env={}
    )
    async for frame in stream:
        assert frame == {"stdout": "started\n"}
        break
    await stream.aclose()
    for _ in range(100):
        if not await _sleepers(host, sandbox["id"]):
            break
        await asyncio.sleep(0.05)
    assert await _sleepers(host, sandbox["id"]) == ""


async def test_a_buffered_exec_dies_with_its_caller(agent: AgentProcess, sandbox: dict[str, Any]) -> None:
    async with httpx.AsyncClient(base_url=agent.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                f"/internal/v1/sandboxes/{sandbox['id']}/exec",
                json={"cmd": "bash", "args": ["-c", "sleep 302 & sleep 303"]},
                timeout=httpx.Timeout(1.0, connect=5.0),
            )
    async with agent.client() as host:
        for _ in range(100):
            if not await _sleepers(host, sandbox["id"]):
                break
            await asyncio.sleep(0.05)
        assert await _sleepers(host, sandbox["id"]) == ""


async def chunks_of(data: bytes, size: int = 1 << 16) -> AsyncIterator[bytes]:
    for offset in range(0, len(data), size):
        yield data[offset : offset + size]


async def test_binary_file_round_trip(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    data = os.urandom(1 << 20) + bytes(range(256))
    written = await host.upload(sandbox["id"], "/root/blob.bin", chunks_of(data))
    assert (written.path, written.size) == ("/root/blob.bin", len(data))
    size, chunks = await host.download(sandbox["id"], "/root/blob.bin")
    assert size == len(data)
    assert b"".join([chunk async for chunk in chunks]) == data
    listing = await run(host, sandbox["id"], "stat", "-c", "%s %a", "/root/blob.bin")
    assert listing["stdout"] == f"{len(data)} 644\n"


async def test_100_mib_file_round_trips_byte_exact(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    block = hashlib.sha256(b"paddock").digest() * 2048

    async def hundred_mib() -> AsyncIterator[bytes]:
        for index in range(1600):
            yield index.to_bytes(4, "big") + block[4:]

    expected = hashlib.sha256()
    async for chunk in hundred_mib():
        expected.update(chunk)
    written = await host.upload(sandbox["id"], "/root/big.bin", hundred_mib())
    assert written.size == 100 << 20
    inside = await run(host, sandbox["id"], "sha256sum", "/root/big.bin")
    assert inside["stdout"].split()[0] == expected.hexdigest()
    size, chunks = await host.download(sandbox["id"], "/root/big.bin")
    assert size == 100 << 20
    received = hashlib.sha256()
    async for chunk in chunks:
        received.update(chunk)
    assert received.hexdigest() == expected.hexdigest()


async def test_a_download_left_half_read_does_not_spoil_the_next_calls(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    """Its connection is closed, not put back in the pool with the rest of the file still to come."""
    data = os.urandom(8 << 20)
    await host.upload(sandbox["id"], "/root/half.bin", chunks_of(data))
    for _ in range(3):
        size, chunks = await host.download(sandbox["id"], "/root/half.bin")
        first = await anext(aiter(chunks))
        assert size == len(data) and data.startswith(first) and len(first) < len(data)
        await chunks.aclose()  # type: ignore[attr-defined]
        assert (await run(host, sandbox["id"], "echo", "next"))["stdout"] == "next\n"
    size, chunks = await host.download(sandbox["id"], "/root/half.bin")
    assert b"".join([chunk async for chunk in chunks]) == data


async def test_upload_keeps_an_existing_files_mode(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    await sh(host, sandbox["id"], "printf old > /root/tool.sh && chmod 750 /root/tool.sh")
    await host.upload(sandbox["id"], "/root/tool.sh", chunks_of(b"#!/bin/sh\necho fresh\n"))
    result = await sh(host, sandbox["id"], "stat -c %a /root/tool.sh && /root/tool.sh")
    assert result["stdout"] == "750\nfresh\n"


async def test_file_errors(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    # Missing parents are created (§11.6); a parent that is a file is the caller's mistake.
    await host.upload(sandbox["id"], "/no/such/dir/file", chunks_of(b"x"))
    with pytest.raises(BadPathError):
        await host.upload(sandbox["id"], "/no/such/dir/file/below", chunks_of(b"x"))
    with pytest.raises(IsDirectoryError):
        await host.upload(sandbox["id"], "/root", chunks_of(b"x"))
    with pytest.raises(BadPathError):
        await host.upload(sandbox["id"], "relative.txt", chunks_of(b"x"))
    with pytest.raises(GuestFileNotFoundError):
        await host.download(sandbox["id"], "/root/missing.txt")
    with pytest.raises(IsDirectoryError):
        await host.download(sandbox["id"], "/etc")


async def test_unknown_sandbox_and_wrong_state(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    with pytest.raises(SandboxMissingError):
        await run(host, "sb-does-not-exist", "true")
    with pytest.raises(SandboxMissingError):
        await host.get_sandbox("sb-does-not-exist")
    await host.pause_sandbox(sandbox["id"])
    with pytest.raises(BadStateError):
        await run(host, sandbox["id"], "true")
    with pytest.raises(BadStateError):
        await host.download(sandbox["id"], "/etc/hostname")
    with pytest.raises(BadStateError):
        await host.pause_sandbox(sandbox["id"])
    await host.resume_sandbox(sandbox["id"])
    with pytest.raises(BadStateError):
        await host.resume_sandbox(sandbox["id"])
