"""``paddock mcp`` driven by the ``mcp`` SDK's own client, over stdio and over streamable HTTP, against
the real platform (control plane + host agent processes, real sandboxes).

Each transport runs the issue's walk: list the tools, create a sandbox, write a file, run a command that
reads it, destroy the sandbox. Around it: streamed progress from run_command, run_code's chart as a PNG
image, pause/resume/fork, expose_port's URL answering through the ingress proxy, and errors that come
back as tool errors with text a model can act on.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import mcp.types as types
import pytest
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from mcp import ClientSession, StdioServerParameters
from paddock_mcp import TOOL_NAMES
from tests.live import LivePlatform
from tests.ports import free_port

pytestmark = [pytest.mark.root, pytest.mark.slow]


def server_env(live: LivePlatform, api_key: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PADDOCK_")}
    return {**env, "PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": api_key}


@asynccontextmanager
async def stdio_session(live: LivePlatform, api_key: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "paddock_cli.main", "mcp"], env=server_env(live, api_key)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.fixture(scope="module")
def http_server(live: LivePlatform) -> Iterator[str]:
    """``paddock mcp --transport http`` as a process; yields its endpoint URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "paddock_cli.main", "mcp", "--transport", "http", "--port", str(port)],
        env=server_env(live, live.api_key()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=15)


@asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> types.CallToolResult:
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, types.CallToolResult)
    return result


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def ok(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await call(session, tool, **arguments)
    assert not result.is_error, text(result)
    return text(result)


def sandbox_id(description: str) -> str:
    [line] = [line for line in description.splitlines() if line.startswith("id: ")]
    return line.removeprefix("id: ")


async def the_walk(session: ClientSession) -> None:
    """The issue's must-show: tools listed, create, write, a command reading the file, destroy."""
    tools = await session.list_tools()
    assert {tool.name for tool in tools.tools} == set(TOOL_NAMES)
    assert all(tool.description for tool in tools.tools)
    created = await ok(session, "create_sandbox", rootfs="debian:13", shape="s-1vcpu-256mb")
    sb = sandbox_id(created)
    assert "status: running" in created
    try:
        written = await ok(
            session, "write_file", sandbox_id=sb, path="/root/notes/hello.txt", content="hi mcp\n"
        )
        assert written == "wrote 7 bytes to /root/notes/hello.txt"
        ran = await ok(
            session, "run_command", sandbox_id=sb, command="cat /root/notes/hello.txt; echo err >&2"
        )
        assert ran.startswith("exit code 0") and "hi mcp" in ran and "[stderr]\nerr" in ran
        assert "hello.txt" in await ok(session, "list_files", sandbox_id=sb, path="/root/notes")
        assert await ok(session, "read_file", sandbox_id=sb, path="/root/notes/hello.txt") == "hi mcp\n"
        assert sb in await ok(session, "list_sandboxes")
    finally:
        destroyed = await ok(session, "destroy_sandbox", sandbox_id=sb)
    assert destroyed.startswith(f"{sb}: destroy")
    assert sb not in await ok(session, "list_sandboxes")


async def test_over_stdio_a_client_lists_creates_writes_runs_and_destroys(live: LivePlatform) -> None:
    async with stdio_session(live, live.api_key()) as session:
        await the_walk(session)


async def test_over_http_a_client_lists_creates_writes_runs_and_destroys(http_server: str) -> None:
    async with http_session(http_server) as session:
        await the_walk(session)


async def test_errors_come_back_as_text_the_model_can_act_on(http_server: str) -> None:
    async with http_session(http_server) as session:
        missing = await call(session, "run_command", sandbox_id="sb-doesnotexist", command="true")
        assert missing.is_error
        assert text(missing) == (
            "Error executing tool run_command: sandbox not found (list_sandboxes shows your sandboxes)"
        )
        bad_shape = await call(session, "create_sandbox", shape="no-such-shape")
        assert bad_shape.is_error and text(bad_shape).startswith(
            "Error executing tool create_sandbox: 400 VALIDATION_FAILED"
        )
        assert "unknown shape 'no-such-shape'" in text(bad_shape), text(bad_shape)
        assert "Traceback" not in text(missing) + text(bad_shape)


async def test_run_command_streams_progress_and_times_out(http_server: str) -> None:
    async with http_session(http_server) as session:
        sb = sandbox_id(await ok(session, "create_sandbox", rootfs="debian:13", shape="s-1vcpu-256mb"))
        try:
            progress: list[tuple[float, str | None]] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append((time.monotonic(), message))

            started = time.monotonic()
            result = await session.call_tool(
                "run_command",
                {"sandbox_id": sb, "command": "echo one; sleep 1.5; echo two"},
                progress_callback=on_progress,
            )
            assert isinstance(result, types.CallToolResult) and not result.is_error
            finished = time.monotonic()
            assert [message for _, message in progress] == ["stdout: one\n", "stdout: two\n"]
            assert progress[0][0] - started < finished - started - 1.0  # 'one' arrived before the sleep ended
            cut = await ok(session, "run_command", sandbox_id=sb, command="sleep 30", timeout_s=1)
            assert cut.startswith("killed after the 1.0s timeout")
        finally:
            await ok(session, "destroy_sandbox", sandbox_id=sb)


async def test_code_lifecycle_and_ingress_over_stdio(live: LivePlatform) -> None:
    """run_code keeps state and returns a chart as an image; pause/resume/fork; expose_port's URL works."""
    async with stdio_session(live, live.api_key()) as session:
        sb = sandbox_id(await ok(session, "create_sandbox", rootfs="code-interpreter:1"))
        child = None
        try:
            await ok(session, "run_code", sandbox_id=sb, code="n = 6 * 7")
            assert "[result 1: text/plain]\n42" in await ok(session, "run_code", sandbox_id=sb, code="n")
            scoped = await ok(
                session,
                "run_code",
                sandbox_id=sb,
                code="import os\nos.environ['KEY']",
                envs={"KEY": "only-here"},
            )
            assert "'only-here'" in scoped, scoped
            assert "False" in await ok(session, "run_code", sandbox_id=sb, code="'KEY' in os.environ")
            chart = await call(
                session,
                "run_code",
                sandbox_id=sb,
                code="import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 3])\nplt.show()",
            )
            [image] = [block for block in chart.content if isinstance(block, types.ImageContent)]
            assert image.mime_type == "image/png"
            assert base64.b64decode(image.data).startswith(b"\x89PNG\r\n\x1a\n")
            streamed: list[str | None] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                streamed.append(message)

            printed = await session.call_tool(
                "run_code",
                {"sandbox_id": sb, "code": "import sys\nprint('out')\nprint('err', file=sys.stderr)"},
                progress_callback=on_progress,
            )
            assert isinstance(printed, types.CallToolResult) and not printed.is_error
            assert streamed == ["stdout: out\n", "stderr: err\n"]
            assert text(printed) == "[stdout]\nout\n\n\n[stderr]\nerr\n"
            failed = await ok(session, "run_code", sandbox_id=sb, code="int('x')")
            assert "[error] ValueError: invalid literal" in failed and "Cell In[" in failed

            await ok(session, "run_command", sandbox_id=sb, command="echo kept > /root/state.txt")
            assert (await ok(session, "pause_sandbox", sandbox_id=sb)).endswith("paused")
            assert (await ok(session, "resume_sandbox", sandbox_id=sb)).endswith("running")
            child = sandbox_id(await ok(session, "fork_sandbox", sandbox_id=sb))
            assert await ok(session, "read_file", sandbox_id=child, path="/root/state.txt") == "kept\n"

            await ok(
                session,
                "write_file",
                sandbox_id=sb,
                path="/srv/www/index.html",
                content="served from the sandbox\n",
            )
            await ok(
                session,
                "run_command",
                sandbox_id=sb,
                command="setsid -f python3 -m http.server 8000 --bind 0.0.0.0 --directory /srv/www"
                " >/dev/null 2>&1",
            )
            url = await ok(session, "expose_port", sandbox_id=sb, port=8000)
            parts = urlsplit(url)
            assert parts.hostname and parts.hostname.startswith(f"8000-{sb}.")
            body = ""
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and body != "served from the sandbox\n":
                async with httpx.AsyncClient(timeout=5) as http:
                    response = await http.get(
                        f"http://127.0.0.1:{parts.port}/", headers={"Host": parts.netloc}
                    )
                body = response.text if response.status_code == 200 else ""
                time.sleep(0.2)
            assert body == "served from the sandbox\n"
        finally:
            for target in (child, sb):
                if target:
                    await ok(session, "destroy_sandbox", sandbox_id=target)
