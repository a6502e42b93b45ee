"""A snapshot whose control plane was SIGKILLed while its host copied the disk (issue #34): the row the
dead process wrote ``creating`` is settled by the next control plane, from what the real host agent
holds. The agent finished the copy after its caller died, so the snapshot is whole there: it becomes
``ready`` with its size, and boots with the source's files. A second row left so, of a snapshot the
host never held, is removed.

The reconciler waits until no live process could still be copying (its host call's timeout, 925 s);
the test moves the row's ``created_at`` back by that much in the dead control plane's database rather
than wait. tests/controlplane/workers/test_orphaned_snapshots.py has the other outcomes (nothing whole
on the host: removed there and the row gone; a host that does not answer) on both database engines.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from paddock_controlplane.workers import reconciler
from paddock_core.ids import new_id
from tests.integration.test_sandboxes import User
from tests.live import start_platform

# Its own platform, started, its control plane killed and started again: 40-70 s on this box.
pytestmark = [pytest.mark.root, pytest.mark.slow]


def _move_back(database: Path, snapshot_id: str, seconds: float) -> str:
    """Moves the row's ``created_at`` back by ``seconds``; returns its status."""
    with sqlite3.connect(database) as db:
        status, created_at = db.execute(
            "SELECT status, created_at FROM snapshots WHERE id = ?", (snapshot_id,)
        ).fetchone()
        earlier = dt.datetime.fromisoformat(created_at) - dt.timedelta(seconds=seconds)
        db.execute(
            "UPDATE snapshots SET created_at = ? WHERE id = ?",
            (earlier.isoformat(sep=" ", timespec="microseconds"), snapshot_id),
        )
    return str(status)


def _another_left_creating(database: Path, snapshot_id: str) -> str:
    """A second row as the dead process left it, of a snapshot whose host never began one."""
    lost = new_id("snap_")
    columns = "user_id, status, host_id, source_sandbox_id, image, disk_mib, size_bytes, created_at"
    with sqlite3.connect(database) as db:
        db.execute(
            f"INSERT INTO snapshots (id, {columns}) SELECT ?, {columns} FROM snapshots WHERE id = ?",
            (lost, snapshot_id),
        )
    return lost


def test_a_snapshot_left_creating_by_a_killed_control_plane_is_ready_once_the_next_one_asks_its_host(
    debian_image: Path, guest_binary_dir: Path
) -> None:
    live = start_platform(guest_binary_dir)
    user = User(live)
    try:
        sid = user.create()["id"]
        # A write not yet on disk: the copy's syncfs writes it back, time enough to see the copy begun.
        user.sh(
            sid, "echo kept > /root/kept.txt; sync; head -c 300M /dev/zero | tr '\\0' x > /root/dirty.bin"
        )
        agent = live.agents[0]
        assert agent.process is not None
        snapshots = agent.state_dir / "disks" / "snapshots"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            asked = pool.submit(user.post, sid, "snapshots")
            deadline = time.monotonic() + 20
            while not list(snapshots.glob(".partial-snap_*/thaw-source")) and time.monotonic() < deadline:
                time.sleep(0.002)
            # The agent is held still while its caller dies, so the copy is surely unfinished then.
            agent.process.send_signal(signal.SIGSTOP)
            try:
                [partial] = list(snapshots.glob(".partial-snap_*"))
                live.controlplane.stop(signal.SIGKILL)
            finally:
                agent.process.send_signal(signal.SIGCONT)
            with pytest.raises(httpx.TransportError):
                asked.result(timeout=60)
        snapshot_id = partial.name.removeprefix(".partial-")

        # The agent finishes the copy its caller no longer waits for.
        deadline = time.monotonic() + 60
        while not (snapshots / snapshot_id / "meta.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (snapshots / snapshot_id / "meta.json").exists() and not partial.exists()
        database = live.controlplane.state_dir / "controlplane.db"
        bound_s = reconciler.snapshot_orphaned_after_s(0)
        assert _move_back(database, snapshot_id, bound_s + 60) == "creating"
        lost = _another_left_creating(database, snapshot_id)

        live.controlplane.start()
        user.http = live.http(str(user.http.headers["X-API-Key"]))
        deadline = time.monotonic() + 30
        while True:
            view = user.http.get(f"/v1/snapshots/{snapshot_id}").json()["data"]
            gone = user.http.get(f"/v1/snapshots/{lost}").status_code == 404
            if (view["status"] == "ready" and gone) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert view["status"] == "ready", view
        assert view["size_bytes"] > 300 << 20, view  # the image's allocated blocks, the write's among them
        # The one its host never held is gone, as a failed create's: not listed, nothing to boot.
        assert gone
        assert [s["id"] for s in user.http.get("/v1/snapshots").json()["data"]["data"]] == [snapshot_id]

        booted = user.create(rootfs=snapshot_id)
        assert user.run(booted["id"], "cat", "/root/kept.txt")["stdout"] == "kept\n"
        assert user.http.delete(f"/v1/snapshots/{snapshot_id}").status_code == 200
    finally:
        user.close()
        live.stop()
