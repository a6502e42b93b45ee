"""The heartbeat (registrar.py) keeps its cadence when reading the sandboxes' counters is slow."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

import httpx
from pydantic import SecretStr

from paddock_hostagent import registrar
from paddock_hostagent.registrar import Registrar
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.schemas import HostInfo
from paddock_hostagent.settings import HostAgentSettings


class StuckCounters:
    """A manager whose counter read never ends, as one queued behind a thousand nftables changes."""

    bridges = None

    def __init__(self) -> None:
        self.reads = 0
        self.release = asyncio.Event()

    async def refresh_usage(self) -> None:
        self.reads += 1
        await self.release.wait()

    def info(self) -> HostInfo:
        return HostInfo(
            id="h1", free_mib=1, total_mib=1, vm_count=0, rootfses=[], buildable=[], labels={}, runtime="crun"
        )

    class heartbeat:  # the manager's ``heartbeat``, of which the registrar asks only this
        @staticmethod
        def sandboxes(*, hibernated: bool = True) -> list[dict[str, Any]]:
            return []

        @staticmethod
        def hibernated_summary() -> dict[str, Any]:
            return {"count": 0, "digest": ""}

        @staticmethod
        def egress_audit() -> dict[str, Any]:
            return {"epoch": "", "seq": 0}


async def test_a_beat_does_not_wait_for_a_slow_counter_read_and_one_read_runs_at_a_time() -> None:
    beats: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        beats.append(json.loads(request.content))
        return httpx.Response(200, json={})

    manager = StuckCounters()
    settings = HostAgentSettings(token=SecretStr("t" * 24), controlplane_url="http://cp.test")
    beat = Registrar(settings, cast(SandboxManager, manager))
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        url = "http://cp.test/internal/v1/hosts/heartbeat"
        started = time.monotonic()
        # Bounded, so a beat that waits for the read fails here instead of hanging the suite.
        assert await asyncio.wait_for(beat.beat(http, url), 10)
        assert await asyncio.wait_for(beat.beat(http, url), 10)
        took = time.monotonic() - started
        assert len(beats) == 2 and beats[0]["id"] == "h1"
        assert took < 2 * registrar.USAGE_WAIT_S + 1.0, took
        assert manager.reads == 1, "the second beat waits on the read still running, not a new one"
        manager.release.set()
        await beat.stop()


async def test_a_stop_ends_even_when_its_beating_task_lost_a_cancel() -> None:
    # On Python 3.11 a cancel that lands as a ``wait_for`` in the task finishes is lost: the task goes
    # on, and the agent's stop waited for it until it was killed. Here the task loses the first one.
    settings = HostAgentSettings(token=SecretStr("t" * 24), controlplane_url="http://cp.test")
    beat = Registrar(settings, cast(SandboxManager, StuckCounters()))
    cancels = 0

    async def beating() -> None:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels += 1
                if cancels > 1:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    beat._task = asyncio.create_task(beating())
    await asyncio.sleep(0)
    started = time.monotonic()
    await asyncio.wait_for(beat.stop(), 30)  # the old stop hung until this bound cancelled it
    assert time.monotonic() - started < 5, "the stop waited for the task that lost its cancel"
    assert cancels == 2 and beat._task is None


class OneAsleep(StuckCounters):
    """A host with one running and one hibernated sandbox, whose counters read at once."""

    async def refresh_usage(self) -> None:
        self.reads += 1

    class heartbeat(StuckCounters.heartbeat):
        @staticmethod
        def sandboxes(*, hibernated: bool = True) -> list[dict[str, Any]]:
            running = [{"id": "sbx-run", "status": "running"}]
            return [*running, {"id": "sbx-asleep", "status": "paused"}] if hibernated else running

        @staticmethod
        def hibernated_summary() -> dict[str, Any]:
            return {"count": 1, "digest": "d"}


async def test_the_hibernated_are_left_out_only_for_a_control_plane_that_answered_ok() -> None:
    """Beats list them until the control plane at that URL answers ``ok``; ``full`` or an answer
    without the field (an older control plane) lists them again; another URL is told apart."""
    answers = iter(
        [{}, {"hibernated_summary": "ok"}, {"hibernated_summary": "ok"}, {"hibernated_summary": "full"}, {}]
    )
    beats: list[tuple[str, dict[str, Any]]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        beats.append((str(request.url), json.loads(request.content)))
        return httpx.Response(200, json=next(answers))

    settings = HostAgentSettings(token=SecretStr("t" * 24), controlplane_url="http://cp.test")
    beat = Registrar(settings, cast(SandboxManager, OneAsleep()))
    first, second = (
        "http://cp.test/internal/v1/hosts/heartbeat",
        "http://cp2.test/internal/v1/hosts/heartbeat",
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        for url in (first, first, second, first, first):
            assert await asyncio.wait_for(beat.beat(http, url), 10)
    listed = [[r["id"] for r in body["sandboxes"]] for _, body in beats]
    assert listed == [
        ["sbx-run", "sbx-asleep"],  # nothing heard yet
        ["sbx-run", "sbx-asleep"],  # the first answer had no field
        ["sbx-run", "sbx-asleep"],  # another control plane: it has not said ok
        ["sbx-run"],  # the first said ok
        ["sbx-run", "sbx-asleep"],  # then full
    ]
    assert [body["hibernated"]["listed"] for _, body in beats] == [True, True, True, False, True]
    assert all(body["hibernated"]["count"] == 1 for _, body in beats)
    await beat.stop()
