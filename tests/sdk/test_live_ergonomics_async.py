"""Everyday ergonomics (issue #32) through the SDK against the real platform: a sandbox's lifetime,
metadata labels, the shell form, a command that cannot start, and a long command through ``run``.

Written once, in ``test_live_ergonomics_async.py`` for the async client; ``scripts/unasync.py``
generates ``test_live_ergonomics.py``, the same tests through the sync client.
"""

from __future__ import annotations

import secrets
import time

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size


async def test_a_sandbox_with_timeout_s_is_gone_after_it_and_an_extended_one_is_not(
    live: LivePlatform,
) -> None:
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        short = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB, timeout_s=5)
        kept = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB, timeout_s=5)
        try:
            assert short.info.timeout_s == 5 and short.info.on_timeout == "destroy" and short.info.end_at
            extended = await kept.set_timeout(300)
            assert extended.end_at and extended.end_at > (short.info.end_at or "")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if (await short.refresh()).status in ("destroying", "destroyed"):
                    break
                await paddock._blocking.asleep(0.5)
            assert short.info.status in ("destroying", "destroyed"), short.info.status
            assert (await kept.refresh()).status == "running"
            assert (await kept.run("true")).ok
        finally:
            await kept.destroy()
            await short.destroy()


async def test_metadata_is_returned_and_filtered_on(live: LivePlatform) -> None:
    run_id = secrets.token_hex(4)
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        a = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB, metadata={"run": run_id, "role": "a"})
        b = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB, metadata={"run": run_id, "role": "b"})
        try:
            assert (await client.sandboxes.get(a.id)).info.metadata == {"run": run_id, "role": "a"}
            both = await client.sandboxes.list(metadata={"run": run_id})
            assert {info.id for info in both} == {a.id, b.id}
            only_b = await client.sandboxes.list(metadata={"run": run_id, "role": "b"})
            assert [info.id for info in only_b] == [b.id]
            assert await client.sandboxes.list(metadata={"run": "x" + run_id}) == []
        finally:
            await a.destroy()
            await b.destroy()


async def test_shell_form_and_a_command_that_cannot_start(live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        shell = await sb.run_shell("echo hi && echo there | tr a-z A-Z")
        assert shell.stdout == "hi\nTHERE\n" and shell.exit_code == 0
        assert (await sb.run("echo $0 $1", ["one"], shell=True)).stdout == "sh one\n"
        with pytest.raises(paddock.CommandStartError) as missing:
            await sb.run("no-such-binary")
        assert "no-such-binary" in str(missing.value)


async def test_a_command_longer_than_the_clients_read_timeout_through_run(live: LivePlatform) -> None:
    """The client's read timeout (60 s by default) had cut a longer command (TransportError timed out);
    run has no limit of its own. A client with a 5 s read timeout runs an 8 s command: the same cut, had
    it been there, at a ninth of the wait the default's 70 s command took."""
    key = live.api_key()
    async with (
        paddock.AsyncClient(live.url, key) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
        paddock.AsyncClient(live.url, key, timeout=5.0) as impatient,
    ):
        same = await impatient.sandboxes.get(sb.id)
        started = time.monotonic()
        result = await same.run_shell("sleep 8; echo done")
        assert result.stdout == "done\n" and result.exit_code == 0
        assert time.monotonic() - started >= 8
        with pytest.raises(paddock.CommandTimeoutError) as cut:
            await sb.run("sleep", ["5"], timeout_s=1)
        assert "timeout_s" in str(cut.value) and isinstance(cut.value, TimeoutError)


async def test_run_in_a_directory(live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        odd = "/tmp/a b;$(touch /tmp/pwned)"
        assert (await sb.run("mkdir", ["-p", odd])).ok
        assert (await sb.run("pwd", cwd="/tmp")).stdout == "/tmp\n"
        assert (await sb.run("pwd", cwd=odd)).stdout == odd + "\n"
        assert (await sb.run_shell("pwd && ls", cwd=odd)).stdout == odd + "\n"
        assert not (await sb.run("test", ["-e", "/tmp/pwned"])).ok, "the directory's name stays a name"
        missing = await sb.run("pwd", cwd="/no/such/dir")
        assert missing.exit_code == 127 and "/no/such/dir" in missing.stderr
        with pytest.raises(paddock.ValidationError) as relative:
            await sb.run("pwd", cwd="relative")
        assert "cwd" in relative.value.fields
