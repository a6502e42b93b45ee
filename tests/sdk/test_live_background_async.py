"""Background commands with output callbacks (issue #32) through the SDK against the real platform.

Written once, in ``test_live_background_async.py`` for the async client; ``scripts/unasync.py``
generates ``test_live_background.py``, the same tests through the sync client (callbacks in a thread).
"""

from __future__ import annotations

import time

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size


async def test_a_background_command_calls_back_line_by_line_as_it_prints(live: LivePlatform) -> None:
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        sb = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB)
        try:
            out: list[tuple[float, str]] = []
            err: list[str] = []

            async def on_stderr(line: str) -> None:  # a coroutine in the async client
                err.append(line)

            script = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 1; done; printf tail; exit 7"
            started = time.monotonic()
            handle = await sb.run_background(
                script,
                shell=True,
                on_stdout=lambda line: out.append((time.monotonic(), line)),
                on_stderr=on_stderr,
            )
            assert handle.exit_code is None
            # the first line arrives while the command still has seconds to run
            deadline = time.monotonic() + 20
            while not out and time.monotonic() < deadline:
                await paddock._blocking.asleep(0.1)
            assert out, "no line reached on_stdout within 20 s"
            assert out[0][1] == "out1" and handle.exit_code is None
            assert await handle.wait(timeout_s=60) == 7
            assert handle.exit_code == 7
            assert [line for _, line in out] == ["out1", "out2", "out3", "tail"]
            assert err == ["err1", "err2", "err3"]
            assert out[2][0] - out[0][0] >= 1.5, "lines came together, not as printed"
            assert out[0][0] - started < out[-1][0] - started - 1.5
        finally:
            await sb.destroy()


async def test_a_background_command_is_killed_and_a_failing_callback_reaches_wait(
    live: LivePlatform,
) -> None:
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        sb = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB)
        try:
            seen: list[str] = []
            handle = await sb.run_background(
                "sh", ["-c", "echo ready; exec sleep 600"], on_stdout=seen.append
            )
            with pytest.raises(paddock.WaitTimeoutError):
                await handle.wait(timeout_s=2)
            assert seen == ["ready"]
            started = time.monotonic()
            code = await handle.kill(grace_ms=1000)
            assert time.monotonic() - started < 30
            assert code != 0 and handle.exit_code == code
            assert (await sb.processes.get(handle.process_id)).leader_exited

            def boom(line: str) -> None:
                raise RuntimeError(f"callback refused {line!r}")

            failing = await sb.run_background("echo", ["hello"], on_stdout=boom)
            with pytest.raises(RuntimeError, match="callback refused 'hello'"):
                await failing.wait(timeout_s=60)
        finally:
            await sb.destroy()
