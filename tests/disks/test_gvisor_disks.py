"""S3 disks on the gVisor tier (issue #30): bound into the container at its start, since a running
gVisor sandbox's mounts live in its sentry. Real runsc, real s3fs (in the sandbox's network namespace),
a real moto S3 server in a network namespace of its own (tests/disks/s3server.py)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import UnsupportedOnTierError
from tests.disks.s3server import S3Server
from tests.disks.test_hostagent_disks import mount_body
from tests.hostagent.conftest import Sandboxes, sh
from tests.integration.test_disks import Disks
from tests.live import start_platform

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc is not installed"),
]


def _s3fs_for(sandbox_id: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"s3fs .*/disks/{sandbox_id}/"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


async def test_a_gvisor_sandbox_created_with_a_disk_reads_and_writes_the_bucket(
    make_agent: Any, s3: S3Server
) -> None:
    bucket = s3.bucket("gvisor-" + secrets.token_hex(4))
    client = s3.s3()
    payload = secrets.token_hex(3000)
    client.put_object(Bucket=bucket, Key="from-boto.txt", Body=payload.encode())
    agent = make_agent(runtime="runsc", pool_size=0)
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        try:
            sandbox = await tracker.create(disks=[mount_body(s3, bucket, "/data")])
            listed = (await host.get_sandbox(sandbox["id"])).disks
            assert [(d.mount_path, d.status, d.error) for d in listed] == [("/data", "mounted", None)]

            seen = await sh(host, sandbox["id"], "cat /data/from-boto.txt")
            assert seen["stdout"] == payload, seen
            written = await sh(
                host, sandbox["id"], "echo from-gvisor > /data/from-sandbox.txt && sync && echo ok"
            )
            assert written["stdout"] == "ok\n", written
            body = client.get_object(Bucket=bucket, Key="from-sandbox.txt")["Body"].read()
            assert body == b"from-gvisor\n"
            # The sandbox sees neither the credentials nor where the host keeps them.
            inside = await sh(host, sandbox["id"], "cat /proc/self/mountinfo; ls -la / /data")
            assert s3.secret_key not in inside["stdout"] and "passwd" not in inside["stdout"]

            # A live attach is refused by name: gVisor binds host directories only at the start.
            with pytest.raises(UnsupportedOnTierError) as refused:
                await host.attach_disk(sandbox["id"], mount_body(s3, bucket, "/later"))
            assert refused.value.status == 409
            assert "gvisor isolation tier" in str(refused.value) and "mounting an S3 disk" in str(
                refused.value
            )
            # The control plane's mount of a disk named at the create answers with the boot's outcome.
            again = await host.attach_disk(
                sandbox["id"], mount_body(s3, bucket, "/data", disk_id=listed[0].disk_id)
            )
            assert (again.status, again.error) == ("mounted", None)

            assert len(_s3fs_for(sandbox["id"])) == 1
            await host.destroy_sandbox(sandbox["id"])
            assert _s3fs_for(sandbox["id"]) == []
            assert not (Path(agent.state_dir) / "disks" / sandbox["id"]).exists()
        finally:
            await tracker.destroy_all()


async def test_a_disk_that_cannot_mount_is_reported_and_the_gvisor_sandbox_runs(
    make_agent: Any, s3: S3Server
) -> None:
    bucket = s3.bucket("gvbad-" + secrets.token_hex(4))
    agent = make_agent(runtime="runsc", pool_size=0)
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        try:
            bad = mount_body(s3, "no-such-bucket-" + secrets.token_hex(3), "/bad")
            good = mount_body(s3, bucket, "/good")
            sandbox = await tracker.create(disks=[bad, good])
            listed = {d.mount_path: d for d in (await host.get_sandbox(sandbox["id"])).disks}
            assert listed["/good"].status == "mounted", listed
            assert listed["/bad"].status == "error"
            assert "NoSuchBucket" in (listed["/bad"].error or ""), listed
            assert s3.secret_key not in (listed["/bad"].error or "")
            done = await sh(host, sandbox["id"], "echo g > /good/g.txt && sync && ls -A /bad | wc -l")
            assert done["stdout"] == "0\n", done
            assert s3.s3().get_object(Bucket=bucket, Key="g.txt")["Body"].read() == b"g\n"
            await host.destroy_sandbox(sandbox["id"])
            assert _s3fs_for(sandbox["id"]) == []
        finally:
            await tracker.destroy_all()


def test_through_the_api_a_gvisor_sandbox_mounts_its_disk_at_create_and_a_live_attach_is_409(
    guest_binary_dir: Path, s3: S3Server
) -> None:
    """A user's view: the create names the disk, the sandbox reads and writes the bucket; attaching
    another to the running sandbox is a 409 naming the tier, and nothing is attached."""
    platform = start_platform(
        guest_binary_dir,
        cp_env={"PADDOCK_CP_DISK_ALLOW_PRIVATE_ENDPOINTS": "true"},
        agent_options={"runtime": "runsc", "pool_size": 0},
    )
    bodies: list[str] = []
    user = Disks(platform, bodies)
    try:
        bucket = s3.bucket("gvapi-" + secrets.token_hex(4))
        s3.s3().put_object(Bucket=bucket, Key="seed.txt", Body=b"seeded by boto3\n")
        disk = user.disk(s3, "gvdisk", bucket)
        sandbox = user.create(disks=[{"disk_id": "gvdisk", "mount_path": "/mnt/s3"}])
        assert [(m["mount_path"], m["mount_status"]) for m in user.mounts(sandbox["id"])] == [
            ("/mnt/s3", "mounted")
        ]
        done = user.sh(sandbox["id"], "cat /mnt/s3/seed.txt && echo back > /mnt/s3/back.txt && sync")
        assert (done["exit_code"], done["stdout"]) == (0, "seeded by boto3\n"), done
        assert s3.s3().get_object(Bucket=bucket, Key="back.txt")["Body"].read() == b"back\n"

        refused = user.http.post(
            f"/v1/sandboxes/{sandbox['id']}/disks", json={"disk_id": "gvdisk", "mount_path": "/mnt/later"}
        )
        assert refused.status_code == 409, refused.text
        assert "gvisor isolation tier" in refused.text, refused.text
        assert [m["mount_path"] for m in user.mounts(sandbox["id"])] == ["/mnt/s3"]

        # A fork's child has started before its inherited disk could be bound: error, naming the tier.
        child = user.ok(user.http.post(f"/v1/sandboxes/{sandbox['id']}/fork", json={}))
        user.created.append(child["id"])
        deadline = time.monotonic() + 90
        while user.ok(user.http.get(f"/v1/sandboxes/{child['id']}"))["status"] != "running":
            assert time.monotonic() < deadline, "the fork did not come up"
            time.sleep(0.2)
        (inherited,) = user.mounts(child["id"], timeout_s=60)
        assert (inherited["mount_path"], inherited["mount_status"]) == ("/mnt/s3", "error"), inherited
        assert "gvisor isolation tier" in inherited["mount_error"], inherited

        # A detach stops s3fs: the sandbox's path no longer reaches the bucket.
        detached = user.http.delete(
            f"/v1/sandboxes/{sandbox['id']}/disks/{disk['id']}", params={"mount_path": "/mnt/s3"}
        )
        assert user.ok(detached) == {"detached": True}
        gone = user.sh(sandbox["id"], "cat /mnt/s3/seed.txt")
        assert gone["exit_code"] != 0 and "seeded" not in gone["stdout"], gone
        assert _s3fs_for(sandbox["id"]) == []
        assert not any(s3.secret_key in body for body in bodies)
    finally:
        try:
            user.close()
        finally:
            platform.stop()


async def test_a_restarted_agent_keeps_a_live_bound_disk_and_reports_one_whose_s3fs_died(
    make_agent: Any, s3: S3Server
) -> None:
    """After an agent restart the runsc container keeps its bind: a disk whose s3fs lives still serves;
    one whose s3fs died cannot be replaced under the running sandbox, and is reported error saying so."""
    bucket = s3.bucket("gvrestart-" + secrets.token_hex(4))
    agent = make_agent(runtime="runsc", pool_size=0)
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        kept = await tracker.create(disks=[mount_body(s3, bucket, "/data")])
        lost = await tracker.create(disks=[mount_body(s3, bucket, "/data")])
    agent.stop(signal.SIGKILL)
    for pid in _s3fs_for(lost["id"]):
        os.kill(pid, signal.SIGKILL)
    agent.start()
    async with agent.client() as host:
        try:
            assert [d.status for d in (await host.get_sandbox(kept["id"])).disks] == ["mounted"]
            done = await sh(host, kept["id"], "echo after > /data/after.txt && sync && cat /data/after.txt")
            assert done["stdout"] == "after\n", done
            assert s3.s3().get_object(Bucket=bucket, Key="after.txt")["Body"].read() == b"after\n"
            (reported,) = (await host.get_sandbox(lost["id"])).disks
            assert reported.status == "error" and "s3fs serving this disk stopped" in (reported.error or "")
            for sandbox_id in (kept["id"], lost["id"]):
                await host.destroy_sandbox(sandbox_id)
                assert _s3fs_for(sandbox_id) == []
        finally:
            await Sandboxes(host, agent).destroy_all()
