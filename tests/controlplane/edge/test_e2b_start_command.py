"""The E2B edge's start and ready commands (start_command.py) over a stand-in host link: the paths a
live create cannot reach in a test's time (a ready command that never passes, 50 s) or at will (the
order of a start command's exit and a ready probe). The live suite, tests/e2b/test_api_start_command.py,
runs the same code with the unmodified SDK on real sandboxes."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

from paddock_controlplane.edge.e2b import start_command
from paddock_controlplane.edge.e2b.start_command import DEFAULT_READY, NotReady, StartCommand
from paddock_hostagent.schemas import ProcessFrame, ProcessOutputRange, ProcessStartBody, ProcessView


def _view(process_id: str, state: str = "running", exit_code: int | None = None) -> ProcessView:
    return ProcessView(
        process_id=process_id,
        kind="process",
        pid=100,
        state=state,  # type: ignore[arg-type]
        leader_exited=state != "running",
        tree_exited=state != "running",
        created_at=dt.datetime.now(dt.UTC).isoformat(),
        exit_code=exit_code,
        cmd="/bin/bash",
        args=[],
        cwd="/",
        output=ProcessOutputRange(oldest_seq=0, newest_seq=0, bytes=0),
    )


class Link:
    """A host link whose ready poll (the last process started) has, at each wait, still run (None) or
    exited with the code in turn from ``polls``, and whose start command has exited with
    ``start_code`` (None: runs on)."""

    def __init__(self, polls: list[int | None], start_code: int | None = None) -> None:
        self.polls = polls
        self.start_code = start_code
        self.started: list[ProcessStartBody] = []
        self.killed: list[str] = []

    async def start_process(self, sandbox_id: str, body: ProcessStartBody) -> ProcessView:
        self.started.append(body)
        return _view(f"p{len(self.started)}")

    async def wait_process(
        self, sandbox_id: str, process_id: str, *, scope: str, timeout_ms: int
    ) -> ProcessView:
        assert timeout_ms <= start_command.WATCH_SLICE_MS
        await asyncio.sleep(0.01)
        code = self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]
        return _view(process_id) if code is None else _view(process_id, "exited", code)

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView:
        if self.start_code is None:
            return _view(process_id)
        return _view(process_id, "exited", self.start_code)

    async def kill_process(self, sandbox_id: str, process_id: str, grace_ms: int) -> ProcessView:
        self.killed.append(process_id)
        return _view(process_id, "exited", -9)

    async def connect_process(
        self, sandbox_id: str, process_id: str, after: int
    ) -> AsyncGenerator[ProcessFrame]:
        async def frames() -> AsyncGenerator[ProcessFrame]:
            data = base64.b64encode(b"listening failed: port in use\n").decode()
            yield ProcessFrame(type="data", seq=1, stream="stderr", data_base64=data)
            yield ProcessFrame(type="exit", exit_code=self.start_code)

        return frames()


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(start_command.envs, "open_sealed", lambda services, sandbox: {"FROM_CREATE": "1"})
    return SimpleNamespace(id="sbx_1", host_id="host_1")


def _on(monkeypatch: pytest.MonkeyPatch, link: Link) -> None:
    async def for_host(services: Any, host_id: str | None) -> Link:
        return link

    monkeypatch.setattr(start_command.hostlink, "for_host", for_host)


def test_e2bs_defaults_fill_what_a_build_leaves_out() -> None:
    assert StartCommand.asked(None, None) is None and StartCommand.asked("", "") is None
    assert StartCommand.asked("serve", None) == StartCommand("serve", DEFAULT_READY)  # sleep 20
    assert StartCommand.asked(None, "test -f /x") == StartCommand("", "test -f /x")
    made = StartCommand("serve", "probe")
    assert StartCommand.from_json(made.as_json()) == made and StartCommand.from_json(None) is None


async def test_the_create_waits_for_the_ready_poll_in_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, sandbox: Any
) -> None:
    link = Link([None, None, 0])
    _on(monkeypatch, link)
    await start_command.run(SimpleNamespace(), sandbox, StartCommand("serve", "probe"), "web")
    serve, poll = link.started
    assert (serve.cmd, serve.args, serve.env) == ("/bin/bash", ["-l", "-c", "serve"], {"FROM_CREATE": "1"})
    assert serve.user is None and serve.cwd is None  # the template's USER and WORKDIR
    # The ready command is the poll's own argument, never spliced into its script.
    assert (poll.cmd, poll.args) == ("/bin/bash", ["-l", "-c", start_command.READY_LOOP, "ready", "probe"])
    assert link.polls == [0] and not link.killed


async def test_a_ready_command_alone_starts_only_the_poll(
    monkeypatch: pytest.MonkeyPatch, sandbox: Any
) -> None:
    link = Link([0])
    _on(monkeypatch, link)
    await start_command.run(SimpleNamespace(), sandbox, StartCommand("", "probe"), "web")
    assert [body.args[-1] for body in link.started] == ["probe"]


async def test_a_start_command_that_fails_first_is_refused_with_its_output(
    monkeypatch: pytest.MonkeyPatch, sandbox: Any
) -> None:
    link = Link([None], start_code=3)
    _on(monkeypatch, link)
    with pytest.raises(NotReady) as refused:
        await start_command.run(SimpleNamespace(), sandbox, StartCommand("serve", "probe"), "web")
    assert refused.value.status == 409 and "templateID" in refused.value.fields
    assert "exited with code 3" in refused.value.message and "port in use" in refused.value.message
    assert link.killed == ["p2"]  # the poll is stopped


async def test_a_start_command_that_exits_0_leaves_the_ready_command_to_decide(
    monkeypatch: pytest.MonkeyPatch, sandbox: Any
) -> None:
    link = Link([None, 0], start_code=0)  # a daemon that forked away
    _on(monkeypatch, link)
    await start_command.run(SimpleNamespace(), sandbox, StartCommand("daemon", "probe"), "web")


async def test_a_ready_command_that_never_passes_is_refused_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, sandbox: Any
) -> None:
    monkeypatch.setattr(start_command, "READY_TIMEOUT_S", 0.3)
    link = Link([None])  # the poll runs on
    _on(monkeypatch, link)
    with pytest.raises(NotReady) as refused:
        await start_command.run(SimpleNamespace(), sandbox, StartCommand("serve", "probe"), "web")
    assert "did not pass within" in refused.value.message and "templateID" in refused.value.fields
    assert link.killed == ["p2"]  # the poll left running is stopped
