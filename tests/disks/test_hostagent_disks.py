"""The host agent mounts S3 disks with s3fs outside the sandbox and moves them in (real sandboxes,
real s3fs from Debian, a real moto S3 server)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import HostAgentClient
from paddock_hostagent.sandboxes.heartbeat import DISK_CHECK_INTERVAL_S
from paddock_hostagent.schemas import DiskMountBody
from tests.disks.s3server import S3Server
from tests.hostagent.conftest import AgentProcess, Sandboxes, sh
from tests.loopdevices import ImageFile
from tests.network.internet import FakeInternet

pytestmark = [pytest.mark.root, pytest.mark.slow]


def mount_body(server: S3Server, bucket: str, mount_path: str, **overrides: Any) -> DiskMountBody:
    values: dict[str, Any] = {
        "disk_id": "disk_" + secrets.token_hex(6),
        "mount_path": mount_path,
        "bucket": bucket,
        "endpoint": server.endpoint,
        "region": "us-east-1",
        "use_path_style": True,
        "access_key": server.access_key,
        "secret_key": server.secret_key,
    }
    values.update(overrides)
    return DiskMountBody(**values)


async def test_a_file_written_through_the_mount_is_in_the_bucket_and_detach_empties_the_path(
    host: HostAgentClient, sandboxes: Sandboxes, s3: S3Server
) -> None:
    bucket = s3.bucket("hostagent-" + secrets.token_hex(4))
    sandbox = await sandboxes.create()
    view = await host.attach_disk(sandbox["id"], mount_body(s3, bucket, "/mnt/data"))
    assert (view.status, view.error) == ("mounted", None)
    payload = secrets.token_hex(2000)
    written = await sh(host, sandbox["id"], f"printf %s {payload} > /mnt/data/hello.txt && ls /mnt/data")
    assert written["stdout"] == "hello.txt\n", written
    assert s3.s3().get_object(Bucket=bucket, Key="hello.txt")["Body"].read().decode() == payload
    # The sandbox sees neither the credentials nor the host's paths.
    mountinfo = await sh(host, sandbox["id"], "cat /proc/self/mountinfo; ps -ef || true")
    assert s3.secret_key not in mountinfo["stdout"] and "passwd" not in mountinfo["stdout"]
    listed = (await host.get_sandbox(sandbox["id"])).disks
    assert [(d.mount_path, d.status) for d in listed] == [("/mnt/data", "mounted")]

    await host.detach_disk(sandbox["id"], "/mnt/data")
    after = await sh(
        host, sandbox["id"], "ls -A /mnt/data | wc -l; grep -c fuse /proc/self/mountinfo || true"
    )
    assert after["stdout"].split() == ["0", "0"], after
    assert (await host.get_sandbox(sandbox["id"])).disks == []


async def test_sub_path_confines_the_view(host: HostAgentClient, sandboxes: Sandboxes, s3: S3Server) -> None:
    bucket = s3.bucket("subpath-" + secrets.token_hex(4))
    client = s3.s3()
    client.put_object(Bucket=bucket, Key="team-a/inside.txt", Body=b"a")
    client.put_object(Bucket=bucket, Key="team-b/outside.txt", Body=b"b")
    client.put_object(Bucket=bucket, Key="top.txt", Body=b"t")
    sandbox = await sandboxes.create()
    view = await host.attach_disk(sandbox["id"], mount_body(s3, bucket, "/work", sub_path="team-a"))
    assert view.status == "mounted", view.error
    seen = await sh(
        host, sandbox["id"], "ls -A /work; ls /work/../team-b 2>&1 | head -1; echo x > /work/new.txt"
    )
    assert seen["stdout"].splitlines()[0] == "inside.txt", seen
    assert "outside.txt" not in seen["stdout"] and "top.txt" not in seen["stdout"]
    assert client.get_object(Bucket=bucket, Key="team-a/new.txt")["Body"].read() == b"x\n"


async def test_wrong_key_bucket_or_endpoint_fail_with_the_reason_not_a_hang(
    host: HostAgentClient, sandboxes: Sandboxes, s3_checked: S3Server
) -> None:
    bucket = s3_checked.bucket("checked-" + secrets.token_hex(4))
    sandbox = await sandboxes.create()
    cases = {
        "/mnt/badkey": ({"secret_key": "not-the-secret-0123456789"}, "SignatureDoesNotMatch"),
        "/mnt/badbucket": ({"bucket": "no-such-bucket-" + secrets.token_hex(3)}, "NoSuchBucket"),
        "/mnt/badendpoint": ({"endpoint": "http://127.0.0.1:9"}, "connection refused"),
    }
    for path, (overrides, reason) in cases.items():
        body = mount_body(s3_checked, str(overrides.pop("bucket", bucket)), path, **overrides)
        view = await host.attach_disk(sandbox["id"], body)
        assert view.status == "error", (path, view)
        assert reason in (view.error or ""), (path, view.error)
        assert s3_checked.secret_key not in (view.error or "")
    # Nothing half-attached: the sandbox runs, records no disk, and the paths hold no mount.
    assert (await host.get_sandbox(sandbox["id"])).disks == []
    left = await sh(host, sandbox["id"], "grep -c fuse /proc/self/mountinfo || true")
    assert left["stdout"].strip() == "0"


async def test_pause_resume_keeps_the_mount_and_destroy_unmounts(
    host: HostAgentClient, sandboxes: Sandboxes, s3: S3Server
) -> None:
    bucket = s3.bucket("pause-" + secrets.token_hex(4))
    sandbox = await sandboxes.create()
    assert (await host.attach_disk(sandbox["id"], mount_body(s3, bucket, "/data"))).status == "mounted"
    await host.pause_sandbox(sandbox["id"])
    s3.s3().put_object(Bucket=bucket, Key="while-paused.txt", Body=b"p")
    await host.resume_sandbox(sandbox["id"])
    seen = await sh(host, sandbox["id"], "cat /data/while-paused.txt")
    assert seen["stdout"] == "p", seen
    await host.destroy_sandbox(sandbox["id"])
    assert _s3fs_for(sandbox["id"]) == []


async def test_an_s3fs_holds_no_copy_of_its_neighbours_disks(
    agent: AgentProcess, host: HostAgentClient, sandboxes: Sandboxes, s3: S3Server
) -> None:
    """s3fs runs in a copy of the host's mount namespace (its own resolver files). The host's mounts do
    not propagate into such a copy here, so it held every sandbox disk mounted when it started, for as
    long as it ran: a destroyed neighbour's filesystem stayed live and its loop device bound. (Another
    S3 disk's FUSE mount it still holds: that unmount would reach the host's, see nsmount.py.)"""
    neighbour = await sandboxes.create()
    neighbours_disk = mount_body(s3, s3.bucket("neighbour-" + secrets.token_hex(4)), "/data")
    assert (await host.attach_disk(neighbour["id"], neighbours_disk)).status == "mounted"
    slot = agent.record(neighbour["id"])["driver_state"]["slot"]
    backing = Path(f"/sys/block/{os.path.basename(slot['loop_device'])}/loop/backing_file")
    image = ImageFile.of(Path(backing.read_text().strip()))
    sandbox = await sandboxes.create()
    disk = mount_body(s3, s3.bucket("beside-" + secrets.token_hex(4)), "/data")
    assert (await host.attach_disk(sandbox["id"], disk)).status == "mounted"
    (pid,) = _s3fs_for(sandbox["id"])
    held = Path(f"/proc/{pid}/mountinfo").read_text()
    assert slot["dir"] not in held, held

    await host.destroy_sandbox(neighbour["id"])
    assert _s3fs_for(neighbour["id"]) == []
    # This image file, not its path: the pool may park a new sandbox on a new image at the same path.
    assert image.wait_unbound(timeout_s=30), f"{image.path} is still bound while the other s3fs runs"
    done = await sh(host, sandbox["id"], "echo still > /data/still.txt && cat /data/still.txt")
    assert done["stdout"] == "still\n", done


async def test_a_restarted_agent_restores_a_mount_whose_s3fs_died(make_agent: Any, s3: S3Server) -> None:
    agent = make_agent()
    agent.start()
    bucket = s3.bucket("restart-" + secrets.token_hex(4))
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        sandbox = await tracker.create()
        assert (await host.attach_disk(sandbox["id"], mount_body(s3, bucket, "/data"))).status == "mounted"
    agent.stop(signal.SIGKILL)
    for pid in _s3fs_for(sandbox["id"]):  # the mount dies with the agent: only a restore brings it back
        os.kill(pid, signal.SIGKILL)
    agent.start()
    async with agent.client() as host:
        assert [d.status for d in (await host.get_sandbox(sandbox["id"])).disks] == ["mounted"]
        done = await sh(
            host, sandbox["id"], "echo again > /data/after-restart.txt && cat /data/after-restart.txt"
        )
        assert done["stdout"] == "again\n", done
        assert s3.s3().get_object(Bucket=bucket, Key="after-restart.txt")["Body"].read() == b"again\n"
        await host.destroy_sandbox(sandbox["id"])
    assert _s3fs_for(sandbox["id"]) == []


def _s3fs_for(sandbox_id: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"s3fs .*/disks/{sandbox_id}/"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


async def test_a_mount_whose_s3fs_dies_comes_back_while_the_agent_runs(
    host: HostAgentClient, sandboxes: Sandboxes, s3: S3Server
) -> None:
    bucket = s3.bucket("watch-" + secrets.token_hex(4))
    sandbox = await sandboxes.create()
    assert (await host.attach_disk(sandbox["id"], mount_body(s3, bucket, "/data"))).status == "mounted"
    (pid,) = _s3fs_for(sandbox["id"])
    os.kill(pid, signal.SIGKILL)
    broken = await sh(host, sandbox["id"], "ls /data")
    assert broken["exit_code"] != 0, broken  # the mount is dead now
    deadline = time.monotonic() + DISK_CHECK_INTERVAL_S + 20
    while True:  # ends: the agent's check mounted it again, or the assertion
        done = await sh(host, sandbox["id"], "echo back > /data/back.txt && cat /data/back.txt")
        if done["stdout"] == "back\n" or time.monotonic() > deadline:
            assert done["stdout"] == "back\n", done
            break
        await asyncio.sleep(1)
    assert s3.s3().get_object(Bucket=bucket, Key="back.txt")["Body"].read() == b"back\n"
    assert _s3fs_for(sandbox["id"]) not in ([], [pid])
    # A detach removes the new mount and the dead one it covers: the path is the sandbox's own again.
    await host.detach_disk(sandbox["id"], "/data")
    after = await sh(host, sandbox["id"], "ls -A /data | wc -l; grep -c fuse /proc/self/mountinfo || true")
    assert after["stdout"].split() == ["0", "0"], after


async def test_s3fs_resolves_and_connects_under_the_sandboxs_egress_rules(make_agent: Any) -> None:
    """s3fs runs in the sandbox's network namespace: the endpoint's name goes to the sandbox's resolver
    and the connection through its allowlist. An open sandbox and one that allows the endpoint's name
    mount it; one whose rules leave it out cannot, and says so."""
    with FakeInternet() as internet:
        server = S3Server.start(internet=internet)
        try:
            bucket = server.bucket("egress-" + secrets.token_hex(4))
            agent = make_agent(extra_env={"PADDOCK_HOST_DNS_UPSTREAM": internet.dns_upstream})
            agent.start()
            async with agent.client() as host:
                tracker = Sandboxes(host, agent)
                try:
                    outcomes = {}
                    for label, rules in (
                        ("open", []),
                        ("allowed", ["api.example.test"]),
                        ("left out", ["other.example.test"]),
                    ):
                        sandbox = await tracker.create(egress=rules)
                        body = mount_body(server, bucket, "/data", endpoint=server.named_endpoint)
                        view = await host.attach_disk(sandbox["id"], body)
                        if view.status == "mounted":
                            done = await sh(
                                host, sandbox["id"], f"echo {label} > /data/{label[0]}.txt && echo ok"
                            )
                            assert done["stdout"] == "ok\n", (label, done)
                        outcomes[label] = (view.status, view.error or "")
                    assert outcomes["open"] == ("mounted", ""), outcomes
                    assert outcomes["allowed"] == ("mounted", ""), outcomes
                    # The reason names the name that did not resolve, not only s3fs's "unable to connect".
                    status, error = outcomes["left out"]
                    assert status == "error" and "api.example.test did not resolve" in error, outcomes
                    keys = {o["Key"] for o in server.s3().list_objects_v2(Bucket=bucket).get("Contents", [])}
                    assert keys == {"o.txt", "a.txt"}, keys
                finally:
                    await tracker.destroy_all()
        finally:
            server.stop()
