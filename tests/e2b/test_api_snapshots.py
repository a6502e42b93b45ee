"""E2B's snapshots on Paddock's snapshots and its filesystem-only pause on hibernation, through the
unmodified ``e2b`` SDK configured only by the three variables: a sandbox that wrote a file is
snapshotted and killed, two sandboxes boot from the snapshot (by id and by name) with the file and
diverge; the SDK's listing pages and filters it; its delete removes it. ``mode="full"`` on a container
sandbox is refused in E2B's shape naming ``memory``. A ``mode="filesystem"`` pause keeps the files and
not the processes. ``@e2b``'s JS SDK takes, boots, lists and deletes one under Node
(``js/snapshots.mjs``)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from e2b import Sandbox, SandboxException, SandboxState
from tests.e2b.conftest import E2bPlatform

pytestmark = pytest.mark.root

JS = Path(__file__).with_name("js")

#: How many ``sleep`` processes run in the sandbox (its image has no pgrep).
SLEEPS = "cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sleep || true"


def start_sleep(sandbox: Sandbox) -> None:
    """``sleep 900`` in the background, running once this returns: E2B runs a command as ``bash -l -c``,
    and a background start answers once bash runs, so its ``sleep`` may come a moment later (on a
    loaded box, after the next command looked)."""
    sandbox.commands.run("sleep 900", background=True)
    deadline = time.monotonic() + 20
    while (count := sandbox.commands.run(SLEEPS).stdout.strip()) != "1" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert count == "1", "the background sleep never started"


@pytest.fixture(autouse=True)
def container_tier(e2b_platform: E2bPlatform) -> None:
    """A container or gVisor snapshot holds no memory (the ``mode="full"`` refusal is about them)."""
    runtime = e2b_platform.platform.agents[0].runtime
    if runtime not in ("auto", "crun", "runc", "runsc"):
        pytest.skip(f"these cases are about a filesystem-only tier; the agent runs {runtime}")


def _snapshot_ids(**filters: object) -> list[str]:
    """Every page of the SDK's listing, one snapshot a page, so that its paging is used."""
    paginator = Sandbox.list_snapshots(limit=1, **filters)  # type: ignore[arg-type]
    seen: list[str] = []
    while paginator.has_next:
        seen += [item.snapshot_id for item in paginator.next_items()]
    return seen


def test_a_snapshot_boots_sandboxes_that_diverge(e2b_env: E2bPlatform) -> None:
    name = f"e2b-snap-{secrets.token_hex(3)}"
    booted: list[Sandbox] = []
    made: list[str] = []
    source = Sandbox.create(timeout=300)
    try:
        source.files.write("/var/tmp/snap/note.txt", "written before the snapshot\n")
        snap = source.create_snapshot(name=name)
        made.append(snap.snapshot_id)
        assert snap.snapshot_id.startswith("snap_") and snap.names == [name], snap
        source.files.write("/var/tmp/snap/after.txt", "written after the snapshot\n")

        # E2B's default kind is a full one (memory too); asked for explicitly it is refused here, and a
        # filesystem-only one (what a container snapshot is) is served
        with pytest.raises(SandboxException, match="memory") as full:
            source.create_snapshot(mode="full")
        assert getattr(full.value, "status_code", 501) == 501
        plain = source.create_snapshot(mode="filesystem")
        made.append(plain.snapshot_id)
        assert plain.names == []
        with pytest.raises(SandboxException, match="name"):  # a taken name (E2B adds a build instead)
            source.create_snapshot(name=name)

        # a sandbox's access token works on its sandbox, but not for a snapshot (as on /v1)
        with e2b_env.platform.http(e2b_env.api_key) as native:
            minted = native.post(f"/v1/sandboxes/{source.sandbox_id}/access-token", json={})
            assert minted.status_code in (200, 201), minted.text
        token = minted.json()["data"]["token"]
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": token}, timeout=60) as scoped:
            assert scoped.get(f"/sandboxes/{source.sandbox_id}").status_code == 200
            refused = scoped.post(f"/sandboxes/{source.sandbox_id}/snapshots", json={})
            assert refused.status_code == 403 and refused.json()["code"] == 403, refused.text

        assert _snapshot_ids(sandbox_id=source.sandbox_id) == [snap.snapshot_id, plain.snapshot_id]
        assert _snapshot_ids(name=name) == [snap.snapshot_id]
        source.kill()

        by_id = Sandbox.create(snap.snapshot_id, timeout=300)
        booted.append(by_id)
        by_name = Sandbox.create(name, timeout=300)
        booted.append(by_name)
        assert by_id.get_info().template_id == snap.snapshot_id
        for copy in (by_id, by_name):
            assert copy.files.read("/var/tmp/snap/note.txt") == "written before the snapshot\n"
            assert not copy.files.exists("/var/tmp/snap/after.txt")
        by_id.files.write("/var/tmp/snap/note.txt", "changed in the first copy\n")
        by_name.commands.run("rm /var/tmp/snap/note.txt && echo mine > /var/tmp/snap/own.txt")
        assert by_id.files.read("/var/tmp/snap/note.txt") == "changed in the first copy\n"
        assert not by_id.files.exists("/var/tmp/snap/own.txt")
        assert not by_name.files.exists("/var/tmp/snap/note.txt")

        # the SDK deletes a snapshot through the template route; the copies keep their disks
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        made.remove(snap.snapshot_id)
        assert snap.snapshot_id not in _snapshot_ids()
        assert by_id.files.read("/var/tmp/snap/note.txt") == "changed in the first copy\n"
        with pytest.raises(Exception, match=name):
            Sandbox.create(name, timeout=60)
    finally:
        for copy in booted:
            copy.kill()
        Sandbox.kill(source.sandbox_id)
        for snapshot_id in made:
            Sandbox.delete_snapshot(snapshot_id)


def test_snapshot_refusals_are_e2b_shaped(e2b_env: E2bPlatform) -> None:
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60) as api:
        missing = api.post("/sandboxes/sb-01jnosuchsandbox000000000000/snapshots", json={})
        assert missing.status_code == 404 and missing.json()["code"] == 404, missing.text
        typed = api.post("/sandboxes/sb-01jnosuchsandbox000000000000/snapshots", json={"memory": "no"})
        assert typed.status_code == 400 and typed.json()["message"].startswith("memory"), typed.text
        for params in ({"limit": "none"}, {"limit": "0"}, {"nextToken": "x"}):
            bad = api.get("/snapshots", params=params)
            assert bad.status_code == 400 and bad.json()["code"] == 400, (params, bad.text)
            assert next(iter(params)) in bad.json()["message"]
        assert api.delete("/templates/snap_nothing").status_code == 404


def test_a_filesystem_pause_keeps_files_not_processes(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(timeout=300)
    try:
        sandbox.files.write("/var/tmp/kept.txt", "on the disk\n")
        start_sleep(sandbox)
        assert sandbox.pause(mode="filesystem") is True
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
        woken = Sandbox.connect(sandbox.sandbox_id, timeout=300)
        assert woken.files.read("/var/tmp/kept.txt") == "on the disk\n"
        assert woken.commands.run(SLEEPS).stdout.strip() == "0"  # the processes started afresh
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_the_js_sdk_snapshot_round_trip(e2b_platform: E2bPlatform) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed (scripts/setup-host.sh installs it)"
    assert (JS / "node_modules" / "e2b").is_dir(), "run make setup-test (npm ci in tests/e2b/js)"
    env = {key: value for key, value in os.environ.items() if not key.startswith("E2B_")} | e2b_platform.env
    env["PADDOCK_E2B_SNAPSHOT"] = f"e2b-js-{secrets.token_hex(3)}"
    done = subprocess.run(
        [node, "snapshots.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "names": [env["PADDOCK_E2B_SNAPSHOT"]],
        "read": "from js\n",
        "listed": [True],
        "deleted": True,
        "deletedAgain": False,
    }
