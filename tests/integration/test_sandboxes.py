"""Real sandboxes through the public API: control plane + host agent + OCI runtime, no fakes.

Each test is something a user would notice: what a sandbox can see, what its limits do, whether bytes
survive a round trip, whether pause really stops time inside, whether a fork is a copy.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import platform_tier
from tests.live import LivePlatform

pytestmark = pytest.mark.root

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size: creates take a prepared slot


class User:
    """One account's view of the platform; destroys what it created when the test ends."""

    def __init__(self, platform: LivePlatform, plan: str = "pro") -> None:
        self.http = platform.http(platform.api_key(plan))
        self.created: list[str] = []

    def create(self, **body: Any) -> dict[str, Any]:
        body = {"shape": SHAPE, "disk_mib": DISK_MIB, **body}
        response = self.http.post("/v1/sandboxes", json=body)
        assert response.status_code == 200, response.text
        sandbox = response.json()["data"]
        self.created.append(sandbox["id"])
        return dict(sandbox)

    def get(self, sandbox_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/sandboxes/{sandbox_id}")
        assert response.status_code == 200, response.text
        return dict(response.json()["data"])

    def run(self, sandbox_id: str, cmd: str, *args: str, **extra: Any) -> dict[str, Any]:
        response = self.http.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd, "args": list(args), **extra}
        )
        assert response.status_code == 200, response.text
        return dict(response.json()["data"]["result"])

    def sh(self, sandbox_id: str, script: str) -> dict[str, Any]:
        return self.run(sandbox_id, "bash", "-c", script)

    def post(self, sandbox_id: str, action: str, **body: Any) -> httpx.Response:
        return self.http.post(f"/v1/sandboxes/{sandbox_id}/{action}", json=body or None)

    def wait_status(self, sandbox_id: str, wanted: str, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            sandbox = self.get(sandbox_id)
            if sandbox["status"] == wanted or time.monotonic() > deadline:
                assert sandbox["status"] == wanted, sandbox
                return sandbox
            time.sleep(0.1)

    def close(self) -> None:
        for sandbox_id in self.created:
            self.http.delete(f"/v1/sandboxes/{sandbox_id}")
        self.http.close()


@pytest.fixture
def user(platform: LivePlatform) -> Iterator[User]:
    account = User(platform)
    try:
        yield account
    finally:
        account.close()


def test_the_host_agent_logs_a_boot_under_the_create_requests_id(platform: LivePlatform, user: User) -> None:
    """One id follows a request from the control plane into its host call (``X-Request-Id`` over HTTP,
    the call's request id over the kept channel): the agent logs the boot under it."""
    response = user.http.post("/v1/sandboxes", json={"shape": SHAPE, "disk_mib": DISK_MIB})
    assert response.status_code == 200, response.text
    sandbox_id = response.json()["data"]["id"]
    user.created.append(sandbox_id)
    request_id = response.headers["x-request-id"]
    deadline = time.monotonic() + 5
    while True:
        lines = [
            json.loads(line)
            for agent in platform.agents
            for line in agent.log_path.read_text(errors="replace").splitlines()
            if request_id in line
        ]
        boots = [line for line in lines if line.get("event") == "sandbox_created"]
        if boots or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert boots and boots[0]["request_id"] == request_id and boots[0]["sandbox_id"] == sandbox_id, lines


def test_a_sandbox_sees_neither_host_files_nor_host_processes(user: User, tmp_path: Path) -> None:
    secret = Path("/tmp") / f"pdk-host-secret-{secrets.token_hex(4)}"
    secret.write_text("host only")
    try:
        sandbox = user.create(name="isolated")
        sid = sandbox["id"]
        assert user.run(sid, "cat", str(secret))["exit_code"] != 0
        assert user.run(sid, "hostname")["stdout"].strip() == "isolated"
        processes = user.sh(sid, "ps -e -o comm=")["stdout"].split()
        assert "pytest" not in processes and "python3" not in processes and "systemd" not in processes
        assert len(processes) < 10, processes  # the guest agent, bash and ps — not the host's hundreds
        devices = set(user.run(sid, "ls", "/dev")["stdout"].split())
        assert not {d for d in devices if d.startswith(("sd", "vd", "nvme", "loop", "kvm", "mem"))}, devices
        capabilities = user.sh(sid, "grep CapEff /proc/self/status")["stdout"].split()[1]
        assert int(capabilities, 16) & (1 << 21) == 0, "CAP_SYS_ADMIN must be dropped"
        assert user.run(sid, "mount", "-t", "tmpfs", "none", "/mnt")["exit_code"] != 0
        # gVisor reports its loopback address with scope global: count the addresses off loopback.
        addresses = user.sh(sid, "ip -4 -o addr show scope global | grep -v ' lo '")["stdout"]
        assert sandbox["ip"] in addresses and addresses.count("inet ") == 1, addresses
    finally:
        secret.unlink()


def test_a_memory_hog_is_killed_and_the_sandbox_reports_it(platform: LivePlatform, user: User) -> None:
    """On crun/runc the kernel kills the hog and the sandbox lives on. On gVisor the application's
    memory belongs to the sentry (gVisor's kernel, one host process), so the cgroup's OOM kill takes
    the whole sandbox: it ends in ``error``, and the kill is reported all the same."""
    sandbox = user.create()
    sid = sandbox["id"]
    # Bash holding a 400 MB string in a 256 MiB sandbox.
    response = user.http.post(
        f"/v1/sandboxes/{sid}/exec",
        json={
            "cmd": "bash",
            "args": ["-c", "x=$(head -c 400000000 /dev/zero | tr '\\0' x); echo survived ${#x}"],
        },
    )
    if platform_tier(platform) != "gvisor":
        assert response.status_code == 200, response.text
        hog = response.json()["data"]["result"]
        assert hog["exit_code"] != 0 and "survived" not in hog["stdout"], hog
    else:
        assert "survived" not in response.text, response.text
    deadline = time.monotonic() + 15
    while not user.get(sid).get("oom_kills") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (user.get(sid).get("oom_kills") or 0) >= 1
    if platform_tier(platform) == "gvisor":
        stopped = user.wait_status(sid, "error")
        assert "memory" in (stopped.get("status_reason") or ""), stopped
    else:
        assert user.run(sid, "true")["exit_code"] == 0, "the sandbox keeps running after the hog dies"


def test_files_round_trip_byte_exact(user: User, tmp_path: Path) -> None:
    sid = user.create()["id"]
    every_byte = bytes(range(256)) * 4
    put = user.http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/bytes.bin"}, content=every_byte)
    assert put.status_code == 200, put.text
    assert (
        user.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/bytes.bin"}).content == every_byte
    )

    big = tmp_path / "big.bin"
    digest = hashlib.sha256()
    with big.open("wb") as out:
        for _ in range(100):
            chunk = os.urandom(1 << 20)
            digest.update(chunk)
            out.write(chunk)

    def chunks() -> Iterator[bytes]:
        with big.open("rb") as source:
            while block := source.read(1 << 20):
                yield block

    put = user.http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/big.bin"}, content=chunks())
    assert put.status_code == 200, put.text
    inside = user.run(sid, "sha256sum", "/root/big.bin")["stdout"].split()[0]
    assert inside == digest.hexdigest()
    back = hashlib.sha256()
    size = 0
    with user.http.stream("GET", f"/v1/sandboxes/{sid}/files", params={"path": "/root/big.bin"}) as response:
        assert response.status_code == 200
        for block in response.iter_bytes():
            back.update(block)
            size += len(block)
    assert size == 100 << 20 and back.hexdigest() == digest.hexdigest()
    missing = user.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/nope"})
    assert missing.status_code == 404 and missing.json()["status"] == "fail"


def test_stream_frames_arrive_in_order_with_heartbeats(user: User) -> None:
    sid = user.create()["id"]
    body = {"cmd": "bash", "args": ["-c", "echo one; sleep 6; echo two >&2; exit 3"], "stream": True}
    frames: list[tuple[float, dict[str, Any]]] = []
    started = time.monotonic()
    with user.http.stream(
        "POST", f"/v1/sandboxes/{sid}/exec", params={"stream": "true"}, json=body
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        for line in response.iter_lines():
            if line.strip():
                frames.append((time.monotonic() - started, json.loads(line)))
    kinds = [next(iter(frame)) for _, frame in frames]
    assert kinds[-1] == "exit_code" and frames[-1][1] == {"exit_code": 3}
    assert kinds.count("exit_code") == 1
    output = [frame for _, frame in frames if "stdout" in frame or "stderr" in frame]
    assert output == [{"stdout": "one\n"}, {"stderr": "two\n"}]
    heartbeats = [at for at, frame in frames if frame == {"hb": True}]
    assert heartbeats, kinds
    one_at = next(at for at, frame in frames if frame.get("stdout") == "one\n")
    assert one_at < 3, "the first line is flushed at once, not after the command ends"
    assert kinds.index("hb") < kinds.index("stderr"), "a heartbeat comes while the command is silent"


def test_pause_stops_time_inside_and_resume_continues(user: User) -> None:
    sid = user.create()["id"]
    user.sh(sid, "nohup bash -c 'while :; do date +%s%N >> /root/ticks; sleep 0.05; done' >/dev/null 2>&1 &")
    time.sleep(0.5)
    paused = user.post(sid, "pause")
    assert paused.status_code == 200, paused.text
    assert user.get(sid)["status"] == "paused"
    paused_at = time.time_ns()
    time.sleep(1.5)
    resumed_at = time.time_ns()
    assert user.post(sid, "resume").status_code == 200
    time.sleep(0.5)
    ticks = [int(line) for line in user.run(sid, "cat", "/root/ticks")["stdout"].split()]
    during = [tick for tick in ticks if paused_at + 100_000_000 < tick < resumed_at - 100_000_000]
    assert not during, f"{len(during)} ticks while paused"
    assert any(tick > resumed_at for tick in ticks), "the counter runs again after resume"
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) > 1_300_000_000, "the counter stood still for the pause"


def test_a_fork_sees_the_source_files_and_then_diverges(user: User) -> None:
    source = user.create(envs={"GREETING": "hello"})
    sid = source["id"]
    user.sh(sid, "echo from-source > /root/shared.txt")
    forked = user.post(sid, "fork")
    assert forked.status_code == 200, forked.text
    child = forked.json()["data"]
    user.created.append(child["id"])
    assert child["status"] == "forking" and child["id"] != sid
    child = user.wait_status(child["id"], "running")
    assert child["forked_from"] == sid and child["name"] != source["name"]
    assert user.run(child["id"], "cat", "/root/shared.txt")["stdout"] == "from-source\n"
    assert user.run(child["id"], "printenv", "GREETING")["stdout"] == "hello\n"
    assert user.run(child["id"], "hostname")["stdout"].strip() == child["name"]
    user.sh(child["id"], "echo from-fork > /root/shared.txt; touch /root/only-in-fork")
    user.sh(sid, "echo source-again >> /root/shared.txt")
    assert user.run(sid, "cat", "/root/shared.txt")["stdout"] == "from-source\nsource-again\n"
    assert user.run(sid, "ls", "/root/only-in-fork")["exit_code"] != 0
    assert user.run(child["id"], "cat", "/root/shared.txt")["stdout"] == "from-fork\n"
    assert user.get(child["id"])["ip"] != source["ip"]


def test_parallel_creates_never_exceed_the_plan_cap(platform: LivePlatform) -> None:
    account = User(platform, plan="beginner")  # 5 concurrent sandboxes
    try:

        def attempt(index: int) -> httpx.Response:
            with platform.http(account.http.headers["X-API-Key"]) as http:
                return http.post(
                    "/v1/sandboxes", json={"shape": SHAPE, "disk_mib": DISK_MIB, "name": f"race-{index}"}
                )

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(attempt, range(8)))
        created = [r.json()["data"]["id"] for r in responses if r.status_code == 200]
        account.created += created
        refused = [r for r in responses if r.status_code != 200]
        assert len(created) == 5, [r.text for r in refused]
        assert all(r.status_code == 403 for r in refused), [r.text for r in refused]
        assert account.http.get("/v1/whoami").json()["data"]["stats"]["running"] == 5
    finally:
        account.close()


def test_resize_grows_the_disk_of_a_running_sandbox(user: User) -> None:
    sid = user.create()["id"]

    def size_mib() -> int:
        return int(user.sh(sid, "df -m --output=size / | tail -1")["stdout"])

    before = size_mib()
    grown = user.post(sid, "resize", disk_mib=DISK_MIB * 2)
    assert grown.status_code == 200, grown.text
    assert size_mib() > before + DISK_MIB // 2
    shrink = user.post(sid, "resize", disk_mib=DISK_MIB)
    assert shrink.status_code == 400, shrink.text


def test_a_sandbox_can_pause_and_delete_itself(user: User) -> None:
    sid = user.create()["id"]
    asked = user.sh(
        sid, "curl -s -o /dev/null -w '%{http_code}' -X POST 'http://127.0.0.1:1029/self/pause?reason=nap'"
    )
    assert asked["stdout"] == "202", asked
    user.wait_status(sid, "paused")
    assert user.post(sid, "resume").status_code == 200
    assert user.sh(sid, "echo retire > /run/self")["exit_code"] == 0
    user.wait_status(sid, "destroyed")


@pytest.mark.parametrize("route", ["files/list", "files/stat"])
def test_a_file_read_dies_with_its_caller(user: User, route: str) -> None:
    """A listing or a stat runs ``find`` in the sandbox, and the sandbox is the tenant's: a ``find`` they
    replaced, a tree on a throttled disk or a stopped process can make it hang. A client that gives up
    then takes the command with it, as a buffered exec's does, instead of leaving it running (and the
    sandbox counted busy, so never idle-paused) for as long as the command lasts."""
    sid = user.create()["id"]
    # /usr/local/bin comes before /usr/bin on the sandbox's PATH: this is the find the read runs.
    stand_in = "#!/bin/sh\necho $$ > /tmp/find.pid\nexec sleep 300\n"
    placed = user.sh(sid, f"printf '{stand_in}' > /usr/local/bin/find && chmod +x /usr/local/bin/find")
    assert placed["exit_code"] == 0, placed
    with pytest.raises(httpx.ReadTimeout):
        user.http.get(f"/v1/sandboxes/{sid}/{route}", params={"path": "/tmp"}, timeout=2.0)
    pid = user.sh(sid, "cat /tmp/find.pid")["stdout"].strip()
    assert pid.isdigit(), "the read did not run the tenant's find"
    deadline = time.monotonic() + 10
    while user.sh(sid, f"kill -0 {pid}")["exit_code"] == 0:
        assert time.monotonic() < deadline, f"the read's find (pid {pid}) outlived its caller"
        time.sleep(0.2)


def test_a_removal_its_caller_gave_up_on_still_finishes(user: User) -> None:
    """A change is not cut short when its caller leaves, as envd's are not: a tree half removed (or half
    moved across filesystems) would be state half written. The ``rm`` here takes 3 s, the caller waits 1."""
    sid = user.create()["id"]
    slow_rm = '#!/bin/sh\nsleep 3\nexec /usr/bin/rm "$@"\n'
    placed = user.sh(
        sid,
        f"printf '{slow_rm}' > /usr/local/bin/rm && chmod +x /usr/local/bin/rm"
        " && mkdir -p /srv/tree/a/b && touch /srv/tree/a/b/c",
    )
    assert placed["exit_code"] == 0, placed
    with pytest.raises(httpx.ReadTimeout):
        user.http.delete(f"/v1/sandboxes/{sid}/files", params={"path": "/srv/tree"}, timeout=1.0)
    deadline = time.monotonic() + 15
    while user.sh(sid, "test -e /srv/tree")["exit_code"] == 0:
        assert time.monotonic() < deadline, "the removal stopped when its caller left"
        time.sleep(0.2)


def test_commands_get_envs_overrides_stdin_and_start_errors(user: User) -> None:
    sid = user.create(envs={"MODE": "prod"})["id"]
    assert user.run(sid, "printenv", "MODE")["stdout"] == "prod\n"
    assert user.run(sid, "printenv", "MODE", env={"MODE": "test"})["stdout"] == "test\n"
    refused = user.http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true", "env": {"NEW": "x"}})
    assert refused.status_code == 400 and "env.NEW" in refused.text
    assert user.run(sid, "cat", stdin="fed in")["stdout"] == "fed in"
    missing = user.run(sid, "no-such-command")
    assert missing["exit_code"] == -1 and missing["error"]
    assert "prod" not in json.dumps(user.get(sid)), "env values are write-only"


def test_a_buffered_command_dies_with_its_caller(user: User) -> None:
    """A client that gives up on a buffered exec (a timeout, a crash) takes the command with it: the
    disconnect travels control plane -> host agent -> guest agent, which kills the process group."""
    sid = user.create()["id"]
    with pytest.raises(httpx.ReadTimeout):
        user.http.post(
            f"/v1/sandboxes/{sid}/exec",
            json={"cmd": "bash", "args": ["-c", "echo $$ > /tmp/runaway.pid; exec sleep 300"]},
            timeout=2.0,
        )
    pid = user.sh(sid, "cat /tmp/runaway.pid")["stdout"].strip()
    assert pid.isdigit()
    deadline = time.monotonic() + 10
    while user.sh(sid, f"kill -0 {pid}")["exit_code"] == 0:
        assert time.monotonic() < deadline, f"process {pid} outlived its caller"
        time.sleep(0.2)
