"""E2B's auto-resume through the unmodified ``e2b`` SDK: a sandbox made with
``lifecycle={"on_timeout": "pause", "auto_resume": True}`` and then paused is resumed by the next SDK
call (a file read, a command) or by traffic to one of its ports, with its memory (a process started
before the pause still runs) and a lifetime that starts again, ``max(5 min, its timeout)`` from the
resume; calls that find it paused together share one resume. A request without the sandbox's token does
not wake it. Without ``auto_resume`` the call fails and the sandbox stays paused, as on E2B. ``get_info().lifecycle`` says which. Before, ``autoResume`` was
ignored: every call to a paused sandbox failed."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b.sandbox.sandbox_api import SandboxState

from e2b import Sandbox, SandboxException
from tests.e2b.conftest import E2bPlatform
from tests.e2b.test_api_traffic import serve_app, through_ingress

pytestmark = [pytest.mark.root, pytest.mark.slow]

AUTO_RESUME = {"on_timeout": "pause", "auto_resume": True}


def _left_s(sandbox_id: str) -> float:
    return (Sandbox.get_info(sandbox_id).end_at - dt.datetime.now(dt.UTC)).total_seconds()


def test_an_sdk_call_resumes_a_paused_sandbox_with_its_memory(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(timeout=120, lifecycle=AUTO_RESUME)  # type: ignore[arg-type]
    try:
        assert Sandbox.get_info(sandbox.sandbox_id).lifecycle == {"on_timeout": "pause", "auto_resume": True}
        sandbox.files.write("/tmp/kept.txt", "before the pause")
        sleeper = sandbox.commands.run("sleep 900", background=True, timeout=0)
        sandbox.pause()
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED

        # A sandbox id is no secret: a request that would not be let in does not wake it.
        for token in (None, "ea_" + "0" * 64):
            stranger = httpx.post(
                f"{e2b_env.sandbox_url}/process.Process/List",
                headers={
                    "E2b-Sandbox-Id": sandbox.sandbox_id,
                    "E2b-Sandbox-Port": "49983",
                    "Content-Type": "application/json",
                    **({"X-Access-Token": token} if token else {}),
                },
                content=b"{}",
                timeout=30,
            )
            assert stranger.status_code == 502, stranger.text
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED

        with ThreadPoolExecutor(3) as pool:  # three calls find it paused together: one resume serves them
            reads = [pool.submit(sandbox.files.read, "/tmp/kept.txt") for _ in range(3)]
            assert [read.result(timeout=120) for read in reads] == ["before the pause"] * 3
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
        alive = sandbox.commands.run(f"kill -0 {sleeper.pid} && echo alive")
        assert alive.stdout.strip() == "alive"  # resumed with its memory, not booted again
        # Its lifetime starts again from the resume: five minutes, its own 120 s being shorter.
        assert 240 < _left_s(sandbox.sandbox_id) <= 301

        # And again: the lifecycle holds across cycles, and a command wakes it as a read does.
        sandbox.pause()
        assert sandbox.commands.run("cat /tmp/kept.txt").stdout == "before the pause"
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
    finally:
        sandbox.kill()


def test_traffic_to_a_port_resumes_it_and_starts_its_lifetime_again(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(
        timeout=120,
        lifecycle=AUTO_RESUME,  # type: ignore[arg-type]
        network={"allow_public_traffic": True},
    )
    try:
        host = serve_app(sandbox)
        sandbox.pause()
        answer = through_ingress(host)
        assert answer.status_code == 200 and answer.text.startswith("hello from "), answer.text
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
        assert 240 < _left_s(sandbox.sandbox_id) <= 301  # not left running with no end
    finally:
        sandbox.kill()


def test_without_auto_resume_a_call_fails_and_the_sandbox_stays_paused(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(timeout=120, lifecycle={"on_timeout": "pause"})
    try:
        assert Sandbox.get_info(sandbox.sandbox_id).lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sandbox.pause()
        with pytest.raises(SandboxException):
            sandbox.files.read("/etc/hostname", request_timeout=30)
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
    finally:
        sandbox.kill()


def test_auto_resume_needs_a_pause_that_keeps_the_memory(e2b_env: E2bPlatform) -> None:
    """The SDK refuses these itself; a client that sends them anyway gets a 400 naming the field."""
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
        before = len(Sandbox.list().next_items())
        for extra in ({}, {"autoPause": False}, {"autoPause": True, "autoPauseMemory": False}):
            body = {"templateID": "base", "timeout": 60, "autoResume": {"enabled": True}, **extra}
            refused = http.post("/v2/sandboxes", json=body)
            assert refused.status_code == 400, (extra, refused.text)
            assert "autoResume" in refused.json()["message"]
        wrong = http.post("/v2/sandboxes", json={"templateID": "base", "autoResume": {"enabled": "yes"}})
        assert wrong.status_code == 400 and "autoResume" in wrong.json()["message"], wrong.text
        assert len(Sandbox.list().next_items()) == before  # nothing was made
