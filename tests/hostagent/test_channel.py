"""The kept channel from the control plane to a host agent (``channelclient``/``channelserver``).

Most tests serve the agent's real internal API (``app.api_app``: routes, fast lane, channel) with
uvicorn on a loopback port, over a fake sandbox manager, and call them with the real
``HostAgentClient``: what the channel answers, when it gives way to HTTP, what a drop or a departed
caller does. The last test runs commands in a real sandbox both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from paddock_core import fastlane
from paddock_core.fastlane import FastLane
from paddock_hostagent import errors
from paddock_hostagent.app import api_app
from paddock_hostagent.client import (
    BadStateError,
    HostAgentClient,
    HostAgentError,
    HostBusyError,
    HostUnavailableError,
    SandboxMissingError,
)
from paddock_hostagent.routes import fast_routes
from paddock_hostagent.schemas import CreateSandboxBody, CreateSandboxResult, ExecBody, ForkBody
from tests.hostagent.conftest import TOKEN as AGENT_TOKEN
from tests.hostagent.conftest import AgentProcess, run, sh
from tests.ports import free_port

TOKEN = "t0ken"


class FakeExec:
    """A command: answers at once, or only once ``release`` is set."""

    def __init__(self, body: ExecBody, release: asyncio.Event | None) -> None:
        self.body = body
        self.release = release
        self.closed = asyncio.Event()

    async def collect(self) -> dict[str, Any]:
        if self.release is not None:
            await self.release.wait()
        out = " ".join([self.body.cmd, *self.body.args])
        return {"stdout": f"{out} ✓\n", "stderr": "warn\n", "exit_code": 3, "exec_ms": 1.25}

    async def close(self) -> None:
        self.closed.set()


class FakeManager:
    """``SandboxManager.open_exec`` (the one call a buffered exec makes), ``pause``, ``resume``,
    ``create`` and ``fork``."""

    def __init__(self) -> None:
        self.streams: list[FakeExec] = []
        self.hold: dict[str, asyncio.Event] = {}  # cmd (or "pause") -> released when set
        self.paused: set[str] = set()
        self.booted: list[str] = []

    async def create(self, body: CreateSandboxBody) -> CreateSandboxResult:
        self.booted.append(body.id)
        return CreateSandboxResult(id=body.id, ip="10.0.0.2", spawn_ms=12.5, status="running")

    async def fork(self, sandbox_id: str, body: ForkBody) -> CreateSandboxResult:
        if sandbox_id == "sb-gone":
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found on this host")
        self.booted.append(body.new_id)
        status = "paused" if body.start_paused else "running"
        return CreateSandboxResult(id=body.new_id, ip="10.0.0.3", spawn_ms=7.5, status=status)

    async def pause(self, sandbox_id: str) -> str:
        if sandbox_id in self.paused:
            raise errors.InvalidState(f"sandbox {sandbox_id} is paused, not running")
        if "pause" in self.hold:
            await self.hold["pause"].wait()
        self.paused.add(sandbox_id)
        return "paused"

    async def resume(self, sandbox_id: str) -> str:
        if sandbox_id not in self.paused:
            raise errors.InvalidState(f"sandbox {sandbox_id} is running, not paused")
        self.paused.discard(sandbox_id)
        return "running"

    async def open_exec(self, sandbox_id: str, body: ExecBody) -> FakeExec:
        if sandbox_id == "sb-gone":
            raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found on this host")
        if sandbox_id == "sb-busy":  # what a guest that takes no more connections makes it say
            raise errors.Busy(f"sandbox {sandbox_id} is busy: no connection within 5 s; retry")
        self.streams.append(FakeExec(body, self.hold.get(body.cmd)))
        return self.streams[-1]


class CountsHTTP:
    """Counts the HTTP requests that reach the app (a call the channel carried is not one)."""

    def __init__(self, app: fastlane.ASGIApp) -> None:
        self.app = app
        self.requests = 0

    async def __call__(self, scope: fastlane.Scope, receive: fastlane.Receive, send: fastlane.Send) -> None:
        if scope["type"] == "http":
            self.requests += 1
        await self.app(scope, receive, send)


class FirstChannelOnly:
    """An agent of the channel's first version: it accepts the channel without naming a subprotocol."""

    def __init__(self, app: fastlane.ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: fastlane.Scope, receive: fastlane.Receive, send: fastlane.Send) -> None:
        async def unnamed(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.accept":
                message = {**message, "subprotocol": None}
            await send(message)

        await self.app(scope, receive, unnamed if scope["type"] == "websocket" else send)


class Agent:
    """The channel endpoint and the fast lane, served by uvicorn; ``restart`` drops every channel."""

    def __init__(self, first_channel_only: bool = False) -> None:
        self.manager = FakeManager()
        self.port = free_port()
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None
        self.first_channel_only = first_channel_only
        self.http: CountsHTTP | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        def authorized(header: str) -> bool:
            return header == f"Bearer {TOKEN}"

        app = api_app(authorized)
        app.state.manager = self.manager
        self.http = CountsHTTP(FirstChannelOnly(app) if self.first_channel_only else app)
        config = uvicorn.Config(self.http, host="127.0.0.1", port=self.port, log_config=None, lifespan="off")
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        assert self.server is not None and self.task is not None
        self.server.should_exit = True
        await self.task


@pytest.fixture
async def fake_agent() -> AsyncIterator[Agent]:
    agent = Agent()
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


async def exec_true(client: HostAgentClient, sandbox_id: str = "sb-1", cmd: str = "echo") -> dict[str, Any]:
    result = await client.exec(sandbox_id, cmd=cmd, args=["hé"], env={})
    return result.model_dump()


async def test_exec_over_the_channel_answers_what_http_answers(fake_agent: Agent) -> None:
    agent = fake_agent
    async with (
        HostAgentClient(agent.url, TOKEN) as kept,
        HostAgentClient(agent.url, TOKEN, channel=False) as http,
    ):
        assert (
            await exec_true(kept)
            == await exec_true(http)
            == {
                "stdout": "echo hé ✓\n",
                "stderr": "warn\n",
                "exit_code": 3,
                "error": None,
                "exec_ms": 1.25,
                "stdout_truncated": None,
                "stderr_truncated": None,
            }
        )
        assert kept.channel is not None and kept.channel.is_open, "the first call went over the channel"
        failures = []
        for client in (kept, http):
            with pytest.raises(SandboxMissingError) as caught:
                await exec_true(client, "sb-gone")
            failures.append((caught.value.status, caught.value.code, str(caught.value)))
        assert (
            failures[0] == failures[1] == (404, "sandbox_not_found", "sandbox sb-gone not found on this host")
        )
        assert all(stream.closed.is_set() for stream in agent.manager.streams)


async def test_pause_and_resume_over_the_channel_answer_what_http_answers(fake_agent: Agent) -> None:
    agent = fake_agent
    async with (
        HostAgentClient(agent.url, TOKEN) as kept,
        HostAgentClient(agent.url, TOKEN, channel=False) as http,
    ):
        refusals = []
        for client, sandbox_id in ((kept, "sb-a"), (http, "sb-b")):
            assert (await client.pause_sandbox(sandbox_id)).status == "paused"
            with pytest.raises(BadStateError) as caught:
                await client.pause_sandbox(sandbox_id)
            refusals.append(
                (caught.value.status, caught.value.code, str(caught.value).replace(sandbox_id, "X"))
            )
            assert (await client.resume_sandbox(sandbox_id)).status == "running"
        assert refusals[0] == refusals[1] == (409, "invalid_state", "sandbox X is paused, not running")
        assert kept.channel is not None and kept.channel.is_open


def create_body(sandbox_id: str) -> CreateSandboxBody:
    return CreateSandboxBody(
        id=sandbox_id, name="n", rootfs="debian:13", vcpu=1, mem_mib=256, disk_mib=2048, egress=["10.0.0.0/8"]
    )


async def test_create_and_fork_go_over_the_channel_and_answer_what_http_answers(fake_agent: Agent) -> None:
    agent = fake_agent
    assert agent.http is not None
    async with (
        HostAgentClient(agent.url, TOKEN) as kept,
        HostAgentClient(agent.url, TOKEN, channel=False) as http,
    ):
        answers = []
        for client, suffix in ((kept, "k"), (http, "h")):
            before = agent.http.requests
            created = await client.create_sandbox(create_body(f"sb-new{suffix}"))
            forked = await client.fork_sandbox(
                f"sb-new{suffix}", ForkBody(new_id=f"sb-fork{suffix}", name="f", start_paused=True)
            )
            with pytest.raises(SandboxMissingError) as caught:
                await client.fork_sandbox("sb-gone", ForkBody(new_id=f"sb-x{suffix}", name="f"))
            answers.append(
                (
                    created.model_dump(exclude={"id"}),
                    forked.model_dump(exclude={"id"}),
                    (caught.value.status, caught.value.code, str(caught.value)),
                    agent.http.requests - before,
                )
            )
        over_channel, over_http = answers
        assert over_channel[:3] == over_http[:3]
        assert over_channel[1]["status"] == "paused" and over_channel[2][0] == 404
        assert (over_channel[3], over_http[3]) == (0, 3), "the channel carried all three; HTTP made three"
    assert agent.manager.booted == ["sb-newk", "sb-forkk", "sb-newh", "sb-forkh"]


async def test_an_agent_of_the_first_channel_gets_create_and_fork_over_http() -> None:
    agent = Agent(first_channel_only=True)
    await agent.start()
    try:
        assert agent.http is not None
        async with HostAgentClient(agent.url, TOKEN) as client:
            assert (await exec_true(client))["exit_code"] == 3
            assert agent.http.requests == 0, "exec went over the channel it knows"
            assert (await client.create_sandbox(create_body("sb-old"))).status == "running"
            assert (
                await client.fork_sandbox("sb-old", ForkBody(new_id="sb-oldf", name="f"))
            ).ip == "10.0.0.3"
            assert agent.http.requests == 2, "create and fork went over HTTP, not to an agent that lacks them"
            assert client.channel is not None and client.channel.is_open
        assert agent.manager.booted == ["sb-old", "sb-oldf"]
    finally:
        await agent.stop()


async def test_a_pause_whose_caller_leaves_still_completes(fake_agent: Agent) -> None:
    agent = fake_agent
    agent.manager.hold["pause"] = release = asyncio.Event()
    async with HostAgentClient(agent.url, TOKEN) as client:
        call = asyncio.create_task(client.pause_sandbox("sb-1"))
        await asyncio.sleep(0.1)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.05)  # the cancel frame has arrived
        release.set()
        for _ in range(100):
            if "sb-1" in agent.manager.paused:
                break
            await asyncio.sleep(0.01)
        assert agent.manager.paused == {"sb-1"}, "a pause is never stopped halfway"


async def test_calls_share_one_channel_and_are_answered_as_they_finish(fake_agent: Agent) -> None:
    agent = fake_agent
    agent.manager.hold["slow"] = release = asyncio.Event()
    async with HostAgentClient(agent.url, TOKEN) as client:
        slow = asyncio.create_task(exec_true(client, cmd="slow"))
        await asyncio.sleep(0.05)
        assert (await exec_true(client, cmd="fast"))["stdout"] == "fast hé ✓\n"  # not queued behind slow
        release.set()
        assert (await slow)["stdout"] == "slow hé ✓\n"


async def test_a_call_too_big_for_the_channel_goes_over_http_and_the_channel_stays(fake_agent: Agent) -> None:
    agent = fake_agent
    async with HostAgentClient(agent.url, TOKEN) as client:
        assert (await exec_true(client))["exit_code"] == 3  # opens the channel
        result = await client.exec("sb-1", cmd="cat", args=[], env={}, stdin="x" * (2 << 20))
        assert result.stdout == "cat ✓\n"
        assert agent.manager.streams[-1].body.stdin == "x" * (2 << 20), "the whole stdin arrived"
        assert client.channel is not None and client.channel.is_open, "the channel was not closed by it"
        assert (await exec_true(client))["exit_code"] == 3


async def test_a_bad_token_is_refused_and_nothing_runs(fake_agent: Agent) -> None:
    agent = fake_agent
    async with HostAgentClient(agent.url, "wrong") as client:
        with pytest.raises(HostAgentError) as caught:
            await exec_true(client)
        assert (caught.value.status, caught.value.code) == (401, "unauthorized")  # HTTP's answer
        assert client.channel is not None and not client.channel.is_open
        assert "403" in (client.channel.last_failure or "")
    assert agent.manager.streams == []


async def test_a_caller_that_leaves_stops_its_command(fake_agent: Agent) -> None:
    agent = fake_agent
    agent.manager.hold["sleep"] = asyncio.Event()  # never released
    async with HostAgentClient(agent.url, TOKEN) as client:
        call = asyncio.create_task(exec_true(client, cmd="sleep"))
        while not agent.manager.streams:
            await asyncio.sleep(0.01)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await asyncio.wait_for(agent.manager.streams[0].closed.wait(), 5)
        assert (await exec_true(client))["exit_code"] == 3, "the channel serves on"


async def test_a_dropped_channel_fails_its_calls_and_the_next_call_opens_another(fake_agent: Agent) -> None:
    agent = fake_agent
    agent.manager.hold["sleep"] = asyncio.Event()
    async with HostAgentClient(agent.url, TOKEN) as client:
        call = asyncio.create_task(exec_true(client, cmd="sleep"))
        while not agent.manager.streams:
            await asyncio.sleep(0.01)
        await agent.stop()  # the agent goes away with a call in flight
        with pytest.raises(HostUnavailableError):
            await call
        assert agent.manager.streams[0].closed.is_set(), "the agent stopped the command of the lost call"
        await agent.start()
        assert (await exec_true(client))["exit_code"] == 3
        assert client.channel is not None and client.channel.is_open


async def test_an_agent_without_the_channel_is_served_over_http() -> None:
    agent = Agent()
    app = Starlette()
    app.state.manager = agent.manager
    app.add_middleware(FastLane, routes=fast_routes(lambda header: header == f"Bearer {TOKEN}"))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=agent.port, log_config=None, lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with HostAgentClient(agent.url, TOKEN) as client:
            assert (await exec_true(client))["stdout"] == "echo hé ✓\n"
            assert (await exec_true(client))["exit_code"] == 3
            assert client.channel is not None and not client.channel.is_open
            assert client.channel.last_failure  # the upgrade was refused: a WebSocket route is not there
    finally:
        server.should_exit = True
        await task


@pytest.mark.root
async def test_a_real_sandbox_over_the_channel_answers_as_over_http(
    host: HostAgentClient, sandbox: dict[str, Any], agent: AgentProcess
) -> None:
    script = "printf 'out ✓\\n'; printf '\\377\\n'; echo err >&2; exit 7"
    async with HostAgentClient(agent.url, AGENT_TOKEN, channel=False) as http:
        over_channel, over_http = await sh(host, sandbox["id"], script), await sh(http, sandbox["id"], script)
    assert host.channel is not None and host.channel.is_open
    for result in (over_channel, over_http):
        assert result.pop("exec_ms") >= 0
    assert over_channel == over_http == {"stdout": "out ✓\n\ufffd\n", "stderr": "err\n", "exit_code": 7}
    big = await sh(host, sandbox["id"], "head -c 6000000 /dev/zero | tr '\\0' a")  # past the 4 MiB cap
    assert big["stdout_truncated"] and len(big["stdout"].encode()) == 4 << 20
    assert (await run(host, sandbox["id"], "cat", stdin="fed\n"))["stdout"] == "fed\n"
    assert (await host.pause_sandbox(sandbox["id"])).status == "paused"
    assert (await host.get_sandbox(sandbox["id"])).status == "paused"
    with pytest.raises(BadStateError):
        await run(host, sandbox["id"], "true")
    assert (await host.resume_sandbox(sandbox["id"])).status == "running"
    assert (await run(host, sandbox["id"], "echo", "back"))["stdout"] == "back\n"


async def test_a_busy_sandbox_is_503_busy_over_the_channel_and_over_http(fake_agent: Agent) -> None:
    """Overload is not failure: the control plane maps ``HostBusyError`` to its 503 with Retry-After."""
    async with (
        HostAgentClient(fake_agent.url, TOKEN) as kept,
        HostAgentClient(fake_agent.url, TOKEN, channel=False) as http,
    ):
        for client in (kept, http):
            with pytest.raises(HostBusyError) as caught:
                await exec_true(client, "sb-busy")
            assert (caught.value.status, caught.value.code) == (503, "busy")
    async with httpx.AsyncClient() as raw:
        answer = await raw.post(
            fake_agent.url + "/internal/v1/sandboxes/sb-busy/exec",
            json={"cmd": "true"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.headers


async def test_stdin_over_its_limit_is_413_at_the_agent_too(fake_agent: Agent) -> None:
    async with HostAgentClient(fake_agent.url, TOKEN) as client:
        with pytest.raises(HostAgentError) as caught:
            await client.exec("sb-1", cmd="cat", args=[], env={}, stdin="x" * ((8 << 20) + 1))
        assert (caught.value.status, caught.value.code) == (413, "payload_too_large")
        assert str(caught.value).startswith("stdin: ")
    assert fake_agent.manager.streams == [], "nothing ran"
