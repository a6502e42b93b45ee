"""Full disks: a sandbox that fills its own disk gets ENOSPC inside it and its neighbours go on writing;
a host whose disk store runs low holds the sandboxes filling it (the low watermark, ``diskwatch.py``)
before its filesystem fills, refuses creates saying why, and lets them go on when room comes back.

The watermark test runs its agent on a 5 GiB ext4 made for the test (a loop-mounted file, as the
host's own filesystem is ext4), so the agent's disk store is an XFS inside a file on it, as on the
host, and the test fills that small filesystem instead of the host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import HostAgentError
from tests.hostagent.conftest import AgentProcess, Sandboxes, run, sh, teardown_agent

pytestmark = pytest.mark.root

MIB = 1 << 20
#: 800 MiB of a pattern (not zeros, which a lost block would read back as), synced, then its checksum.
WRITE_800_MIB = (
    "yes paddock-disk-watermark | head -c 838860800 | dd of=/big bs=1M iflag=fullblock conv=fsync 2>&1 "
    "&& md5sum /big"
)
#: A command left running after its exec answers (its output in /done when it ends).
IN_BACKGROUND = "setsid sh -c '{{ {}; }} > /done.tmp 2>&1; mv /done.tmp /done' </dev/null >/dev/null 2>&1 &"


def free_mib(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize // MIB


async def test_a_sandbox_that_fills_its_disk_gets_enospc_and_its_neighbour_keeps_writing(
    sandboxes: Sandboxes, host: Any
) -> None:
    small = await sandboxes.create(disk_mib=512)
    neighbour = await sandboxes.create()
    fill = asyncio.create_task(
        sh(host, small["id"], "dd if=/dev/zero of=/fill bs=1M count=1024 conv=fsync 2>&1; echo rc=$?")
    )
    # The neighbour writes and syncs 256 MiB, with a checksum, while the other fills its disk.
    write = asyncio.create_task(
        sh(
            host,
            neighbour["id"],
            "head -c 268435456 /dev/urandom > /data && sync /data && md5sum /data | cut -c1-32",
        )
    )
    filled, written = await asyncio.gather(fill, write)
    assert "No space left on device" in filled["stdout"] and "rc=1" in filled["stdout"], filled
    assert written["exit_code"] == 0, written
    reread = await sh(host, neighbour["id"], "echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; md5sum /data")
    assert reread["stdout"][:32] == written["stdout"].strip(), reread
    # The full disk is still a working filesystem: room freed inside it can be written again.
    again = await sh(host, small["id"], "rm /fill && echo kept > /after && sync && cat /after")
    assert again["exit_code"] == 0 and again["stdout"] == "kept\n", again
    assert (await run(host, neighbour["id"], "echo", "alive"))["stdout"] == "alive\n"


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 5 GiB ext4 (no root reserve) on a loop device, mounted for the test; gone afterwards."""
    image = Path(f"/tmp/pdkfs-{secrets.token_hex(3)}.img")
    mount_dir = Path(f"/tmp/pdkfs-{secrets.token_hex(3)}")
    with open(image, "wb") as handle:
        handle.truncate(5120 * MIB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    mount_dir.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount_dir)], check=True)
    try:
        yield mount_dir
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(mount_dir)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            mount_dir.rmdir()
        image.unlink(missing_ok=True)
        assert not os.path.ismount(mount_dir), f"{mount_dir} is still mounted"


def disk_log(agent: AgentProcess) -> list[str]:
    """The watermark's lines of the agent's log, to show with a failed assertion."""
    return [line for line in agent.log_path.read_text().splitlines() if '"disk_' in line]


async def held_now(host: Any, sandbox_ids: list[str]) -> bool:
    return list((await host.info()).disk_held) == sandbox_ids


async def finished(host: Any, sandbox_id: str) -> dict[str, Any] | None:
    done = await sh(host, sandbox_id, "cat /done")
    return done if done["exit_code"] == 0 else None


async def assert_refused(tracker: Sandboxes) -> None:
    with pytest.raises(HostAgentError) as refused:
        await tracker.create(mem_mib=256)
    assert refused.value.status == 507, refused.value
    assert "disk store is low" in str(refused.value), refused.value
    assert "held until it has 1536 MiB free" in str(refused.value), refused.value


async def wait_for(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await condition()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.mark.slow
async def test_a_host_running_low_holds_the_sandboxes_filling_it_and_releases_them_with_room(
    small_filesystem: Path, debian_image: Path, guest_binary_dir: Path
) -> None:
    agent = AgentProcess(
        state_dir=small_filesystem / "state",
        guest_dir=guest_binary_dir,
        pool_size=1,
        extra_env={
            "PADDOCK_HOST_DISK_RESERVED_MIB": "256",
            "PADDOCK_HOST_DISK_LOW_WATERMARK_MIB": "512",
            "PADDOCK_HOST_DISK_HIGH_WATERMARK_MIB": "1536",
        },
    )
    try:
        agent.start()
        async with agent.client() as host:
            tracker = Sandboxes(host, agent)
            writers = sorted([(await tracker.create(mem_mib=256))["id"] for _ in range(2)])
            other = await tracker.create(mem_mib=256)
            # Something else on the host takes all but 1,400 MiB; two sandboxes then write 800 MiB each.
            # The high watermark (1,536 MiB) is above what is left: only the ballast going releases them.
            # Without the watermark the host filesystem fills under the disk store (EIO inside).
            ballast = small_filesystem / "ballast"
            ballast_mib = free_mib(small_filesystem) - 1400
            assert ballast_mib >= 2048, free_mib(small_filesystem)
            subprocess.run(["fallocate", "-l", f"{ballast_mib}M", str(ballast)], check=True)
            lowest = [free_mib(small_filesystem)]
            for writer in writers:
                started = await sh(host, writer, IN_BACKGROUND.format(WRITE_800_MIB))
                assert started["exit_code"] == 0, started

            async def both_held() -> bool:
                lowest.append(free_mib(small_filesystem))
                return (await host.info()).disk_held == writers

            await wait_for(both_held, 120, "the writers to be held")
            # While they are held: no create, saying why; the other sandbox runs commands.
            await assert_refused(tracker)
            assert (await run(host, other["id"], "echo", "alive"))["stdout"] == "alive\n"
            await asyncio.sleep(2)  # they stay held, and the host filesystem never fills
            lowest.append(free_mib(small_filesystem))
            assert (await host.info()).disk_held == writers, disk_log(agent)
            assert {(await host.get_sandbox(writer)).status for writer in writers} == {"running"}
        # A restarted agent knows the frozen sandboxes for holds, not pauses.
        agent.stop()
        agent.start()
        async with agent.client() as host:
            tracker = Sandboxes(host, agent)
            assert (await host.info()).disk_held == writers, disk_log(agent)
            assert {(await host.get_sandbox(writer)).status for writer in writers} == {"running"}
            await assert_refused(tracker)
            lowest.append(free_mib(small_filesystem))
            assert min(lowest) >= 128, lowest
            # The second one's user pauses it: it is theirs again, and room coming back leaves it paused.
            assert (await host.pause_sandbox(writers[1])).status == "paused"
            await wait_for(lambda: held_now(host, writers[:1]), 5, "the paused one's hold to be dropped")
            # Room comes back: the first goes on; the second, once resumed.
            ballast.unlink()
            await wait_for(lambda: held_now(host, []), 10, "the hold to be released")
            assert (await host.get_sandbox(writers[1])).status == "paused"
            assert (await host.resume_sandbox(writers[1])).status == "running"
            for writer in writers:
                done = await wait_for(functools.partial(finished, host, writer), 120, "the write to finish")
                assert "838860800 bytes" in done["stdout"], done
                # Whole on disk, not only in the page cache: without the watermark such a write also
                # "succeeds", then reads back different once the cache is dropped (the store lost blocks).
                subprocess.run(["sync", "-f", str(small_filesystem)], check=True)
                Path("/proc/sys/vm/drop_caches").write_text("3")
                reread = await sh(host, writer, "md5sum /big && rm /big && sync && echo ok")
                assert reread["stdout"] == done["stdout"].splitlines()[-1] + "\nok\n", (reread, done)
            created = await tracker.create(mem_mib=256)
            assert (await run(host, created["id"], "echo", "alive"))["stdout"] == "alive\n"
            assert [line for line in disk_log(agent) if '"disk_low_release"' in line], disk_log(agent)
    finally:
        teardown_agent(agent)
