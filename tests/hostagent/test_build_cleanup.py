"""A template build's cleanup runs to its end however often the build is cancelled meanwhile.

A build is cancelled by its template's delete and again when the caller awaiting that delete is
cancelled; a second cancellation between the egress detach and the namespace's destroy once left the
build's address in the agent's addresses.json (builds.py ``_to_the_end``)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from paddock_hostagent.builds import STALE_WORK_AFTER_S, _hold, _to_the_end, remove_stale_work


async def test_cleanup_finishes_through_two_cancellations_and_the_cancellation_goes_on() -> None:
    steps: list[str] = []

    async def cleanup() -> None:
        steps.append("detach")
        await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)  # the second cancellation lands here, as between detach and destroy
        steps.append("destroy")

    async def attempt() -> None:
        try:
            await asyncio.sleep(10)  # the build's RUN step
        finally:
            await _to_the_end(cleanup())

    task = asyncio.create_task(attempt())
    await asyncio.sleep(0.01)
    task.cancel()  # the template's delete
    await asyncio.sleep(0.07)
    task.cancel()  # the delete's own caller gave up
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["detach", "destroy"]


async def test_a_cleanup_error_is_raised_when_nothing_was_cancelled() -> None:
    async def cleanup() -> None:
        raise OSError("the namespace would not go")

    with pytest.raises(OSError, match="would not go"):
        await _to_the_end(cleanup())


def test_a_restarted_agent_removes_dead_builds_work_but_not_a_live_ones(tmp_path: Path) -> None:
    # An agent killed in a build leaves the attempt's work dir (a tenant's whole tree) behind; the next
    # agent's start removes it. A dir another agent's running attempt holds, or one made an instant ago
    # and not yet held, stays; and a link in the tenant's tree is removed, never followed.
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    builds = tmp_path / ".builds"
    dead, live, young = (builds / name for name in ("tpl_dead-1", "tpl_live-1", "tpl_young-1"))
    for work in (dead, live, young):
        (work / "rootfs" / "etc").mkdir(parents=True)
        (work / "rootfs" / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
        (work / "rootfs" / "escape").symlink_to(outside)
    old = time.time() - STALE_WORK_AFTER_S - 5
    for work in (dead, live):
        os.utime(work, (old, old))
    held = _hold(live)
    try:
        assert remove_stale_work(builds) == ["tpl_dead-1"]
    finally:
        os.close(held)
    assert not dead.exists()
    assert (live / "rootfs" / "etc" / "passwd").exists() and young.exists()
    assert (outside / "keep").is_dir()
