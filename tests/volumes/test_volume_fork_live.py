"""A fork that asks for its source's volumes (``include_volumes``, issue #34, docs/volumes.md) on a real
control plane and host agent (crun, runc): the child gets its own copy of each volume, at the same path
and mode, holding what the source wrote; from then on the two diverge. Without the flag the child has
no volume, as before; a non-boolean flag is a 400 naming the field."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.live import LivePlatform
from tests.volumes.test_volumes_live import Account

pytestmark = [pytest.mark.root, pytest.mark.slow]


def fork(account: Account, source: str, **body: Any) -> str:
    answer = account.http.post(f"/v1/sandboxes/{source}/fork", json=body)
    assert answer.status_code == 200, answer.text
    child = str(answer.json()["data"]["id"])
    account.sandboxes.append(child)
    deadline = time.monotonic() + 60
    while True:
        status = account.http.get(f"/v1/sandboxes/{child}").json()["data"]["status"]
        if status == "running" or time.monotonic() > deadline:
            assert status == "running", status
            return child
        time.sleep(0.1)


def mounted(account: Account, sandbox_id: str, path: str) -> int:
    return int(account.out(sandbox_id, f"grep -c ' {path} ' /proc/self/mountinfo || true").strip())


def test_a_fork_with_include_volumes_gets_its_own_copies(platform: LivePlatform, account: Account) -> None:
    data = account.volume("data")
    ref = account.volume("ref")
    source = account.sandbox(
        volumes=[
            {"volume_id": data["id"], "mount_path": "/data"},
            {"volume_id": ref["id"], "mount_path": "/ref", "read_only": True},
        ]
    )
    account.out(source, "echo from-source > /data/f.txt")  # no sync: the fork's copy must hold it

    bad = account.http.post(f"/v1/sandboxes/{source}/fork", json={"include_volumes": "yes"})
    assert bad.status_code == 400 and "include_volumes" in bad.text, bad.text

    child = fork(account, source, include_volumes=True)
    listed = account.http.get("/v1/volumes", params={"limit": 100}).json()["data"]["data"]
    copies = {
        item["attachments"][0]["mount_path"]: item
        for item in listed
        if item["attachments"] and item["attachments"][0]["sandbox_id"] == child
    }
    account.volumes.extend(item["id"] for item in copies.values())
    assert set(copies) == {"/data", "/ref"}, listed
    assert copies["/data"]["name"].startswith("data-fork-") and copies["/data"]["size_mib"] == 1024
    assert copies["/ref"]["attachments"][0]["read_only"] is True
    assert {item["id"] for item in copies.values()}.isdisjoint({data["id"], ref["id"]})
    assert all(item["status"] == "ready" and item["host_id"] == data["host_id"] for item in copies.values())

    assert account.out(child, "cat /data/f.txt") == "from-source\n"
    denied = account.sh(child, "echo x > /ref/new.txt")
    assert denied["exit_code"] != 0 and "Read-only file system" in denied["stderr"], denied

    # From now on each writes its own volume.
    account.out(child, "echo from-child > /data/child.txt && sync")
    account.out(source, "echo again > /data/source.txt && sync")
    assert account.sh(source, "test -e /data/child.txt")["exit_code"] != 0
    assert account.sh(child, "test -e /data/source.txt")["exit_code"] != 0
    assert account.out(source, "cat /data/f.txt") == account.out(child, "cat /data/f.txt") == "from-source\n"

    # The source still holds its own volume read-write (the copy is not a second holder of it).
    held = account.http.get(f"/v1/volumes/{data['id']}").json()["data"]["attachments"]
    assert [a["sandbox_id"] for a in held] == [source], held

    # Without the flag, as before: the child has no volume.
    plain = fork(account, source)
    assert account.sh(plain, "test -e /data/f.txt")["exit_code"] != 0
    assert mounted(account, plain, "/data") == 0 and mounted(account, plain, "/ref") == 0
    after = account.http.get("/v1/volumes", params={"limit": 100}).json()["data"]["data"]
    assert len(after) == len(listed) == 4, after
