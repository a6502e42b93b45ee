"""Exec and processes as another user of the sandbox (issue #32) through the SDK on the real platform,
on the container tier (crun), on gVisor and on the VM tier: the guest resolves the name or uid in the sandbox's own
/etc/passwd and drops to it (groups, gid, uid) before the command starts.

Written once, in ``test_live_users_async.py`` for the async client; ``scripts/unasync.py`` generates
``test_live_users.py``, the same tests through the sync client.
"""

from __future__ import annotations

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size


async def test_run_as_a_user_by_name_or_uid(tier_live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(tier_live.url, tier_live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        assert (await sb.run("id", ["-un"])).stdout == "root\n"
        assert (await sb.run("id", ["-un"], user="nobody")).stdout == "nobody\n"
        assert (await sb.run("id", ["-u"], user="nobody")).stdout == "65534\n"
        # Root's groups are dropped: only nobody's own (nogroup).
        assert (await sb.run("id", ["-G"], user="nobody")).stdout == "65534\n"
        assert (await sb.run("id", ["-un"], user=65534)).stdout == "nobody\n"
        assert (await sb.run("id", ["-un"], user="0")).stdout == "root\n"
        login = await sb.run_shell('echo "$HOME $USER $LOGNAME"', user="nobody")
        assert login.stdout == "/nonexistent nobody nobody\n"

        # A file it writes is its own; what only root may write it may not.
        assert (await sb.run_shell("echo hi > /tmp/by-nobody", user="nobody")).ok
        owner = await sb.run("find", ["/tmp/by-nobody", "-printf", "%u:%U:%g"])
        assert owner.stdout == "nobody:65534:nogroup"
        denied = await sb.run("touch", ["/root/by-nobody"], user="nobody")
        assert denied.exit_code != 0 and "Permission denied" in denied.stderr
        assert not (await sb.run("test", ["-e", "/root/by-nobody"])).ok

        # Supplementary groups from the sandbox's /etc/group, and cwd with a user.
        assert (await sb.run("useradd", ["-m", "-G", "audio,video", "alice"])).ok
        alice = await sb.run_shell("id -un; id -Gn; pwd; echo $HOME", user="alice", cwd="/tmp")
        assert alice.stdout.splitlines()[0] == "alice"
        assert set(alice.stdout.splitlines()[1].split()) == {"alice", "audio", "video"}
        assert alice.stdout.splitlines()[2:] == ["/tmp", "/home/alice"]

        # A uid with no entry: its own gid, no groups, HOME=/.
        anon = await sb.run_shell('id -u; id -g; id -G; echo "$HOME"', user="4242")
        assert anon.stdout == "4242\n4242\n4242\n/\n"

        # The streamed form too.
        frames = [frame async for frame in sb.stream("id", ["-un"], user="nobody")]
        assert "".join(frame.get("stdout", "") for frame in frames) == "nobody\n"
        assert frames[-1] == {"exit_code": 0}


async def test_an_unknown_or_malformed_user_is_a_400_naming_user(tier_live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(tier_live.url, tier_live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        assert (await sb.run("rm", ["-f", "/tmp/ran"])).ok
        for user in ("no-such-user", "-rf", "a" * 65, "bad name", "x;touch /tmp/ran", 2**31):
            with pytest.raises(paddock.ValidationError) as refused:
                await sb.run("touch", ["/tmp/ran"], user=user)
            assert "user" in refused.value.fields, (user, refused.value)
        with pytest.raises(paddock.ValidationError) as unknown:
            await sb.run("true", user="no-such-user")
        assert "no-such-user" in str(unknown.value)
        with pytest.raises(paddock.ValidationError) as process:
            await sb.processes.start("touch", ["/tmp/ran"], user="no-such-user")
        assert "user" in process.value.fields
        assert not (await sb.run("test", ["-e", "/tmp/ran"])).ok, "nothing ran"


async def test_a_pty_process_as_a_user(tier_live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(tier_live.url, tier_live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        started = await sb.processes.start(
            "/bin/sh", ["-c", 'id -un; echo "home=$HOME"; tty'], pty=(24, 80), user="nobody"
        )
        output = b""
        async for frame in sb.processes.connect(started.process_id):
            if frame.get("type") == "data":
                output += frame["data"]
            if frame.get("type") in ("exit", "error"):
                break
        text = output.decode().replace("\r\n", "\n")
        assert text.startswith("nobody\nhome=/nonexistent\n/dev/pts/"), text
        background = await sb.processes.start("/bin/sh", ["-c", "id -un > /tmp/bg-user"], user="nobody")
        assert (await sb.processes.wait(background.process_id)).exit_code == 0
        assert (await sb.run("cat", ["/tmp/bg-user"])).stdout == "nobody\n"
