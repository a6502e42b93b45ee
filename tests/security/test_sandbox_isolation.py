"""Probes from inside real sandboxes (crun and runc) against the host's limits (issue #12 items 1, 5, 6).

- Disk fill: writing into every fd of the guest agent (PID 1) lands nothing on the host.
- ``/proc/self/cgroup`` and ``mountinfo`` show no host path.
- Many sandboxes cannot hold more tasks than the host's pids budget, and a fork bomb leaves the host
  able to fork.
- A create or resize the host cannot give memory or disk to is refused (507) with a message that names
  what was requested, what is free and why.
- The per-sandbox disk throttle takes effect on the sandbox's loop device.

Each runs against a host agent started for this module with small limits, once under each runtime.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from paddock_hostagent.client import HostAgentClient, InsufficientCapacityError
from paddock_hostagent.drivers.runtime.bootlog import BootLog
from paddock_hostagent.drivers.runtime.cgroups import kernel_task_limit, pids_budget
from tests.hostagent.conftest import (
    DISK_MIB,
    AgentProcess,
    Sandboxes,
    debian_image,
    guest_binary_dir,
    image_cache,
    sh,
    teardown_agent,
)

__all__ = ["debian_image", "guest_binary_dir"]  # session fixtures, shared with tests/hostagent

# serial: the host's MemAvailable and free disk are read (scripts/run-tests.sh).
pytestmark = [pytest.mark.root, pytest.mark.serial]

MIB = 1 << 20
PIDS_BUDGET = 400
SANDBOX_PIDS_MAX = 180  # two sandboxes fill 360 of the 400, the third gets what is left
THROTTLE_BPS = 16 * MIB


@pytest.fixture(scope="module", params=["crun", "runc"])
def limited_agent(
    request: pytest.FixtureRequest, debian_image: Path, guest_binary_dir: Path
) -> Iterator[AgentProcess]:
    """A host agent with a small pids budget and disk throttle. Its memory budget is set far above the
    machine's, so only what the machine really has available limits admission."""
    agent = AgentProcess(
        state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"),
        guest_dir=guest_binary_dir,
        runtime=request.param,
        pool_size=1,
        extra_env={
            "PADDOCK_HOST_PIDS_BUDGET": str(PIDS_BUDGET),
            "PADDOCK_HOST_SANDBOX_PIDS_MAX": str(SANDBOX_PIDS_MAX),
            "PADDOCK_HOST_DISK_READ_BPS": str(THROTTLE_BPS),
            "PADDOCK_HOST_DISK_WRITE_BPS": str(THROTTLE_BPS),
            "PADDOCK_HOST_TOTAL_MIB": str(100 * 1024 * 1024),
        },
    )
    agent.start()
    try:
        yield agent
    finally:
        teardown_agent(agent)


@pytest.fixture
async def host(limited_agent: AgentProcess) -> AsyncIterator[HostAgentClient]:
    async with limited_agent.client() as client:
        info = await client.info()
        assert info.runtime == limited_agent.runtime, info
        yield client


@pytest.fixture
async def boxes(host: HostAgentClient, limited_agent: AgentProcess) -> AsyncIterator[Sandboxes]:
    tracker = Sandboxes(host, limited_agent)
    try:
        yield tracker
    finally:
        await tracker.destroy_all()


def host_file_bytes(state_dir: Path) -> dict[str, int]:
    """Bytes allocated on the host by each file under the state dir. The mount points inside it (each
    slot's disk and rootfs) are the sandbox's own, bounded filesystem; the disk image behind them is a
    host file and is counted."""
    found: dict[str, int] = {}
    for directory, subdirs, files in os.walk(state_dir):
        subdirs[:] = [name for name in subdirs if not os.path.ismount(os.path.join(directory, name))]
        for name in files:
            path = os.path.join(directory, name)
            try:
                found[path] = os.lstat(path).st_blocks * 512
            except FileNotFoundError:
                continue
    return found


def host_free_bytes(state_dir: Path) -> int:
    stats = os.statvfs(state_dir)
    return stats.f_bavail * stats.f_frsize


async def pool_refilled(host: HostAgentClient, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (await host.info()).warm_slots < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert (await host.info()).warm_slots >= 1, "the warm pool did not refill"


def agent_pids_group(agent: AgentProcess, sandbox_id: str) -> Path:
    cgroups_path = agent.record(sandbox_id)["driver_state"]["cgroups_path"]
    return Path("/sys/fs/cgroup/pids") / cgroups_path.lstrip("/").rsplit("/", 1)[0]


# -- 1. disk fill -------------------------------------------------------------------------------


async def test_writing_into_pid1_fds_lands_nothing_on_the_host(
    host: HostAgentClient, boxes: Sandboxes, limited_agent: AgentProcess
) -> None:
    sandbox = await boxes.create()
    await pool_refilled(host)  # a slot being built meanwhile would look like growth
    os.sync()  # what the disks hold but have not written to their images yet is not the probe's doing
    before = host_file_bytes(limited_agent.state_dir)
    free_before = host_free_bytes(limited_agent.state_dir)

    # Every fd PID 1 holds, and 1 and 2 by name as the original probe did; 50 MB each. The timeout
    # bounds the pipes inside the sandbox that PID 1 drains four bytes at a time.
    probe = (
        "n=0; for fd in /proc/1/fd/1 /proc/1/fd/2 /proc/1/fd/*; do"
        " timeout 5 head -c 50M /dev/zero > $fd 2>/dev/null; n=$((n+1)); done; sync; "
        "readlink /proc/1/fd/0 /proc/1/fd/1 /proc/1/fd/2; echo $n"
    )
    result = await sh(host, sandbox["id"], probe)

    *links, written = result["stdout"].split()
    assert links == ["/dev/null"] * 3, result
    os.sync()
    after = host_file_bytes(limited_agent.state_dir)
    grown = {path: after[path] - before.get(path, 0) for path in after if after[path] > before.get(path, 0)}
    # The disk store's image holds every sandbox's disk: the sandbox's own filesystem writes its journal
    # and superblock on sync, and each first write to a block still shared with the blank image it
    # was cloned from takes a new one (~1.6 MiB seen). Far less than one 50 MB write of the probe.
    store = {path: size for path, size in grown.items() if Path(path).name == "disks.xfs"}
    elsewhere = {path: size for path, size in grown.items() if path not in store}
    assert sum(elsewhere.values()) < MIB, f"host files grew: {grown}"
    assert sum(store.values()) < 16 * MIB, f"the disk store grew: {grown}"
    # Anywhere else on the host's filesystem: other tests on this machine write too, so the bound is
    # half of what the probe wrote, which its landing anywhere would exceed.
    probe_bytes = int(written) * 50 * MIB
    free_drop = free_before - host_free_bytes(limited_agent.state_dir)
    assert free_drop < probe_bytes // 2, f"host free space fell by {free_drop / MIB:.0f} MiB"
    for log in limited_agent.state_dir.glob("slots/*/runtime.log"):
        assert log.stat().st_size <= BootLog.limit_bytes
    # The sandbox is unharmed by its own probe.
    assert (await sh(host, sandbox["id"], "echo alive"))["stdout"] == "alive\n"


async def test_boot_log_keeps_only_its_tail(tmp_path: Path) -> None:
    """What the runtime (or a guest agent older than this fix) writes while booting is kept bounded."""
    log = BootLog(tmp_path / "runtime.log")
    writer = os.dup(log.write_fd)
    log.start()
    chunk = b"x" * 4096
    loop = asyncio.get_running_loop()
    # 4 MiB through a 64 KiB pipe: the agent must keep reading while it arrives.
    await loop.run_in_executor(None, lambda: [os.write(writer, chunk) for _ in range(1024)])
    os.write(writer, b"\nthe last words\n")
    os.close(writer)
    deadline = time.monotonic() + 5
    while "the last words" not in log.text() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert log.text().endswith("the last words\n")
    assert "the last words" in log.suffix()
    log.close()
    assert (tmp_path / "runtime.log").stat().st_size == BootLog.limit_bytes


# -- 6. host paths in /proc ---------------------------------------------------------------------


async def test_proc_shows_no_host_paths(
    host: HostAgentClient, boxes: Sandboxes, limited_agent: AgentProcess
) -> None:
    sandbox = await boxes.create()
    result = await sh(
        host,
        sandbox["id"],
        "cat /proc/self/cgroup /proc/1/cgroup; echo ---; cat /proc/self/mountinfo /proc/1/mountinfo",
    )
    cgroups, mountinfo = result["stdout"].split("---\n")

    for line in cgroups.splitlines():
        assert line.rsplit(":", 1)[1] == "/", f"cgroup path shown: {line}"
    agent_cgroup = agent_pids_group(limited_agent, sandbox["id"]).relative_to("/sys/fs/cgroup/pids")
    secret_paths = [
        str(limited_agent.state_dir),
        str(image_cache()),
        "/var/lib/paddock",
        "/tmp/",
        str(agent_cgroup),
        agent_cgroup.name,
    ]
    for text in (cgroups, mountinfo):
        for secret in secret_paths:
            assert secret not in text, f"{secret} visible inside the sandbox:\n{text}"
    # The guest agent is still where the sandbox expects it, and the root is the overlay.
    assert " /run/paddock-guest " in mountinfo
    assert re.search(r" / / \S+ - overlay ", mountinfo), mountinfo


# -- 5. pids ------------------------------------------------------------------------------------


def fork_script(count: int) -> str:
    """Forks ``count`` detached sleepers (their own session, so the exec's end does not kill them) and
    prints how many forks succeeded; stops at the first refused fork, without bash's retry loop."""
    perl = (
        "$n = 0; for (1..COUNT) { my $p = fork; last unless defined $p;"
        ' if ($p == 0) { POSIX::setsid(); open STDOUT, ">/dev/null"; open STDERR, ">/dev/null";'
        ' sleep 30; POSIX::_exit(0) } $n++ } print "$n\\n"'
    ).replace("COUNT", str(count))
    return f"perl -MPOSIX -e '{perl}'"


async def test_many_sandboxes_cannot_exceed_the_host_pids_budget(
    host: HostAgentClient, boxes: Sandboxes, limited_agent: AgentProcess
) -> None:
    created = [await boxes.create(mem_mib=1024) for _ in range(3)]
    group = agent_pids_group(limited_agent, created[0]["id"])
    assert int((group / "pids.max").read_text()) == PIDS_BUDGET

    forked: list[int] = []
    started = time.monotonic()
    for sandbox in created:
        result = await asyncio.wait_for(sh(host, sandbox["id"], fork_script(1000)), 60)
        forked.append(int(result["stdout"]))
    elapsed_s = time.monotonic() - started

    # The first sandbox stops at its own pids.max; the later ones at what the budget has left.
    assert forked[0] < SANDBOX_PIDS_MAX, forked
    assert sum(forked) < PIDS_BUDGET, forked
    assert forked[2] < SANDBOX_PIDS_MAX - 10, f"the budget did not bind: {forked}"
    in_use = int((group / "pids.current").read_text())
    assert in_use <= PIDS_BUDGET
    assert in_use >= PIDS_BUDGET - 10, f"expected the budget to be nearly full: {in_use}"
    # The host is unaffected: it still forks, at once.
    assert subprocess.run(["true"], timeout=5).returncode == 0
    assert elapsed_s < 60


def test_default_pids_budget_keeps_a_quarter_for_the_host() -> None:
    kernel = kernel_task_limit()
    assert pids_budget(0) == kernel * 3 // 4
    assert pids_budget(10 * kernel) == kernel
    assert pids_budget(PIDS_BUDGET) == PIDS_BUDGET


# -- 5. memory and disk admission ---------------------------------------------------------------


def mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


async def test_create_beyond_host_memory_is_refused_with_the_numbers(
    host: HostAgentClient, boxes: Sandboxes
) -> None:
    requested = mem_available_mib() + 4096
    sandbox_id = f"sb-{secrets.token_hex(5)}"
    with pytest.raises(InsufficientCapacityError) as refused:
        await boxes.create(id=sandbox_id, mem_mib=requested)
    assert refused.value.status == 507
    match = re.match(r"(\d+) MiB requested, (\d+) MiB free \(memory: the machine has", str(refused.value))
    assert match, str(refused.value)
    assert int(match[1]) == requested
    assert int(match[2]) < mem_available_mib()
    assert sandbox_id not in {item.id for item in await host.list_sandboxes()}
    # What the host can give, it still gives.
    created = await boxes.create(mem_mib=256)
    assert created["status"] == "running"


async def test_disk_beyond_host_free_space_is_refused(
    host: HostAgentClient, boxes: Sandboxes, limited_agent: AgentProcess
) -> None:
    too_big_mib = host_free_bytes(limited_agent.state_dir) // MIB + 10 * 1024
    with pytest.raises(InsufficientCapacityError) as refused:
        await boxes.create(disk_mib=too_big_mib)
    assert re.match(rf"{too_big_mib} MiB requested, \d+ MiB free \(disk: ", str(refused.value)), str(
        refused.value
    )
    sandbox = await boxes.create()
    with pytest.raises(InsufficientCapacityError) as refused:
        await host.resize_sandbox(sandbox["id"], too_big_mib)
    assert "MiB free (disk: " in str(refused.value)
    assert (await host.get_sandbox(sandbox["id"])).disk_mib == DISK_MIB


# -- 6. disk I/O throttle -----------------------------------------------------------------------


async def test_disk_throttle_holds_direct_and_synced_io(host: HostAgentClient, boxes: Sandboxes) -> None:
    sandbox = await boxes.create()
    size_mib = 32
    rates: dict[str, float] = {}
    for name, script in {
        "direct write": f"dd if=/dev/zero of=/root/a bs=1M count={size_mib} oflag=direct",
        "synced write": f"dd if=/dev/zero of=/root/b bs=1M count={size_mib} conv=fsync",
        "direct read": "dd if=/root/a of=/dev/null bs=1M iflag=direct",
    }.items():
        started = time.monotonic()
        result = await sh(host, sandbox["id"], script)
        assert result["exit_code"] == 0, result
        rates[name] = size_mib * MIB / (time.monotonic() - started)
    for name, rate in rates.items():
        assert rate < THROTTLE_BPS * 1.3, f"{name} ran at {rate / MIB:.1f} MiB/s: {rates}"
