"""Hibernation through the public API (issue #34, docs/hibernation.md) on a real control plane, host
agent (crun, else runc), disk store and sandboxes.

A hibernated sandbox's processes, cgroup and network namespace are gone and its memory is free on the
host; it comes back with its files, its processes started afresh, after an agent SIGKILL and after a
simulated reboot too. An agent killed in the middle of a hibernate leaves the sandbox usable. A
hibernated sandbox does not count toward the concurrent cap; woken, it does again. A pause without a
body is still a frozen pause.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostagent.conftest import TOKEN
from tests.live import LivePlatform
from tests.volumes.conftest import platform_on
from tests.volumes.test_volumes_live import simulate_reboot, wait_host

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")


class Account:
    """One user; destroys its sandboxes when the test ends."""

    def __init__(self, platform: LivePlatform, plan: str = "pro") -> None:
        self.platform = platform
        self.http = platform.http(platform.api_key(plan))
        self.sandboxes: list[str] = []

    def create(self, **body: Any) -> httpx.Response:
        answer = self.http.post("/v1/sandboxes", json={"shape": SHAPE, **body})
        if answer.status_code == 200:
            self.sandboxes.append(answer.json()["data"]["id"])
        return answer

    def sandbox(self, **body: Any) -> str:
        answer = self.create(**body)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["data"]["id"])

    def out(self, sandbox_id: str, script: str) -> str:
        answer = self.http.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}
        )
        assert answer.status_code == 200, answer.text
        result = answer.json()["data"]["result"]
        assert result["exit_code"] == 0, result
        return str(result["stdout"])

    def get(self, sandbox_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"])

    def hibernate(self, sandbox_id: str) -> dict[str, Any]:
        answer = self.http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": False})
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["data"])

    def resume(self, sandbox_id: str) -> httpx.Response:
        return self.http.post(f"/v1/sandboxes/{sandbox_id}/resume")

    def wait_status(self, sandbox_id: str, wanted: set[str], timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.get(sandbox_id)
            if view["status"] in wanted or time.monotonic() > deadline:
                assert view["status"] in wanted, view
                return view
            time.sleep(0.2)

    def destroy(self, sandbox_id: str) -> None:
        assert self.http.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 200
        self.wait_status(sandbox_id, {"destroyed"}, 30)

    def close(self) -> None:
        for sandbox_id in self.sandboxes:
            self.http.delete(f"/v1/sandboxes/{sandbox_id}")
        deadline = time.monotonic() + 30
        while self.sandboxes and time.monotonic() < deadline:
            states = {self.get(s)["status"] for s in self.sandboxes}
            if states <= {"destroyed", "failed"}:
                break
            time.sleep(0.1)
        self.http.close()


def record_of(platform: LivePlatform, sandbox_id: str) -> dict[str, Any]:
    """The host agent's record of the sandbox, as it is on disk."""
    path = platform.agents[0].state_dir / "sandboxes" / f"{sandbox_id}.json"
    return dict(json.loads(path.read_text()))


def agent_get(platform: LivePlatform, path: str) -> Any:
    answer = httpx.get(
        f"{platform.agents[0].url}/internal/v1/{path}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None once it is gone (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def netns_names() -> set[str]:
    directory = Path("/run/netns")
    return {path.name for path in directory.iterdir()} if directory.is_dir() else set()


def test_a_hibernated_sandbox_frees_its_memory_and_wakes_with_its_files(
    platform: LivePlatform, account: Account
) -> None:
    sandbox_id = account.sandbox()
    account.out(
        sandbox_id,
        "echo kept > /root/kept.txt; dd if=/dev/zero of=/dev/shm/blob bs=1M count=64 status=none;"
        " (setsid sleep 1000 >/dev/null 2>&1 &); sync",
    )
    running = record_of(platform, sandbox_id)["driver_state"]
    cgroup = CGROUP_MEMORY / running["cgroups_path"].lstrip("/")
    used_before = int((cgroup / "memory.usage_in_bytes").read_text())
    assert used_before >= 64 << 20  # the tmpfs blob is charged to the sandbox
    processes = {int(p): start_ticks(int(p)) for p in (cgroup / "cgroup.procs").read_text().split()}
    assert processes and None not in processes.values()
    netns = f"pdk-{running['slot']['id']}"
    free_before = agent_get(platform, "info")["free_mib"]

    view = account.hibernate(sandbox_id)
    assert view["status"] == "paused" and view["hibernated"] is True

    # Nothing of it runs: its processes, cgroup and network namespace are gone, its memory is the host's.
    assert not cgroup.exists()
    still = {pid: ticks for pid, ticks in processes.items() if start_ticks(pid) == ticks}
    assert still == {}, [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in still]
    assert not any(name.endswith(running["slot"]["id"]) for name in netns_names()), netns
    assert agent_get(platform, "info")["free_mib"] == free_before + 256
    kept = record_of(platform, sandbox_id)
    assert set(kept["driver_state"]) == {"hibernated"}
    host_view = agent_get(platform, f"sandboxes/{sandbox_id}")
    assert host_view["status"] == "paused" and host_view["hibernated"] is True
    # A hibernated sandbox runs nothing: an exec is refused, the status says why.
    refused = account.http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "true"})
    assert refused.status_code == 409, refused.text

    woken = account.resume(sandbox_id)
    assert woken.status_code == 200, woken.text
    assert woken.json()["data"]["status"] == "running"
    assert "hibernated" not in woken.json()["data"]
    assert account.out(sandbox_id, "cat /root/kept.txt") == "kept\n"
    # Its processes started afresh: the sleep is gone, and /dev/shm (memory) was not kept.
    assert account.out(sandbox_id, "pgrep -x sleep || echo none").strip() == "none"
    assert account.out(sandbox_id, "ls /dev/shm").strip() == ""
    account.out(sandbox_id, "echo again > /root/again.txt")
    assert account.out(sandbox_id, "cat /root/kept.txt /root/again.txt") == "kept\nagain\n"
    # A second hibernate and wake of the same sandbox.
    account.hibernate(sandbox_id)
    assert account.resume(sandbox_id).status_code == 200
    assert account.out(sandbox_id, "cat /root/again.txt") == "again\n"


def test_a_hibernated_sandbox_survives_an_agent_sigkill_and_a_reboot(
    platform: LivePlatform, account: Account
) -> None:
    sandbox_id = account.sandbox()
    account.out(
        sandbox_id, "head -c 3000000 /dev/urandom > /root/blob; sha256sum /root/blob > /root/blob.sum"
    )
    account.hibernate(sandbox_id)
    agent = platform.agents[0]
    kept_disk = agent.state_dir / "disks" / "snapshots" / "snap_hibernated" / sandbox_id / "disk.img"
    assert kept_disk.is_file()

    agent.stop(signal.SIGKILL)
    agent.start()
    assert kept_disk.is_file()  # the restarted agent keeps it (its start once swept <state>/disks)
    wait_host(platform, account)
    assert kept_disk.is_file()
    assert account.get(sandbox_id)["hibernated"] is True
    assert agent_get(platform, f"sandboxes/{sandbox_id}")["hibernated"] is True

    simulate_reboot(platform)
    wait_host(platform, account)
    view = account.get(sandbox_id)
    assert view["status"] == "paused" and view["hibernated"] is True
    woken = account.resume(sandbox_id)
    assert woken.status_code == 200, woken.text
    assert woken.json()["data"]["status"] == "running"
    assert "OK" in account.out(sandbox_id, "sha256sum -c /root/blob.sum")


def test_an_agent_killed_mid_hibernate_leaves_the_sandbox_usable(
    platform: LivePlatform, account: Account
) -> None:
    sandbox_id = account.sandbox()
    # A large unsynced write: the hibernate's syncfs writes it back, which takes a while.
    account.out(sandbox_id, "echo before > /root/before.txt; head -c 1200M /dev/zero > /root/big")
    account.out(sandbox_id, "(setsid sleep 1000 >/dev/null 2>&1 &)")
    hibernated_dir = platform.agents[0].state_dir / "disks" / "snapshots" / "snap_hibernated"
    partial = hibernated_dir / f".partial-{sandbox_id}"
    answers: list[httpx.Response | BaseException] = []

    def hibernate() -> None:
        try:
            answers.append(
                account.http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": False})
            )
        except BaseException as exc:
            answers.append(exc)

    caller = threading.Thread(target=hibernate)
    caller.start()
    deadline = time.monotonic() + 30
    while not partial.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert partial.exists(), "the hibernate never started its copy"
    agent = platform.agents[0]
    agent.stop(signal.SIGKILL)
    caller.join(60)
    agent.start()

    # The host holds it as it was before the hibernate: running, not hibernated, the copy gone.
    deadline = time.monotonic() + 30
    while True:
        held = httpx.get(
            f"{agent.url}/internal/v1/sandboxes/{sandbox_id}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        if held.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert held.status_code == 200, held.text
    assert held.json()["status"] == "running" and held.json()["hibernated"] is False
    assert not partial.exists() and not (hibernated_dir / sandbox_id).exists()
    assert "hibernated" not in record_of(platform, sandbox_id)["driver_state"]

    # The control plane learns what the host holds (the reconciler settles the interrupted pause) and
    # the sandbox is usable, its processes as they were.
    view = account.wait_status(sandbox_id, {"running", "paused"}, timeout_s=90)
    if view["status"] == "paused":
        assert "hibernated" not in view
        assert account.resume(sandbox_id).status_code == 200
    assert account.out(sandbox_id, "cat /root/before.txt; pgrep -x sleep >/dev/null && echo alive") == (
        "before\nalive\n"
    )


def test_the_concurrent_cap_counts_a_woken_sandbox_not_a_hibernated_one(platform: LivePlatform) -> None:
    account = Account(platform, plan="free")  # one sandbox at a time
    try:
        first = account.sandbox()
        assert account.create().status_code == 403
        account.hibernate(first)
        second = account.sandbox()  # the hibernated one holds no slot
        refused = account.resume(first)
        assert refused.status_code == 403, refused.text
        assert refused.json()["data"]["code"] == "QUOTA_EXCEEDED"
        assert account.get(first)["hibernated"] is True
        account.destroy(second)
        assert account.resume(first).status_code == 200
        over = account.create()
        assert over.status_code == 403 and over.json()["data"]["code"] == "QUOTA_EXCEEDED"
    finally:
        account.close()


def test_a_pause_without_a_body_is_still_a_frozen_pause(platform: LivePlatform, account: Account) -> None:
    sandbox_id = account.sandbox()
    account.out(sandbox_id, "(setsid sleep 1000 >/dev/null 2>&1 &)")
    pid = account.out(sandbox_id, "pgrep -x sleep").strip()
    paused = account.http.post(f"/v1/sandboxes/{sandbox_id}/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["data"]["status"] == "paused" and "hibernated" not in paused.json()["data"]
    assert "slot" in record_of(platform, sandbox_id)["driver_state"]  # its container is still there
    assert account.resume(sandbox_id).status_code == 200
    assert account.out(sandbox_id, "pgrep -x sleep").strip() == pid  # the same process, never restarted


def test_a_hibernated_sandbox_gets_its_volume_back(platform: LivePlatform, account: Account) -> None:
    made = account.http.post("/v1/volumes", json={"name": "hib-vol", "size_mib": 512})
    assert made.status_code == 200, made.text
    volume_id = made.json()["data"]["id"]
    try:
        sandbox_id = account.sandbox(volumes=[{"volume_id": volume_id, "mount_path": "/data"}])
        account.out(sandbox_id, "echo on-volume > /data/v.txt; sync")
        account.hibernate(sandbox_id)
        # The hibernated sandbox still holds the volume: another writer is refused.
        other = account.create(volumes=[{"volume_id": volume_id, "mount_path": "/data"}])
        assert other.status_code == 409, other.text
        # Its files are read and written while it sleeps, without a sandbox, on the host's mount of
        # the volume that the sleeping sandbox keeps.
        files = f"/v1/volumes/{volume_id}/files"
        assert account.http.get(files, params={"path": "/v.txt"}).content == b"on-volume\n"
        put = account.http.put(files, params={"path": "/while-asleep.txt"}, content=b"zzz\n")
        assert put.status_code == 200, put.text
        assert account.resume(sandbox_id).status_code == 200
        assert account.out(sandbox_id, "cat /data/v.txt; stat -f -c %T /data") == "on-volume\nxfs\n"
        assert account.out(sandbox_id, "cat /data/while-asleep.txt") == "zzz\n"
        account.out(sandbox_id, "echo after > /data/after.txt")
        account.destroy(sandbox_id)
    finally:
        for held in account.sandboxes:
            account.http.delete(f"/v1/sandboxes/{held}")
        for held in account.sandboxes:
            account.wait_status(held, {"destroyed", "failed"}, 30)
        assert account.http.delete(f"/v1/volumes/{volume_id}").status_code == 200


def test_bad_keep_memory_is_a_400_naming_the_field(platform: LivePlatform, account: Account) -> None:
    sandbox_id = account.sandbox()
    for body in ({"keep_memory": "no"}, {"keep_memory": 0}):
        answer = account.http.post(f"/v1/sandboxes/{sandbox_id}/pause", json=body)
        assert answer.status_code == 400, answer.text
        assert "keep_memory" in answer.text
    answer = account.http.post(f"/v1/sandboxes/{sandbox_id}/pause?keep_memory=maybe")
    assert answer.status_code == 400 and "keep_memory" in answer.text
    answer = account.http.post(
        f"/v1/sandboxes/{sandbox_id}/pause", json={"keep_memory": False, "hibernate_after_seconds": 600}
    )
    assert answer.status_code == 400 and "hibernate_after_seconds" in answer.text
    assert account.get(sandbox_id)["status"] == "running"  # nothing changed
    # The query form hibernates too.
    answer = account.http.post(f"/v1/sandboxes/{sandbox_id}/pause?keep_memory=false")
    assert answer.status_code == 200 and answer.json()["data"]["hibernated"] is True


def test_the_sdk_and_the_cli_hibernate(platform: LivePlatform) -> None:
    import paddock

    key = platform.api_key()
    with paddock.Client(platform.url, key) as client, client.sandboxes.create(SHAPE) as sandbox:
        sandbox.write_file("/root/sdk.txt", b"from the sdk")
        info = sandbox.hibernate()
        assert info.status == "paused" and info.hibernated is True
        info = sandbox.resume()
        assert info.status == "running" and info.hibernated is False
        assert sandbox.read_file("/root/sdk.txt") == b"from the sdk"

        env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
        env.update({"PADDOCK_BASE_URL": platform.url, "PADDOCK_API_KEY": key})
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "paddock_cli.main",
                "sandbox",
                "pause",
                "--hibernate",
                sandbox.id,
                "--json",
            ],
            env=env,
            capture_output=True,
            timeout=180,
        )
        assert ran.returncode == 0, ran.stderr.decode()
        assert json.loads(ran.stdout) == [{"id": sandbox.id, "status": "paused", "hibernated": True}]
        assert sandbox.resume().status == "running"
        assert sandbox.read_file("/root/sdk.txt") == b"from the sdk"
        # A frozen pause through the SDK sends no body, as before.
        info = sandbox.pause()
        assert info.status == "paused" and info.hibernated is False
        sandbox.destroy(wait=True)


def test_a_frozen_pause_that_asked_for_it_is_hibernated_later(
    platform: LivePlatform, account: Account
) -> None:
    sandbox_id = account.sandbox()
    account.out(sandbox_id, "echo later > /root/later.txt")
    paused = account.http.post(f"/v1/sandboxes/{sandbox_id}/pause", json={"hibernate_after_seconds": 60})
    assert paused.status_code == 200, paused.text
    view = paused.json()["data"]
    assert view["status"] == "paused" and "hibernated" not in view
    assert view["auto_hibernate_after_seconds"] == 60
    assert "slot" in record_of(platform, sandbox_id)["driver_state"]  # frozen: its container is there

    # A minute passes (the row's paused_at is moved back, in the control plane's own database).
    database = sqlite3.connect(platform.controlplane.state_dir / "controlplane.db")
    try:
        (stamp,) = database.execute("SELECT paused_at FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        earlier = dt.datetime.fromisoformat(stamp) - dt.timedelta(seconds=61)
        with database:
            database.execute(
                "UPDATE sandboxes SET paused_at = ? WHERE id = ?", (earlier.isoformat(sep=" "), sandbox_id)
            )
    finally:
        database.close()
    deadline = time.monotonic() + 30
    while not account.get(sandbox_id).get("hibernated") and time.monotonic() < deadline:
        time.sleep(0.2)
    view = account.get(sandbox_id)
    assert view["status"] == "paused" and view.get("hibernated") is True, view
    assert "auto_hibernate_after_seconds" not in view
    assert set(record_of(platform, sandbox_id)["driver_state"]) == {"hibernated"}
    assert account.resume(sandbox_id).status_code == 200
    assert account.out(sandbox_id, "cat /root/later.txt") == "later\n"


def test_a_gvisor_sandbox_hibernates_with_its_unsynced_writes_and_wakes(
    guest_binary_dir: Path, debian_image: Path
) -> None:
    """On gVisor too: 64 MB written and never synced are there after the wake, byte for byte, and the
    processes started afresh (the host syncs from inside before the disk's copy, as for a fork)."""
    if shutil.which("runsc") is None:
        pytest.skip("no runsc")
    with platform_on("runsc", guest_binary_dir) as live:
        account = Account(live)
        try:
            sandbox_id = account.sandbox()
            account.out(
                sandbox_id,
                "head -c 64M /dev/urandom > /root/blob; echo unsynced > /root/kept.txt; setsid sleep 1000 >/dev/null 2>&1 </dev/null &",
            )
            assert account.out(sandbox_id, "pgrep -x sleep >/dev/null && echo running") == "running\n"
            written = account.out(sandbox_id, "sha256sum < /root/blob")
            view = account.hibernate(sandbox_id)
            assert view["status"] == "paused" and view.get("hibernated") is True, view
            assert record_of(live, sandbox_id)["driver_state"].keys() == {"hibernated"}
            assert account.resume(sandbox_id).status_code == 200
            assert account.out(sandbox_id, "cat /root/kept.txt") == "unsynced\n"
            assert account.out(sandbox_id, "sha256sum < /root/blob") == written
            assert (
                account.out(sandbox_id, "pgrep -x sleep >/dev/null && echo running || echo none") == "none\n"
            )
        finally:
            account.close()


def test_an_agent_killed_after_the_commit_finishes_the_hibernation_at_its_start(
    platform: LivePlatform, account: Account
) -> None:
    """The other side of the commit: the record says hibernated (with the former container to take down)
    but the agent died before taking it down. The state is laid out here as the agent leaves it at that
    instant (its disk cloned into the kept directory, the record saved with ``teardown``); the next agent
    stops what still ran, and the sandbox is hibernated and wakes with its files."""
    sandbox_id = account.sandbox()
    account.out(sandbox_id, "echo committed > /root/c.txt; sync")
    agent = platform.agents[0]
    running = record_of(platform, sandbox_id)
    state = running["driver_state"]
    cgroup = CGROUP_MEMORY / state["cgroups_path"].lstrip("/")
    init = (state["init_pid"], state["init_ticks"])
    agent.stop(signal.SIGKILL)
    assert start_ticks(init[0]) == init[1]  # the sandbox outlives its agent

    kept = agent.state_dir / "disks" / "snapshots" / "snap_hibernated" / sandbox_id
    kept.mkdir(parents=True)
    subprocess.run(
        ["cp", "--reflink=always", state["slot"]["disk_image"], str(kept / "disk.img")], check=True
    )
    meta = {"image": running["image"], "fs": state["slot"]["fs"], "disk_mib": running["disk_mib"]}
    (kept / "meta.json").write_text(json.dumps({**meta, "hibernated_at": time.time(), "was_frozen": False}))
    record = {**running, "state": "paused", "driver_state": {"hibernated": meta, "teardown": state}}
    (agent.state_dir / "sandboxes" / f"{sandbox_id}.json").write_text(json.dumps(record))

    agent.start()
    assert start_ticks(init[0]) != init[1] and not cgroup.exists()  # what still ran is gone
    assert set(record_of(platform, sandbox_id)["driver_state"]) == {"hibernated"}
    assert agent_get(platform, f"sandboxes/{sandbox_id}")["hibernated"] is True
    # The control plane, whose hibernate this was, asks again: the host answers it is done.
    assert account.hibernate(sandbox_id)["hibernated"] is True
    assert account.resume(sandbox_id).status_code == 200
    assert account.out(sandbox_id, "cat /root/c.txt") == "committed\n"
