"""S3 disks as users meet them: control plane + host agent + real sandboxes + s3fs + a moto S3 server.

One platform for the module (the default OCI runtime); the restart test kills its agent and s3fs and
starts the agent again. Every response body of the module is kept, and with the control plane's and
the agent's logs, checked at the end for the credentials.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.disks.s3server import S3Server
from tests.live import LivePlatform, start_platform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-1gb"


class Disks:
    """One user's client; keeps every response body to search them for credentials afterwards."""

    def __init__(self, platform: LivePlatform, bodies: list[str]) -> None:
        def keep(response: httpx.Response) -> None:
            response.read()
            bodies.append(response.text)

        self.http = platform.http(platform.api_key("pro"), event_hooks={"response": [keep]})
        self.created: list[str] = []

    def ok(self, response: httpx.Response) -> Any:
        assert response.status_code == 200, response.text
        return response.json()["data"]

    def disk(self, server: S3Server, name: str, bucket: str) -> dict[str, Any]:
        body = {
            "name": name,
            "kind": "s3",
            "config": {
                "bucket": bucket,
                "endpoint": server.endpoint,
                "region": "us-east-1",
                "use_path_style": True,
            },
            "credentials": {"access_key": server.access_key, "secret_key": server.secret_key},
        }
        return dict(self.ok(self.http.post("/v1/disks", json=body)))

    def create(self, **body: Any) -> dict[str, Any]:
        sandbox = dict(
            self.ok(self.http.post("/v1/sandboxes", json={"shape": SHAPE, "disk_mib": 2048, **body}))
        )
        self.created.append(sandbox["id"])
        return sandbox

    def sh(self, sandbox_id: str, script: str) -> dict[str, Any]:
        response = self.http.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}
        )
        return dict(self.ok(response)["result"])

    def mounts(self, sandbox_id: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The sandbox's attachments once none is pending."""
        deadline = time.monotonic() + timeout_s
        while True:
            items = self.ok(self.http.get(f"/v1/sandboxes/{sandbox_id}/disks"))["data"]
            settled = all(item["mount_status"] != "pending" for item in items)
            if settled or time.monotonic() > deadline:
                assert settled, items
                return list(items)
            time.sleep(0.1)

    def attach(self, sandbox_id: str, disk_id: str, mount_path: str, **extra: Any) -> dict[str, Any]:
        body = {"disk_id": disk_id, "mount_path": mount_path, **extra}
        answer = self.ok(self.http.post(f"/v1/sandboxes/{sandbox_id}/disks", json=body))
        assert answer["id"] == sandbox_id and answer["mount_status"] == "pending", answer
        return next(item for item in self.mounts(sandbox_id) if item["mount_path"] == mount_path)

    def close(self) -> None:
        for sandbox_id in self.created:
            self.http.delete(f"/v1/sandboxes/{sandbox_id}")
        self.http.close()


@pytest.fixture(scope="module")
def live(
    debian_image: Path, guest_binary_dir: Path
) -> Iterator[tuple[LivePlatform, S3Server, S3Server, list[str]]]:
    server, checked = S3Server.start(), S3Server.start(auth=True)
    # moto listens on loopback, which the control plane refuses as a disk endpoint unless allowed.
    platform = start_platform(guest_binary_dir, cp_env={"PADDOCK_CP_DISK_ALLOW_PRIVATE_ENDPOINTS": "true"})
    bodies: list[str] = []
    try:
        yield platform, server, checked, bodies
    finally:
        try:
            platform.stop()
        finally:
            server.stop()
            checked.stop()
        left = subprocess.run(["pgrep", "-a", "-x", "s3fs"], capture_output=True, text=True).stdout
        assert "pdkt-" not in left, f"s3fs processes left behind: {left}"


@pytest.fixture
def user(live: tuple[LivePlatform, S3Server, S3Server, list[str]]) -> Iterator[Disks]:
    account = Disks(live[0], live[3])
    try:
        yield account
    finally:
        account.close()


def test_a_file_written_in_one_sandbox_is_read_byte_exact_by_another_and_by_the_s3_api(
    live: tuple[LivePlatform, S3Server, S3Server, list[str]], user: Disks
) -> None:
    server = live[1]
    bucket = server.bucket("shared-" + secrets.token_hex(4))
    disk = user.disk(server, "shared", bucket)
    writer = user.create(disks=[{"disk_id": "shared", "mount_path": "/mnt/shared"}])
    assert [(m["mount_path"], m["mount_status"]) for m in user.mounts(writer["id"])] == [
        ("/mnt/shared", "mounted")
    ]
    wrote = user.sh(
        writer["id"], "head -c 3000000 /dev/urandom > /mnt/shared/blob.bin && sha256sum /mnt/shared/blob.bin"
    )
    assert wrote["exit_code"] == 0, wrote
    digest = wrote["stdout"].split()[0]

    reader = user.create()
    mounted = user.attach(reader["id"], disk["id"], "/data")
    assert (mounted["mount_status"], mounted["disk_id"], mounted["name"]) == ("mounted", disk["id"], "shared")
    read = user.sh(reader["id"], "sha256sum /data/blob.bin")
    assert read["stdout"].split()[0] == digest, read
    body = server.s3().get_object(Bucket=bucket, Key="blob.bin")["Body"].read()
    assert hashlib.sha256(body).hexdigest() == digest and len(body) == 3_000_000


def test_live_attach_then_detach_empties_the_path_and_sub_path_confines(
    live: tuple[LivePlatform, S3Server, S3Server, list[str]], user: Disks
) -> None:
    server = live[1]
    bucket = server.bucket("confine-" + secrets.token_hex(4))
    client = server.s3()
    client.put_object(Bucket=bucket, Key="team-a/mine.txt", Body=b"a")
    client.put_object(Bucket=bucket, Key="team-b/theirs.txt", Body=b"b")
    disk = user.disk(server, "confine", bucket)
    sandbox = user.create()
    assert user.attach(sandbox["id"], "confine", "/mnt/team", sub_path="team-a")["mount_status"] == "mounted"
    seen = user.sh(sandbox["id"], "ls -A /mnt/team; ls -A /mnt/team/.. | grep -c theirs || true")
    assert seen["stdout"].split() == ["mine.txt", "0"], seen
    detached = user.http.delete(
        f"/v1/sandboxes/{sandbox['id']}/disks/{disk['id']}", params={"mount_path": "/mnt/team"}
    )
    assert user.ok(detached) == {"detached": True}
    after = user.sh(sandbox["id"], "ls -A /mnt/team | wc -l")
    assert after["stdout"].strip() == "0", after
    assert user.mounts(sandbox["id"]) == []
    assert client.get_object(Bucket=bucket, Key="team-a/mine.txt")["Body"].read() == b"a"  # untouched
    assert user.ok(user.http.delete("/v1/sandboxes/" + sandbox["id"]))["id"] == sandbox["id"]


def test_wrong_credentials_end_in_error_with_the_reason_and_the_sandbox_runs(
    live: tuple[LivePlatform, S3Server, S3Server, list[str]], user: Disks
) -> None:
    checked = live[2]
    bucket = checked.bucket("checked-" + secrets.token_hex(4))
    wrong = S3Server(
        endpoint=checked.endpoint, process=checked.process, secret_key="not-the-right-secret-000"
    )
    wrong.access_key = checked.access_key
    user.disk(wrong, "wrongkey", bucket)
    started = time.monotonic()
    sandbox = user.create(disks=[{"disk_id": "wrongkey", "mount_path": "/mnt/x"}])
    assert sandbox["status"] == "running" and time.monotonic() - started < 60
    (item,) = user.mounts(sandbox["id"])
    assert item["mount_status"] == "error" and "SignatureDoesNotMatch" in item["mount_error"], item
    assert user.sh(sandbox["id"], "grep -c fuse /proc/self/mountinfo || true")["stdout"].strip() == "0"


def test_pause_resume_keeps_the_mount_and_a_restarted_agent_restores_it(
    live: tuple[LivePlatform, S3Server, S3Server, list[str]], user: Disks
) -> None:
    platform, server = live[0], live[1]
    bucket = server.bucket("durable-" + secrets.token_hex(4))
    user.disk(server, "durable", bucket)
    sandbox = user.create(disks=[{"disk_id": "durable", "mount_path": "/durable"}])
    assert user.sh(sandbox["id"], "echo one > /durable/one.txt")["exit_code"] == 0
    user.ok(user.http.post(f"/v1/sandboxes/{sandbox['id']}/pause"))
    server.s3().put_object(Bucket=bucket, Key="while-paused.txt", Body=b"p")
    user.ok(user.http.post(f"/v1/sandboxes/{sandbox['id']}/resume"))
    assert user.sh(sandbox["id"], "cat /durable/one.txt /durable/while-paused.txt")["stdout"] == "one\np"

    agent = platform.agents[0]
    agent.stop(signal.SIGKILL)
    found = subprocess.run(["pgrep", "-f", f"s3fs .*/disks/{sandbox['id']}/"], capture_output=True, text=True)
    pids = [int(pid) for pid in found.stdout.split()]
    assert pids, "no s3fs serves the sandbox's mount"
    for pid in pids:  # the mount dies with the agent: only a restore brings it back
        subprocess.run(["kill", "-9", str(pid)], check=True)
    agent.start()
    done = user.sh(sandbox["id"], "echo two > /durable/two.txt && cat /durable/one.txt /durable/two.txt")
    assert done["stdout"] == "one\ntwo\n", done
    assert server.s3().get_object(Bucket=bucket, Key="two.txt")["Body"].read() == b"two\n"
    assert [m["mount_status"] for m in user.mounts(sandbox["id"])] == ["mounted"]


def test_a_fork_inherits_the_mount(
    live: tuple[LivePlatform, S3Server, S3Server, list[str]], user: Disks
) -> None:
    server = live[1]
    bucket = server.bucket("fork-" + secrets.token_hex(4))
    user.disk(server, "forked", bucket)
    source = user.create(disks=[{"disk_id": "forked", "mount_path": "/shared"}])
    assert user.sh(source["id"], "echo before > /shared/before.txt")["exit_code"] == 0
    child = user.ok(user.http.post(f"/v1/sandboxes/{source['id']}/fork", json={}))
    user.created.append(child["id"])
    deadline = time.monotonic() + 60
    while user.ok(user.http.get(f"/v1/sandboxes/{child['id']}"))["status"] != "running":
        assert time.monotonic() < deadline, "the fork did not come up"
        time.sleep(0.2)
    assert [(m["mount_path"], m["mount_status"]) for m in user.mounts(child["id"])] == [
        ("/shared", "mounted")
    ]
    assert (
        user.sh(child["id"], "cat /shared/before.txt; echo child > /shared/child.txt")["stdout"] == "before\n"
    )
    assert user.sh(source["id"], "cat /shared/child.txt")["stdout"] == "child\n"


def test_the_cli_registers_mounts_lists_detaches_and_deletes(
    live: tuple[LivePlatform, S3Server, S3Server, list[str]], user: Disks
) -> None:
    platform, server = live[0], live[1]
    bucket = server.bucket("cli-" + secrets.token_hex(4))
    server.s3().put_object(Bucket=bucket, Key="hello.txt", Body=b"from s3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDOCK_", "AWS_"))}
    env.update({"PADDOCK_BASE_URL": platform.url, "PADDOCK_API_KEY": user.http.headers["X-API-Key"]})

    def cli(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "paddock_cli.main", "disk", *args],
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    made = cli(
        "create", "cli-disk", "--bucket", bucket, "--endpoint", server.endpoint, "--path-style", "--json",
        AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    disk = json.loads(made.stdout)
    assert server.secret_key not in made.stdout + made.stderr
    sandbox = user.create()
    attached = cli("attach", sandbox["id"], "cli-disk", "/mnt/cli", "--json")
    assert attached.returncode == 0, attached.stderr
    assert json.loads(attached.stdout)["mount_status"] == "mounted"
    assert user.sh(sandbox["id"], "cat /mnt/cli/hello.txt")["stdout"] == "from s3"
    listed = cli("mounts", sandbox["id"])
    assert listed.returncode == 0 and "/mnt/cli" in listed.stdout and "mounted" in listed.stdout
    assert cli("rm", "cli-disk").returncode == 1  # in use
    assert cli("detach", sandbox["id"], disk["id"], "/mnt/cli").returncode == 0
    assert user.sh(sandbox["id"], "ls -A /mnt/cli | wc -l")["stdout"].strip() == "0"
    assert cli("rm", "cli-disk").returncode == 0
    assert cli("get", "cli-disk").returncode == 4  # not found


def test_credentials_appear_in_no_response_and_no_log_line(
    live: tuple[LivePlatform, S3Server, S3Server, list[str]],
) -> None:
    """Runs last in the module: it reads what the tests above produced."""
    platform, server, checked, bodies = live
    assert len(bodies) > 20
    secrets_ = [
        server.secret_key,
        checked.secret_key,
        "not-the-right-secret-000",
        server.access_key,
        checked.access_key,
    ]
    logs = {
        "control plane": platform.controlplane.log_path.read_text(errors="replace"),
        **{f"agent {a.state_dir}": a.log_path.read_text(errors="replace") for a in platform.agents},
    }
    assert "disk_mounted" in "".join(logs.values())  # the logs do cover the mounts
    for secret in secrets_:
        assert not [body for body in bodies if secret in body], secret
        assert not [name for name, text in logs.items() if secret in text], secret
