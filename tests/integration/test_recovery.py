"""Processes die; sandboxes and records must not. Each test owns its platform so it can kill parts of it."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hostagent.conftest import TOKEN
from tests.integration.test_sandboxes import User
from tests.live import LivePlatform, start_platform

pytestmark = pytest.mark.root


@pytest.fixture
def own_platform(
    debian_image: Path, guest_binary_dir: Path, request: pytest.FixtureRequest
) -> Iterator[LivePlatform]:
    cp_env = getattr(request, "param", None)
    live = start_platform(guest_binary_dir, cp_env=cp_env)
    try:
        yield live
    finally:
        live.stop()


def test_restarting_the_control_plane_loses_nothing(own_platform: LivePlatform) -> None:
    user = User(own_platform)
    running = user.create(name="keeps-running", envs={"TOKEN": "s3cret"})
    paused = user.create(name="keeps-paused")
    assert user.post(paused["id"], "pause").status_code == 200
    user.sh(running["id"], "echo kept > /root/state")
    before = user.http.get("/v1/whoami").json()["data"]["stats"]
    user.http.close()

    own_platform.controlplane.stop()
    own_platform.controlplane.start()

    user.http = own_platform.http(user.http.headers["X-API-Key"])
    assert user.get(running["id"])["status"] == "running"
    assert user.get(paused["id"])["status"] == "paused"
    assert user.run(running["id"], "cat", "/root/state")["stdout"] == "kept\n"
    assert user.run(running["id"], "printenv", "TOKEN")["stdout"] == "s3cret\n", "sealed envs survive"
    assert user.post(paused["id"], "resume").status_code == 200
    after = user.http.get("/v1/whoami").json()["data"]["stats"]
    assert after["running"] == before["running"] + 1
    user.close()


def test_a_restarted_host_agent_adopts_its_running_and_paused_sandboxes(own_platform: LivePlatform) -> None:
    user = User(own_platform)
    running = user.create()
    paused = user.create()
    user.sh(running["id"], "nohup sleep 1000 >/dev/null 2>&1 & echo $! > /root/pid")
    assert user.post(paused["id"], "pause").status_code == 200
    agent = own_platform.agents[0]

    agent.stop(signal.SIGKILL)  # no chance to clean up
    agent.start()

    assert (
        user.run(running["id"], "bash", "-c", "kill -0 $(cat /root/pid) && echo alive")["stdout"] == "alive\n"
    )
    assert user.get(paused["id"])["status"] == "paused"
    assert user.post(paused["id"], "resume").status_code == 200
    assert user.run(paused["id"], "true")["exit_code"] == 0
    # Nothing is marked lost: watched for longer than the control plane waits before it declares a
    # silent host dead (counted from the last heartbeat before the kill, so it has passed by the end),
    # plus a heartbeat interval — the sandboxes stay running and the host active all along.
    dead_after_s = float(own_platform.controlplane.env()["PADDOCK_CP_HOST_DEAD_AFTER_S"])
    watch_until = time.monotonic() + dead_after_s + 2.0
    while time.monotonic() < watch_until:
        assert [user.get(sb["id"])["status"] for sb in (running, paused)] == ["running", "running"]
        assert [host["status"] for host in user.http.get("/v1/hosts").json()["data"]["data"]] == ["active"]
        time.sleep(1)
    assert (
        user.run(running["id"], "bash", "-c", "kill -0 $(cat /root/pid) && echo alive")["stdout"] == "alive\n"
    )
    user.close()


@pytest.mark.parametrize("own_platform", [{"PADDOCK_CP_HOST_DEAD_AFTER_S": "3"}], indirect=True)
def test_a_silent_host_goes_dead_its_sandboxes_error_and_come_back_with_it(
    own_platform: LivePlatform,
) -> None:
    user = User(own_platform)
    sandbox = user.create()
    agent = own_platform.agents[0]
    agent.process.send_signal(signal.SIGSTOP)  # alive but silent, as a hung or partitioned host is
    try:
        errored = user.wait_status(sandbox["id"], "error", timeout_s=20)
        assert errored["status_reason"]
        hosts = user.http.get("/v1/hosts").json()["data"]["data"]
        assert [host["status"] for host in hosts] == ["dead"]
        refused = user.http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "disk_mib": 2048})
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("retry-after")
    finally:
        agent.process.send_signal(signal.SIGCONT)
    # The host comes back with the sandbox intact: it is running again, not lost.
    user.wait_status(sandbox["id"], "running", timeout_s=20)
    assert user.run(sandbox["id"], "true")["exit_code"] == 0
    assert [host["status"] for host in user.http.get("/v1/hosts").json()["data"]["data"]] == ["active"]
    user.close()


@pytest.mark.parametrize("own_platform", [{"PADDOCK_CP_BOOT_TIMEOUT_S": "2"}], indirect=True)
def test_creates_a_killed_control_plane_left_unrecorded_are_settled_by_the_next(
    own_platform: LivePlatform,
) -> None:
    """A control plane SIGKILLed between a create's two transactions leaves the row ``creating`` with
    nothing of the boot recorded. The one started next asks the host once the boot deadline (2 s here)
    plus 20 s has passed: the sandbox the host booted is adopted and works; the one it does not hold
    ends ``failed`` saying why."""
    user = User(own_platform)
    booted, lost = user.create(), user.create()
    key = user.http.headers["X-API-Key"]
    user.http.close()
    controlplane, agent = own_platform.controlplane, own_platform.agents[0]
    controlplane.stop(signal.SIGKILL)
    with sqlite3.connect(controlplane.database_url.split("///", 1)[1]) as db:
        db.executemany(
            "UPDATE sandboxes SET status = 'creating', ip = NULL, running_at = NULL, billed_until = NULL "
            "WHERE id = ?",
            [(booted["id"],), (lost["id"],)],
        )
    gone = httpx.delete(
        f"{agent.url}/internal/v1/sandboxes/{lost['id']}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert gone.status_code == 200, gone.text  # the host never finished this one
    controlplane.start()

    user.http = own_platform.http(key)
    adopted = user.wait_status(booted["id"], "running", timeout_s=60)
    assert adopted["ip"] == booted["ip"]
    assert user.run(booted["id"], "echo", "adopted")["stdout"] == "adopted\n"
    failed = user.wait_status(lost["id"], "failed", timeout_s=30)
    assert (
        failed["status_reason"] == "the control plane handling this create stopped before the sandbox booted"
    )
    user.close()
