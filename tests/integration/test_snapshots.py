"""Snapshots through the public API (issue #34, docs/snapshots.md): a copy of a sandbox's disk that
outlives it and boots new sandboxes, on a real control plane, host agent and runtime.

Each test runs on crun, runc and gVisor (whose sentry's cached writes are synced into the disk first);
the VM tier's snapshots, which hold memory too, are in tests/isolation/test_vm_snapshot_api.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import signal
import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import platform_tier
from tests.integration.test_sandboxes import User
from tests.live import LivePlatform

pytestmark = pytest.mark.root


@pytest.fixture
def user(platform: LivePlatform) -> Iterator[User]:
    account = User(platform)
    try:
        yield account
    finally:
        account.close()


def snapshots_on_host(platform: LivePlatform) -> set[str]:
    """The snapshot directories the host agent keeps (whole ones, and partial ones)."""
    found: set[str] = set()
    for agent in platform.agents:
        directory = agent.state_dir / "disks" / "snapshots"
        if directory.is_dir():
            found |= {path.name for path in directory.iterdir()}
    return found


def wait_destroyed(user: User, sandbox_id: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        status = user.get(sandbox_id)["status"]
        if status == "destroyed" or time.monotonic() > deadline:
            assert status == "destroyed"
            return
        time.sleep(0.1)


def test_a_snapshot_boots_twice_each_copy_diverges_and_it_outlives_its_source(
    platform: LivePlatform, user: User
) -> None:
    source = user.create()
    sid = source["id"]
    user.sh(
        sid, "echo before > /root/kept.txt; head -c 5000000 /dev/urandom > /root/blob; sha256sum /root/blob"
    )
    blob_sum = user.run(sid, "sha256sum", "/root/blob")["stdout"].split()[0]
    made = user.post(sid, "snapshots", name="first-snap")
    assert made.status_code == 200, made.text
    snap = made.json()["data"]
    assert snap["id"].startswith("snap_") and snap["name"] == "first-snap" and snap["status"] == "ready"
    assert snap["source_sandbox_id"] == sid and snap["disk_mib"] == source["disk_mib"]
    assert snap["size_bytes"] > 5_000_000  # the blob is in it
    assert snap["id"] in snapshots_on_host(platform)
    # The source goes on (it was frozen only for the copy) and what it writes now is not in the snapshot.
    user.sh(sid, "echo after > /root/later.txt")
    assert user.get(sid)["status"] == "running"

    # Destroying the source leaves the snapshot as it is.
    assert user.http.delete(f"/v1/sandboxes/{sid}").status_code == 200
    wait_destroyed(user, sid)
    assert user.http.get(f"/v1/snapshots/{snap['id']}").json()["data"]["status"] == "ready"
    listed = user.http.get("/v1/snapshots").json()["data"]
    assert [item["id"] for item in listed["data"]] == [snap["id"]] and listed["pagination"]["total"] == 1

    # Two sandboxes from it, by id and by name: each holds the files as they were, and goes its own way.
    first = user.create(rootfs=snap["id"])
    second = user.create(rootfs="first-snap")
    assert first["rootfs"] == snap["id"] and first["status"] == second["status"] == "running"
    for copy in (first, second):
        assert user.run(copy["id"], "cat", "/root/kept.txt")["stdout"] == "before\n"
        assert user.run(copy["id"], "sha256sum", "/root/blob")["stdout"].split()[0] == blob_sum
        assert user.run(copy["id"], "ls", "/root/later.txt")["exit_code"] != 0
        assert user.run(copy["id"], "hostname")["stdout"].strip() == copy["name"]
    user.sh(first["id"], "echo first > /root/kept.txt; touch /root/only-first")
    user.sh(second["id"], "echo second >> /root/kept.txt")
    assert user.run(first["id"], "cat", "/root/kept.txt")["stdout"] == "first\n"
    assert user.run(second["id"], "cat", "/root/kept.txt")["stdout"] == "before\nsecond\n"
    assert user.run(second["id"], "ls", "/root/only-first")["exit_code"] != 0
    assert first["ip"] != second["ip"]

    # Deleting the snapshot leaves the sandboxes booted from it whole; nothing boots from it any more.
    deleted = user.http.delete(f"/v1/snapshots/{snap['id']}")
    assert deleted.status_code == 200, deleted.text
    assert snap["id"] not in snapshots_on_host(platform)
    assert user.http.get(f"/v1/snapshots/{snap['id']}").status_code == 404
    for copy in (first, second):
        assert user.run(copy["id"], "sha256sum", "/root/blob")["stdout"].split()[0] == blob_sum
    user.sh(first["id"], "head -c 3000000 /dev/urandom > /root/more && sync")
    # wc, not stat: the 2022 gVisor answers coreutils' statx with EINVAL
    assert user.run(first["id"], "sh", "-c", "wc -c < /root/more")["stdout"] == "3000000\n"
    gone = user.http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "rootfs": snap["id"]})
    assert gone.status_code == 400 and "rootfs" in gone.json()["data"], gone.text


def test_snapshots_are_the_callers_and_bad_input_names_its_field(platform: LivePlatform, user: User) -> None:
    source = user.create()
    sid = source["id"]
    bad_name = user.post(sid, "snapshots", name="has space")
    assert bad_name.status_code == 400 and "name" in bad_name.json()["data"], bad_name.text
    wrong_type = user.http.post(f"/v1/sandboxes/{sid}/snapshots", json={"name": 5})
    assert wrong_type.status_code == 400 and "name" in wrong_type.text, wrong_type.text
    no_sandbox = user.http.post("/v1/sandboxes/sb-nope/snapshots", json={})
    assert no_sandbox.status_code == 404, no_sandbox.text
    made = user.http.post(f"/v1/sandboxes/{sid}/snapshots")  # no body: a snapshot without a name
    assert made.status_code == 200, made.text
    snap = made.json()["data"]
    assert snap["name"] is None
    try:
        too_small = user.http.post(
            "/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "rootfs": snap["id"], "disk_mib": 1024}
        )
        assert too_small.status_code == 400 and "disk_mib" in too_small.json()["data"], too_small.text
        other = User(platform)
        try:
            assert other.http.get(f"/v1/snapshots/{snap['id']}").status_code == 404
            assert other.http.delete(f"/v1/snapshots/{snap['id']}").status_code == 404
            assert other.http.get("/v1/snapshots").json()["data"]["pagination"]["total"] == 0
            theirs = other.http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "rootfs": snap["id"]})
            assert theirs.status_code == 400 and "rootfs" in theirs.json()["data"], theirs.text
        finally:
            other.close()
        assert user.http.get(f"/v1/snapshots/{snap['id']}").status_code == 200  # still there
    finally:
        assert user.http.delete(f"/v1/snapshots/{snap['id']}").status_code == 200


def test_a_half_written_snapshot_is_removed_when_the_agent_starts_and_never_boots(
    platform: LivePlatform, user: User
) -> None:
    """What an agent killed in the middle of a snapshot leaves (a ``.partial-`` directory under the
    store's snapshots) is not a snapshot: nothing boots it, and the next agent removes it."""
    kept = user.create()  # the store is open
    agent = platform.agents[0]
    partial = agent.state_dir / "disks" / "snapshots" / ".partial-snap_01HALFMADE"
    partial.mkdir(parents=True)
    (partial / "disk.img").write_bytes(b"\0" * 4096)
    try:
        refused = user.http.post(
            "/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "rootfs": "snap_01HALFMADE"}
        )
        assert refused.status_code == 400 and "rootfs" in refused.json()["data"], refused.text
        agent.stop(signal.SIGKILL)
        agent.start()
        deadline = time.monotonic() + 20
        while partial.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not partial.exists()
        assert user.run(kept["id"], "true")["exit_code"] == 0  # the agent adopted its sandbox again
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def test_an_agent_killed_in_the_middle_of_a_snapshot_leaves_the_source_usable_and_no_snapshot(
    platform: LivePlatform, user: User
) -> None:
    """SIGKILL of the host agent while a snapshot is under way (its source frozen for the copy, after a
    large write): the source runs again once the agent is back, with its files; the half-made copy is
    removed and never listed, and the request that asked for it failed."""
    source = user.create(shape="s-2vcpu-2gb", disk_mib=4096)
    sid = source["id"]
    user.sh(sid, "echo kept > /root/kept.txt; sync")
    agent = platform.agents[0]
    snapshots = agent.state_dir / "disks" / "snapshots"
    # The agent is stopped (SIGSTOP) as soon as the snapshot marks its source frozen, then killed. The
    # copy no longer waits on a writeback of the large write (the host writes it back as it is made),
    # so it takes milliseconds and a kill some time after the marker found it done. A snapshot made
    # between two looks at the marker is whole, and of no use here: it is deleted and the kill tried
    # again, on a new large write.
    for _ in range(3):
        user.sh(sid, "head -c 1200M /dev/zero | tr '\\0' x > /root/dirty.bin")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            asked = pool.submit(user.post, sid, "snapshots")
            deadline = time.monotonic() + 20
            while not list(snapshots.glob(".partial-snap_*/thaw-source")) and time.monotonic() < deadline:
                time.sleep(0.002)
            started = bool(list(snapshots.glob(".partial-snap_*/thaw-source")))
            if started and agent.process is not None:
                agent.process.send_signal(signal.SIGSTOP)  # its threads stop where they are, mid-snapshot
            assert started, "the snapshot never started"
            partial = list(snapshots.glob(".partial-snap_*"))
            agent.stop(signal.SIGKILL)
            answered = asked.result(timeout=60)
        if partial and answered.status_code != 200:
            break
        agent.start()  # made before the kill: whole, and removed to try again
        if answered.status_code == 200:
            assert user.http.delete(f"/v1/snapshots/{answered.json()['data']['id']}").status_code == 200
    assert partial, "every snapshot was made before the agent could be stopped"
    assert answered.status_code >= 500, answered.text  # the host went away in the middle
    assert partial[0].exists() and not (snapshots / partial[0].name.removeprefix(".partial-")).exists()
    agent.start()
    deadline = time.monotonic() + 20
    while partial[0].exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not partial[0].exists()
    assert user.run(sid, "cat", "/root/kept.txt")["stdout"] == "kept\n"
    assert user.run(sid, "sh", "-c", "wc -c < /root/dirty.bin")["stdout"] == f"{1200 << 20}\n"
    assert user.get(sid)["status"] == "running"
    assert user.http.get("/v1/snapshots").json()["data"]["pagination"]["total"] == 0
    made = user.post(sid, "snapshots")  # and it can be snapshotted again
    assert made.status_code == 200, made.text
    assert user.http.delete(f"/v1/snapshots/{made.json()['data']['id']}").status_code == 200


def parked_on(platform: LivePlatform, snapshot_id: str) -> list[str]:
    """The host's slots with a sandbox parked on a clone of the snapshot (their ``slot.json``), but for
    those a sandbox claimed (its record names the slot; a claimed slot's ``slot.json`` still says what
    was parked in it, for the next agent to stop should the record never be written)."""
    found: list[str] = []
    for agent in platform.agents:
        records = " ".join(
            path.read_text(errors="replace") for path in (agent.state_dir / "sandboxes").glob("*.json")
        )
        for slot_json in (agent.state_dir / "slots").glob("*/slot.json"):
            if f'"{slot_json.parent.name}"' in records:
                continue
            try:
                parked = json.loads(slot_json.read_text()).get("parked") or {}
            except (OSError, ValueError):  # being rewritten (written to a temporary name, renamed)
                continue
            # init_pid is written once it runs (``Parking.park_image``), when it can be claimed
            if f"/snapshots/{snapshot_id}/disk.img@" in str(parked.get("rootfs", "")) and parked["init_pid"]:
                found.append(slot_json.parent.name)
    return found


def boot_phases(platform: LivePlatform, sandbox_id: str) -> dict[str, object]:
    """The host agent's ``snapshot_boot_phases`` line of the boot of ``sandbox_id``."""
    for line in platform.agents[0].log_path.read_text(errors="replace").splitlines():
        if '"snapshot_boot_phases"' in line and sandbox_id in line:
            return dict(json.loads(line))
    raise AssertionError(f"no snapshot_boot_phases line for {sandbox_id}")


def test_a_boot_from_a_snapshot_claims_a_sandbox_parked_on_it_with_its_bytes_and_its_own_identity(
    platform: LivePlatform, user: User
) -> None:
    """Once a snapshot is taken the host parks a sandbox on a clone of its disk (crun and runc), and a
    boot from it claims that one: it holds the snapshot's files, and its name, address, hosts file,
    disk size and writes are its own, not the parked placeholder's nor the source's. Deleting the
    snapshot stops what is parked on it."""
    if platform_tier(platform) == "gvisor":
        pytest.skip("gVisor parks nothing (runsc); its boots from a snapshot are in the tests above")
    source = user.create()
    sid = source["id"]
    user.sh(sid, "head -c 3000000 /dev/urandom > /root/blob; echo from-source > /root/who")
    blob_sum = user.run(sid, "sha256sum", "/root/blob")["stdout"].split()[0]
    made = user.post(sid, "snapshots", name="parked-snap")
    assert made.status_code == 200, made.text
    snap = made.json()["data"]
    deadline = time.monotonic() + 60
    while not parked_on(platform, snap["id"]):
        assert time.monotonic() < deadline, "no sandbox was parked on the snapshot within 60 s"
        time.sleep(0.1)
    user.sh(sid, "echo after > /root/who")  # the source goes on; the snapshot does not see it

    copy = user.create(rootfs=snap["id"], disk_mib=source["disk_mib"] + 1024)  # grown on claim
    cid = copy["id"]
    assert copy["status"] == "running"
    assert boot_phases(platform, cid)["parked"] is True
    assert user.run(cid, "sha256sum", "/root/blob")["stdout"].split()[0] == blob_sum
    assert user.run(cid, "cat", "/root/who")["stdout"] == "from-source\n"
    assert user.run(cid, "hostname")["stdout"].strip() == copy["name"]
    assert user.run(cid, "cat", "/etc/hostname")["stdout"] == copy["name"] + "\n"
    hosts = user.run(cid, "cat", "/etc/hosts")["stdout"]
    assert f"{copy['ip']}\t{copy['name']}" in hosts and "parked-" not in hosts, hosts
    assert copy["ip"] != source["ip"]
    assert copy["ip"] in user.run(cid, "ip", "-4", "-o", "addr", "show", "eth0")["stdout"]
    size_mib = int(user.sh(cid, "df --output=size -m / | tail -1")["stdout"])
    assert size_mib > source["disk_mib"], size_mib  # the disk it asked for, not the snapshot's
    user.sh(cid, "echo from-copy > /root/who; sync")
    assert user.run(sid, "cat", "/root/who")["stdout"] == "after\n"

    # A second copy, parked or booted, starts from the snapshot again, not from the first copy.
    second = user.create(rootfs="parked-snap")
    assert user.run(second["id"], "cat", "/root/who")["stdout"] == "from-source\n"
    assert user.run(second["id"], "hostname")["stdout"].strip() == second["name"]

    assert user.http.delete(f"/v1/snapshots/{snap['id']}").status_code == 200
    deadline = time.monotonic() + 30
    while parked_on(platform, snap["id"]):
        assert time.monotonic() < deadline, "what was parked on a deleted snapshot is still there"
        time.sleep(0.1)
    assert user.run(cid, "cat", "/root/who")["stdout"] == "from-copy\n"  # its copies stay whole
