"""A paused sandbox through the SDK (issue #32): the API answers exec and files with the contract's
409 saying it is paused and how to resume; a client made with ``auto_resume=True`` resumes it and sends
the call once more.

Written once, in ``test_live_paused_async.py`` for the async client; ``scripts/unasync.py`` generates
``test_live_paused.py``, the same tests through the sync client.
"""

from __future__ import annotations

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size


async def test_auto_resume_wakes_a_paused_sandbox_for_exec_and_files_and_the_default_does_not(
    live: LivePlatform,
) -> None:
    key = live.api_key()
    async with (
        paddock.AsyncClient(live.url, key) as plain,
        paddock.AsyncClient(live.url, key, auto_resume=True) as waking,
    ):
        sb = await plain.sandboxes.create(SHAPE, disk_mib=DISK_MIB)
        try:
            await sb.files.write("/root/kept.txt", b"before the pause")
            await sb.pause()
            with pytest.raises(paddock.ConflictError, match="it is paused; resume it"):
                await sb.run("true")
            with pytest.raises(paddock.ConflictError, match="it is paused"):
                await sb.files.read("/root/kept.txt")
            assert (await sb.refresh()).status == "paused"  # the default client never wakes it

            same = await waking.sandboxes.get(sb.id)
            result = await same.run("cat", ["/root/kept.txt"])
            assert result.exit_code == 0 and result.stdout == "before the pause"
            assert (await sb.refresh()).status == "running"

            await sb.pause()
            assert await same.files.read("/root/kept.txt") == b"before the pause"  # a streamed read
            assert (await sb.refresh()).status == "running"

            await sb.pause()
            lines: list[str] = []
            handle = await same.run_background("echo", ["woken"], on_stdout=lines.append)
            assert await handle.wait(timeout_s=60) == 0 and lines == ["woken"]

            # a destroyed sandbox's 409/404 is not retried into a resume
            await sb.destroy(wait=True)
            with pytest.raises((paddock.ConflictError, paddock.NotFoundError)) as gone:
                await same.run("true")
            assert "paused" not in str(gone.value)
        finally:
            await sb.destroy()
