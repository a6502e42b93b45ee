"""The host agent as a service: restarts that keep sandboxes, both OCI runtimes, auth, heartbeats."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from paddock_core.http import current_request_id
from paddock_hostagent.client import HostAgentClient, UnknownImageError
from paddock_hostagent.drivers.storage import mounts
from paddock_hostagent.host import kvm_usable, prepare_host
from paddock_hostagent.schemas import CreateSandboxBody, ForkBody
from paddock_hostagent.settings import HostAgentSettings
from tests.conftest import LiveServer
from tests.hostagent.conftest import TOKEN, AgentProcess, Sandboxes, run, sh
from tests.loopdevices import ImageFile, holders

pytestmark = pytest.mark.root


async def test_a_restarted_agent_readopts_running_and_paused_sandboxes(make_agent: Any) -> None:
    agent: AgentProcess = make_agent()
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        running = await tracker.create(name="survivor")
        paused = await tracker.create(name="sleeper")
        await sh(host, running["id"], "echo persisted > /root/state; nohup sleep 1000 >/dev/null 2>&1 &")
        init_before = (await run(host, running["id"], "cut", "-d", " ", "-f", "22", "/proc/1/stat"))["stdout"]
        await host.pause_sandbox(paused["id"])
        forked_id = running["id"] + "-fork"
        tracker.track(forked_id)
        await host.fork_sandbox(running["id"], ForkBody(new_id=forked_id, name="offspring"))

    agent.stop(signal.SIGKILL)  # a crash: no graceful shutdown
    agent.start()

    async with agent.client() as host:
        tracker.host = host
        views = {view.id: view for view in await host.list_sandboxes()}
        assert views[running["id"]].status == "running"
        assert views[paused["id"]].status == "paused"
        assert views[running["id"]].ip == running["ip"]
        result = await sh(host, running["id"], "cat /root/state; pgrep -c sleep; cut -d' ' -f22 /proc/1/stat")
        lines = result["stdout"].splitlines()
        assert lines[:2] == ["persisted", "1"]  # same files, same processes
        assert lines[2] + "\n" == init_before  # the very same init process
        assert views[forked_id].status == "running"
        assert (await sh(host, forked_id, "cat /root/state; hostname"))["stdout"] == "persisted\noffspring\n"
        await host.resume_sandbox(paused["id"])
        assert (await run(host, paused["id"], "hostname"))["stdout"] == "sleeper\n"
        fresh = await tracker.create(name="newcomer")
        assert fresh["ip"] not in {running["ip"], paused["ip"]}
        await tracker.destroy_all()
        assert await host.list_sandboxes() == []


async def test_an_agent_killed_while_a_disk_was_frozen_leaves_it_writable_and_removable(
    make_agent: Any,
) -> None:
    """An agent killed between a ``FIFREEZE`` and its ``FITHAW`` (a fork's or a snapshot's quiesce, a
    grow writing its superblock home) left the sandbox's filesystem frozen: the sandbox's writes
    waited for good, and a freeze holds the filesystem past its unmount, so the destroy left it, its
    loop device and the disk store on the host until a reboot. The next agent thaws what it adopts."""
    agent: AgentProcess = make_agent()
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        sandbox = await tracker.create(name="frozen")
        await sh(host, sandbox["id"], "echo before > /root/state")
        slot = agent.record(sandbox["id"])["driver_state"]["slot"]
        image = ImageFile.of(Path(slot["disk_image"]))
        mounts.freeze_filesystem(Path(slot["disk_mount"]))  # where a killed quiesce stops
    agent.stop(signal.SIGKILL)
    agent.start()

    async with agent.client() as host:
        tracker.host = host
        written = await asyncio.wait_for(
            sh(host, sandbox["id"], "echo after > /root/state; sync; cat /root/state"), 20
        )
        assert written["stdout"] == "after\n"
        await tracker.destroy_all()
    # A frozen filesystem keeps its loop device open past the unmount: still bound to the image, for
    # good. A mount namespace another test's process made meanwhile (a container switching roots, an
    # ``unshare``) holds its copy of the disk for as long as that process lives, so the check waits
    # a while for those to end. It waits for this image file, not its path: the pool may meanwhile
    # rebuild the slot on its recycled network, under the same id, and park a new sandbox on a new
    # image at the same path (CI run 45 named that one's guest agents as the holders).
    released = image.wait_unbound(timeout_s=10)
    assert released, f"the destroyed sandbox's disk outlived it: {holders(image.bound_to())}"


async def test_a_pause_or_resume_answered_right_before_a_crash_holds_after_the_restart(
    make_agent: Any,
) -> None:
    """The agent saves a pause's or resume's record after its answer; a crash in between loses nothing
    a client sees: the restarted agent reads the state back from the freezer."""
    agent: AgentProcess = make_agent()
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        was_running = await tracker.create(name="frozen")
        was_paused = await tracker.create(name="thawed")
        await host.pause_sandbox(was_paused["id"])
        await asyncio.sleep(0.3)  # that pause's record is on disk
        await host.pause_sandbox(was_running["id"])
        await host.resume_sandbox(was_paused["id"])
        agent.stop(signal.SIGKILL)  # at once: the records still say the opposite
    records = {
        sandbox_id: json.loads((agent.state_dir / "sandboxes" / f"{sandbox_id}.json").read_text())["state"]
        for sandbox_id in (was_running["id"], was_paused["id"])
    }
    agent.start()
    async with agent.client() as host:
        tracker.host = host
        views = {view.id: view for view in await host.list_sandboxes()}
        assert views[was_running["id"]].status == "paused", records
        assert views[was_paused["id"]].status == "running", records
        assert (await run(host, was_paused["id"], "hostname"))["stdout"] == "thawed\n"
        await host.resume_sandbox(was_running["id"])
        assert (await run(host, was_running["id"], "hostname"))["stdout"] == "frozen\n"
        await tracker.destroy_all()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
async def test_each_oci_runtime_runs_the_full_lifecycle(make_agent: Any, runtime: str) -> None:
    agent: AgentProcess = make_agent(runtime=runtime, pool_size=1)
    agent.start()
    async with agent.client() as host:
        assert (await host.info()).runtime == runtime
        tracker = Sandboxes(host, agent)
        try:
            created = await tracker.create(name=f"on-{runtime}")
            assert (await run(host, created["id"], "hostname"))["stdout"] == f"on-{runtime}\n"
            await host.pause_sandbox(created["id"])
            await host.resume_sandbox(created["id"])
            child_id = created["id"] + "-f"
            tracker.track(child_id)
            await host.fork_sandbox(
                created["id"], ForkBody(new_id=child_id, name="child", start_paused=False)
            )
            assert (await run(host, child_id, "hostname"))["stdout"] == "child\n"
        finally:
            await tracker.destroy_all()
        assert await host.list_sandboxes() == []


async def test_requests_need_the_bearer_token(agent: AgentProcess) -> None:
    async with httpx.AsyncClient(base_url=agent.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        missing = await http.get("/internal/v1/info")
        assert missing.status_code == 401 and missing.json()["error"] == "unauthorized"
        wrong = await http.get("/internal/v1/info", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = await http.get("/internal/v1/info", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200


async def test_a_call_is_logged_under_the_callers_request_id(agent: AgentProcess) -> None:
    """The control plane's client sends the id of the request it serves; the agent logs under it."""
    request_id = "req_" + secrets.token_hex(8)
    path = "/internal/v1/sandboxes/sb-never-created"
    with structlog.contextvars.bound_contextvars(request_id=request_id):  # as the control plane's middleware
        async with HostAgentClient(agent.url, TOKEN, request_id=current_request_id) as host:
            assert (await host.destroy_sandbox("sb-never-created")).destroyed
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(line) for line in agent.log_path.read_text().splitlines() if request_id in line]
        logged = [line for line in lines if line.get("event") == "request" and line.get("path") == path]
        if logged or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert logged and logged[0]["request_id"] == request_id and logged[0]["method"] == "DELETE", lines


async def test_bad_requests_get_the_error_envelope(agent: AgentProcess, host: HostAgentClient) -> None:
    async with httpx.AsyncClient(base_url=agent.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        response = await http.post("/internal/v1/sandboxes", json={"id": "x"})
        assert response.status_code == 400 and response.json()["error"] == "bad_request"
    with pytest.raises(UnknownImageError):
        await host.create_sandbox(
            CreateSandboxBody(
                id="sb-alpine", name="a", rootfs="alpine:3.20", vcpu=1, mem_mib=256, disk_mib=2048
            )
        )
    info = await host.info()
    assert "alpine:3.20" not in info.buildable  # no mirror configured


@pytest.fixture
async def fake_controlplane() -> AsyncIterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    beats: list[tuple[str, dict[str, Any]]] = []

    async def heartbeat(request: Request) -> JSONResponse:
        beats.append((request.headers.get("authorization", ""), await request.json()))
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/internal/v1/hosts/heartbeat", heartbeat, methods=["POST"])])
    async with LiveServer(app) as server:
        yield server.url, beats


async def test_heartbeats_report_capacity_and_sandboxes(
    make_agent: Any, fake_controlplane: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    url, beats = fake_controlplane
    agent: AgentProcess = make_agent(controlplane_url=url, pool_size=0)
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        created = await tracker.create()
        await asyncio.sleep(1.0)
        auth, beat = beats[-1]
        assert auth == f"Bearer {TOKEN}"
        assert beat["url"] == agent.url and beat["status"] == "active"
        assert beat["vm_count"] == 1 and beat["free_mib"] == beat["total_mib"] - 512
        assert "debian:13" in beat["rootfses"]
        report = beat["sandboxes"][0]
        assert report["id"] == created["id"] and report["status"] == "running" and report["oom_kills"] == 0
        assert report["last_activity_at"] > 0 and "self_request" not in report
        await sh(host, created["id"], "echo park > /run/self")
        for _ in range(50):
            if "self_request" in beats[-1][1]["sandboxes"][0]:
                break
            await asyncio.sleep(0.1)
        assert beats[-1][1]["sandboxes"][0]["self_request"]["action"] == "pause"
        await tracker.destroy_all()


async def test_the_agent_serves_while_the_controlplane_is_down(make_agent: Any) -> None:
    agent: AgentProcess = make_agent(controlplane_url="http://127.0.0.1:9", pool_size=0)
    agent.start()
    await asyncio.sleep(0.5)
    async with agent.client() as host:
        assert (await host.info()).vm_count == 0


def test_prepare_host_is_idempotent(tmp_path: Path) -> None:
    settings = HostAgentSettings(
        state_dir=tmp_path, nft_table=f"pdkprep{os.getpid()}", subnet="10.254.9.0/24"
    )
    try:
        first = prepare_host(settings)
        second = prepare_host(settings)
        assert first == second and first.runtime in ("crun", "runc")
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "1"
        table = subprocess.run(
            ["nft", "list", "table", "ip", settings.nft_table], capture_output=True, text=True
        )
        assert "masquerade" in table.stdout and table.stdout.count("chain postrouting") == 1
        egress = subprocess.run(
            ["nft", "list", "table", "ip", f"{settings.nft_table}_egress"], capture_output=True, text=True
        )
        assert egress.stdout.count("iifname vmap @out_chains") == 1, "the egress table is set up once"
    finally:
        subprocess.run(["nft", "delete", "table", "ip", settings.nft_table], capture_output=True)
        subprocess.run(["nft", "delete", "table", "ip", f"{settings.nft_table}_egress"], capture_output=True)


async def test_an_agent_writes_its_threads_and_tasks_when_signalled_and_goes_on(make_agent: Any) -> None:
    # For a stop that hangs: the harness signals the agent before it kills it (``AgentProcess.stop``).
    agent: AgentProcess = make_agent(controlplane_url="http://127.0.0.1:9", pool_size=0)
    agent.start()
    agent.process.send_signal(signal.SIGUSR1)
    agent.process.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        log = agent.log_path.read_text(errors="replace")
        if "asyncio tasks ---" in log and "Current thread" in log:
            break
        await asyncio.sleep(0.1)
    assert "Current thread" in log, "no thread stacks (faulthandler) in the log"
    assert "asyncio tasks ---" in log and "Stack for <Task" in log, "no task stacks in the log"
    async with agent.client() as host:
        assert (await host.info()).vm_count == 0  # still serving


def test_the_kvm_probe_leaves_nothing_in_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each agent start on runsc_platform=auto probes kvm with `runsc do`. Here a guest on /dev/kvm hangs,
    # the probe is killed, and runsc never removed its runsc-do* bundle: hundreds piled up in /tmp.
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    kvm_usable()
    assert list(temp.iterdir()) == []


async def test_an_image_from_a_mirror_is_built_on_first_demand(make_agent: Any, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for directory in ("bin", "etc", "root", "tmp", "run"):
        (tree / directory).mkdir(parents=True)
    source = tmp_path / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void){puts("hello from a mirrored image");return 0;}\n')
    subprocess.run(["gcc", "-static", "-O2", "-o", str(tree / "bin" / "hello"), str(source)], check=True)
    archive = tmp_path / "rootfs.tar.gz"
    subprocess.run(["tar", "-czf", str(archive), "-C", str(tree), "."], check=True)
    mirrors = json.dumps({"alpine:3.20": f"file://{archive}"})
    image_dir = tmp_path / "images"
    agent: AgentProcess = make_agent(
        pool_size=0,
        extra_env={"PADDOCK_HOST_IMAGE_MIRRORS": mirrors, "PADDOCK_HOST_IMAGE_DIR": str(image_dir)},
    )
    agent.start()
    async with agent.client() as host:
        info = await host.info()
        assert "alpine:3.20" in info.buildable and "alpine:3.20" not in info.rootfses
        tracker = Sandboxes(host, agent)
        try:
            created = await tracker.create(rootfs="alpine:3.20")
            result = await run(host, created["id"], "/bin/hello")
            assert result["stdout"] == "hello from a mirrored image\n"
            assert "alpine:3.20" in (await host.info()).rootfses
        finally:
            await tracker.destroy_all()
