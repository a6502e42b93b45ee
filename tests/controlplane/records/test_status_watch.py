"""The status watch that wakes ``GET …?wait_for=`` and exec's wait for a running sandbox."""

from __future__ import annotations

import asyncio
import time

from paddock_controlplane.records.hotcache import StatusWatch


async def test_a_change_committed_while_the_row_is_read_wakes_the_waiter_at_once() -> None:
    watch = StatusWatch()
    changed = watch.watch("sb-1")  # taken before the read
    watch.changed("sb-1")  # committed while the read was in flight (PostgreSQL's reads suspend)
    started = time.monotonic()
    await watch.wait(changed, 5.0)
    assert time.monotonic() - started < 0.5  # not the re-read timer (up to 250 ms) or the timeout


async def test_a_waiter_sleeps_until_the_next_change_or_its_timeout() -> None:
    watch = StatusWatch()
    changed = watch.watch("sb-1")
    asyncio.get_running_loop().call_later(0.05, watch.changed, "sb-2")  # another sandbox: no wake-up
    asyncio.get_running_loop().call_later(0.1, watch.changed, "sb-1")
    started = time.monotonic()
    await watch.wait(changed, 5.0)
    assert 0.09 <= time.monotonic() - started < 2.0
    quiet = watch.watch("sb-1")  # a new event once the last one fired
    started = time.monotonic()
    await watch.wait(quiet, 0.1)
    assert 0.09 <= time.monotonic() - started < 2.0
