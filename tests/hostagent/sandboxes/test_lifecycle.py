"""Pause, resume, fork, resize and destroy of real sandboxes, and what each leaves behind."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import BadStateError, HostAgentClient, HostAgentError, SandboxMissingError
from paddock_hostagent.schemas import CreateSandboxBody, CreateSandboxResult, ForkBody, NetworkAttachBody
from tests.hostagent.conftest import AgentProcess, Sandboxes, cgroup_dirs, run, sandbox_cgroup_dirs, sh

pytestmark = pytest.mark.root

# Written aside and renamed: a download racing a rewrite in place once read three NUL bytes (CI).
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 0.02; done"


async def read_counter(host: HostAgentClient, sandbox_id: str) -> int:
    _, chunks = await host.download(sandbox_id, "/root/counter")
    text = b"".join([chunk async for chunk in chunks]).decode().strip()
    return int(text or 0)


async def start_counter(host: HostAgentClient, sandbox_id: str) -> None:
    await sh(host, sandbox_id, f"nohup bash -c '{COUNTER}' >/dev/null 2>&1 &")
    deadline = time.monotonic() + 10
    while (await run(host, sandbox_id, "test", "-s", "/root/counter"))["exit_code"] != 0:
        assert time.monotonic() < deadline, "the counter never wrote /root/counter"
        await asyncio.sleep(0.02)


async def test_pause_freezes_everything_and_resume_continues(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    await start_counter(host, sandbox["id"])
    before = await read_counter(host, sandbox["id"])
    assert (await host.pause_sandbox(sandbox["id"])).status == "paused"
    assert (await host.get_sandbox(sandbox["id"])).status == "paused"
    await asyncio.sleep(1.0)  # ~50 increments if it were running
    assert (await host.resume_sandbox(sandbox["id"])).status == "running"
    after_resume = await read_counter(host, sandbox["id"])
    assert after_resume - before < 15, (before, after_resume)
    await asyncio.sleep(0.5)
    assert await read_counter(host, sandbox["id"]) > after_resume + 5  # it runs again


async def test_pause_ends_a_running_stream_with_an_error(
    host: HostAgentClient, sandbox: dict[str, Any]
) -> None:
    stream = host.exec_stream(sandbox["id"], cmd="bash", args=["-c", "echo go; sleep 60"], env={})
    frames = [await anext(stream)]
    await host.pause_sandbox(sandbox["id"])
    frames += [frame async for frame in stream]
    assert frames == [{"stdout": "go\n"}, {"error": "sandbox paused"}, {"exit_code": -1}]
    await host.resume_sandbox(sandbox["id"])


async def test_start_paused(host: HostAgentClient, sandboxes: Sandboxes) -> None:
    created = await sandboxes.create(start_paused=True)
    assert created["status"] == "paused" and created["ip"]
    assert (await host.get_sandbox(created["id"])).status == "paused"
    await host.resume_sandbox(created["id"])
    assert (await run(host, created["id"], "echo", "awake"))["stdout"] == "awake\n"


async def test_fork_sees_the_files_then_diverges(host: HostAgentClient, sandboxes: Sandboxes) -> None:
    source = await sandboxes.create(name="origin")
    await sh(
        host,
        source["id"],
        "echo from-source > /root/shared.txt && mkdir -p /opt/work && echo x > /opt/work/y",
    )
    child_id = f"{source['id']}-fork"
    sandboxes.track(child_id)
    child = await host.fork_sandbox(
        source["id"], ForkBody(new_id=child_id, name="offshoot", start_paused=False)
    )
    assert child.status == "running" and child.ip != source["ip"]
    result = await sh(host, child_id, "cat /root/shared.txt /opt/work/y; hostname")
    assert result["stdout"] == "from-source\nx\noffshoot\n"
    await sh(host, child_id, "echo child > /root/shared.txt")
    await sh(host, source["id"], "echo source-later > /root/shared.txt")
    assert (await run(host, child_id, "cat", "/root/shared.txt"))["stdout"] == "child\n"
    assert (await run(host, source["id"], "cat", "/root/shared.txt"))["stdout"] == "source-later\n"
    assert (await host.get_sandbox(child_id)).forked_from == source["id"]


# ``identity``: the hostname, hosts and resolv.conf written into the disk before the overlay mounts.
FORK_STEPS = (
    "slot",
    "freeze",
    "sync",
    "clone",
    "loop",
    "mount",
    "identity",
    "overlay",
    "bundle",
    "runtime",
    "guest",
)


async def test_each_fork_logs_where_its_time_went(
    host: HostAgentClient, sandboxes: Sandboxes, agent: AgentProcess
) -> None:
    """``fork_phases``: the milliseconds of each step, in order, and whether the slot was a warm one
    (docs/performance.md reads its numbers from this line)."""
    source = await sandboxes.create(name="timed")
    deadline = time.monotonic() + 30
    while (await host.info()).warm_slots < 1:
        assert time.monotonic() < deadline, "the warm pool did not refill"
        await asyncio.sleep(0.05)
    child_id = f"{source['id']}-fork"
    sandboxes.track(child_id)
    await host.fork_sandbox(source["id"], ForkBody(new_id=child_id, name="timed-fork", start_paused=False))
    phases = agent.logged("fork_phases", child_id)
    assert [key.removesuffix("_ms") for key in phases if key.endswith("_ms")] == list(FORK_STEPS)
    assert all(phases[f"{step}_ms"] >= 0 for step in FORK_STEPS)
    assert phases["warm_slot"] is True


@pytest.mark.serial  # XFS's log worker every 30 s, as a kernel's default (its fixture)
async def test_a_fork_of_a_source_with_a_long_log_freezes_its_filesystem_for_the_clone(
    host: HostAgentClient, sandboxes: Sandboxes, agent: AgentProcess, xfs_log_worker_every_30_s: None
) -> None:
    """20,000 files just created leave ~13,000 blocks of XFS log that a clone's mount would replay
    (~140 ms and more): the fork freezes the source's filesystem for the clone instead (a ``quiesce``
    phase), the fork holds every file, and the source writes again at once afterwards (thawed). With
    the agent's log worker each second, the log may be short again by the fork (the worker's own
    test is in ``storage/test_store_writeback.py``): this one holds it at the kernel's 30 s."""
    source = await sandboxes.create(name="many")
    made = await sh(host, source["id"], "mkdir /root/many && cd /root/many && seq -f f%g 20000 | xargs touch")
    assert made["exit_code"] == 0, made
    child_id = f"{source['id']}-fork"
    sandboxes.track(child_id)
    await host.fork_sandbox(source["id"], ForkBody(new_id=child_id, name="many-fork", start_paused=False))
    assert (await sh(host, child_id, "ls /root/many | wc -l"))["stdout"].strip() == "20000"
    phases = agent.logged("fork_phases", child_id)
    steps = [key.removesuffix("_ms") for key in phases if key.endswith("_ms")]
    assert steps[:5] == ["slot", "freeze", "sync", "quiesce", "clone"], steps
    wrote = await asyncio.wait_for(sh(host, source["id"], "echo after > /root/after && cat /root/after"), 10)
    assert wrote["stdout"] == "after\n", "the source's filesystem is thawed"
    await sh(host, child_id, "touch /root/many/child-only")
    assert (await run(host, source["id"], "test", "-e", "/root/many/child-only"))["exit_code"] == 1


def used_mib(directory: Path) -> int:
    stats = os.statvfs(directory)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize >> 20


async def test_fork_shares_the_source_data_keeps_writes_private_and_outlives_it(
    host: HostAgentClient, sandboxes: Sandboxes, agent: AgentProcess
) -> None:
    source = await sandboxes.create(name="holder")
    # 192 MiB of incompressible data, synced: a copying fork would write all of it again.
    await sh(host, source["id"], "head -c 192M /dev/urandom > /root/big && sync")
    digest = (await sh(host, source["id"], "sha256sum < /root/big"))["stdout"]
    store = agent.state_dir / "disks"
    before_mib = used_mib(store)
    child_id = f"{source['id']}-fork"
    sandboxes.track(child_id)
    await host.fork_sandbox(source["id"], ForkBody(new_id=child_id, name="sharer", start_paused=False))
    grown_mib = used_mib(store) - before_mib
    assert grown_mib < 64, f"the fork took {grown_mib} MiB of host disk for a 192 MiB source"
    assert (await sh(host, child_id, "sha256sum < /root/big"))["stdout"] == digest

    # Writes after the fork stay on their own side, both ways, in the shared file and in new ones.
    await sh(
        host, child_id, "head -c 1M /dev/zero | dd of=/root/big conv=notrunc status=none; echo c > /root/mine"
    )
    await sh(host, source["id"], "echo s > /root/mine; sync")
    assert (await sh(host, source["id"], "sha256sum < /root/big; cat /root/mine"))["stdout"] == digest + "s\n"
    child_digest = (await sh(host, child_id, "sha256sum < /root/big; cat /root/mine"))["stdout"]
    assert child_digest != digest + "c\n" and child_digest.endswith("c\n")

    # The source's end frees nothing the fork still reads (read again from disk, not from cache).
    tail = "tail -c +1048577 /root/big | sha256sum"
    source_tail = (await sh(host, source["id"], tail))["stdout"]
    await host.destroy_sandbox(source["id"])
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    assert (await sh(host, child_id, tail))["stdout"] == source_tail


@pytest.mark.parametrize("disk_mib", [1024, 3072])
async def test_a_fork_holds_writes_never_synced_on_a_disk_of_another_size(
    host: HostAgentClient, sandboxes: Sandboxes, disk_mib: int
) -> None:
    """The warm slot a fork takes (2 GiB) keeps its loop device while its image becomes the clone: a
    smaller or larger source disk, 100 MiB written and never synced (more than a disk may hold dirty),
    and a fork of that fork (whose journal was replayed at its mount) all come out whole."""
    source = await sandboxes.create(name="unsynced", disk_mib=disk_mib)
    digest = (await sh(host, source["id"], "head -c 100M /dev/urandom | tee /root/fresh | sha256sum"))[
        "stdout"
    ]
    size = "stat -f -c '%b %S' /root"
    source_blocks = (await sh(host, source["id"], size))["stdout"]
    parent = source["id"]
    for generation in ("child", "grandchild"):
        child_id = f"{source['id']}-{generation}"
        sandboxes.track(child_id)
        await host.fork_sandbox(parent, ForkBody(new_id=child_id, name=generation, start_paused=False))
        assert (await sh(host, child_id, "sha256sum < /root/fresh"))["stdout"] == digest
        assert (await sh(host, child_id, size))["stdout"] == source_blocks
        parent = child_id
    await sh(host, parent, "echo mine > /root/fresh")
    assert (await sh(host, source["id"], "sha256sum < /root/fresh"))["stdout"] == digest


async def test_fork_of_a_paused_sandbox_leaves_it_paused(host: HostAgentClient, sandboxes: Sandboxes) -> None:
    source = await sandboxes.create()
    await sh(host, source["id"], "echo kept > /root/note")
    await host.pause_sandbox(source["id"])
    child_id = f"{source['id']}-fork"
    sandboxes.track(child_id)
    child = await host.fork_sandbox(
        source["id"], ForkBody(new_id=child_id, name="paused-child", start_paused=True)
    )
    assert child.status == "paused"
    assert (await host.get_sandbox(source["id"])).status == "paused"
    await host.resume_sandbox(child_id)
    assert (await run(host, child_id, "cat", "/root/note"))["stdout"] == "kept\n"


# The holder detaches its copies of every mount but this agent's: on a host whose mounts are private,
# as here, a copy of them all would also hold the disks other tests' sandboxes had mounted, and keep
# those bound to their loop devices past their destroys for as long as it ran (a neighbour's check that
# its destroyed disk was freed failed in CI).
_HOLD_ONLY_MINE = r"""
import ctypes, sys, time
mine = sys.argv[1].rstrip("/") + "/"
libc = ctypes.CDLL(None, use_errno=True)
targets = [line.split()[4] for line in open("/proc/self/mountinfo")]
for target in reversed(targets):
    path = target.rstrip("/") + "/"
    if not path.startswith(mine) and not mine.startswith(path):
        libc.umount2(target.encode(), 2)  # MNT_DETACH
print("holding", flush=True)
time.sleep(60)
"""


async def test_a_fork_sees_its_source_while_another_mount_namespace_holds_the_warm_slots_disk(
    make_agent: Any,
) -> None:
    """A container starting on this host (any agent's) copies the host's mounts, the warm slots' empty
    disks among them, and holds them until it has switched roots. A fork that reuses such a slot's
    loop device would mount that still-living empty filesystem instead of its clone; it must see its
    source's files whatever holds the old mount.

    A pool of one slot and no parked sandboxes: its one free slot keeps its disk mounted (a larger pool
    readies one unmounted for forks, which no copy can hold), so the fork takes the held one."""
    agent: AgentProcess = make_agent(extra_env={"PADDOCK_HOST_POOL_SIZE": "1", "PADDOCK_HOST_POOL_IMAGE": ""})
    agent.start()
    async with agent.client() as host:
        sandboxes = Sandboxes(host, agent)
        try:
            source = await sandboxes.create()
            await sh(host, source["id"], "echo kept > /root/note")
            deadline = time.monotonic() + 30
            while (await host.info()).warm_slots < 1:
                assert time.monotonic() < deadline, "the warm pool did not refill"
                await asyncio.sleep(0.05)
            source_disk = Path(agent.record(source["id"])["driver_state"]["slot"]["disk_mount"])
            holder = await asyncio.create_subprocess_exec(
                *("unshare", "--mount", "--propagation", "private", sys.executable, "-c", _HOLD_ONLY_MINE),
                str(agent.state_dir),
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                assert holder.stdout is not None
                assert await asyncio.wait_for(holder.stdout.readline(), 10) == b"holding\n"
                held = {
                    Path(line.split()[4])
                    for line in Path(f"/proc/{holder.pid}/mountinfo").read_text().splitlines()
                }
                free_disks = {
                    path
                    for path in held
                    if path.name == "disk" and path.parent.parent == source_disk.parent.parent
                } - {source_disk}
                assert free_disks, f"the holder keeps no copy of the free slot's disk: {sorted(held)}"
                child_id = f"{source['id']}-fork"
                sandboxes.track(child_id)
                await host.fork_sandbox(
                    source["id"], ForkBody(new_id=child_id, name="held", start_paused=False)
                )
                forked_disk = Path(agent.record(child_id)["driver_state"]["slot"]["disk_mount"])
                assert forked_disk in free_disks, "the fork did not take the slot whose disk is held"
                assert (await run(host, child_id, "cat", "/root/note"))["stdout"] == "kept\n"
                await sh(host, child_id, "echo mine > /root/note")
                assert (await run(host, source["id"], "cat", "/root/note"))["stdout"] == "kept\n"
            finally:
                holder.kill()
                await holder.wait()
        finally:
            await sandboxes.destroy_all()


def _egress_listing(agent: AgentProcess, kind: str, name: str) -> str:
    listed = subprocess.run(
        ["nft", "list", kind, "ip", f"{agent.nft_table}_egress", name],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout


async def test_a_fork_answers_guarded_and_one_whose_boot_fails_leaves_no_rules(make_agent: Any) -> None:
    """A fork's egress rules go in beside its boot, from the moment its slot is taken: installed when
    it answers, and removed again when the boot fails after they went in."""
    agent = make_agent(extra_env={"PADDOCK_HOST_BOOT_TIMEOUT_S": "2"})
    agent.start()
    async with agent.client() as host:
        sandboxes = Sandboxes(host, agent)
        try:
            source = await sandboxes.create()
            guarded_id = f"{source['id']}-guarded"
            sandboxes.track(guarded_id)
            await host.fork_sandbox(
                source["id"], ForkBody(new_id=guarded_id, name="guarded", egress=["192.0.2.7"])
            )
            assert "192.0.2.7" in _egress_listing(agent, "set", "allow_net")
            assert _egress_listing(agent, "map", "out_chains").count("goto") == 2  # the source and its fork
            # A guest agent that never answers: the next fork's boot fails once its rules are in.
            guest = agent.state_dir / "guest" / "paddock-guest"
            guest.unlink()
            guest.write_text("#!/bin/sh\nexit 3\n")
            guest.chmod(0o755)
            failed_id = f"{source['id']}-failed"
            sandboxes.track(failed_id)
            failing = asyncio.create_task(
                host.fork_sandbox(
                    source["id"], ForkBody(new_id=failed_id, name="failed", egress=["192.0.2.8"])
                )
            )
            seen = False
            while not failing.done() and not seen:  # its boot waits 2 s for the guest
                await asyncio.sleep(0.05)
                seen = "192.0.2.8" in await asyncio.to_thread(_egress_listing, agent, "set", "allow_net")
            assert seen, "the fork's rules were not in while it booted"
            with pytest.raises(HostAgentError):
                await failing
            assert "192.0.2.8" not in _egress_listing(agent, "set", "allow_net")
            assert _egress_listing(agent, "map", "out_chains").count("goto") == 2
            with pytest.raises(SandboxMissingError):
                await host.get_sandbox(failed_id)
        finally:
            await sandboxes.destroy_all()


async def test_resize_grows_the_filesystem_live(host: HostAgentClient, sandboxes: Sandboxes) -> None:
    created = await sandboxes.create(disk_mib=2048)
    await sh(host, created["id"], "echo before > /root/file")

    async def size_mib() -> int:
        result = await run(host, created["id"], "df", "-B1M", "--output=size", "/")
        return int(result["stdout"].split()[-1])

    before = await size_mib()
    assert 1800 <= before <= 2048
    assert (await host.resize_sandbox(created["id"], 4096)).disk_mib == 4096
    after = await size_mib()
    assert after >= before + 1900, (before, after)
    # the extra space is usable, and nothing was lost
    result = await sh(host, created["id"], "fallocate -l 2500M /root/big && cat /root/file && rm /root/big")
    assert result["stdout"] == "before\n", result
    assert (await host.get_sandbox(created["id"])).disk_mib == 4096
    # a paused sandbox can be grown too; it sees the new size when it resumes
    await host.pause_sandbox(created["id"])
    assert (await host.resize_sandbox(created["id"], 6144)).disk_mib == 6144
    await host.resume_sandbox(created["id"])
    assert await size_mib() >= after + 1900
    with pytest.raises(HostAgentError) as shrink:
        await host.resize_sandbox(created["id"], 4096)
    assert shrink.value.status == 400


async def test_create_and_fork_join_the_networks_they_name(
    host: HostAgentClient, sandboxes: Sandboxes
) -> None:
    network_id = f"net_boot{secrets.token_hex(3)}"
    created = await sandboxes.create(
        networks=[{"network_id": network_id, "ip": "10.96.251.2", "prefixlen": 24}]
    )
    view = await host.get_sandbox(created["id"])
    assert [(n.network_id, n.ip, n.prefixlen, n.ifname) for n in view.networks] == [
        (network_id, "10.96.251.2", 24, "eth1")
    ]
    assert "10.96.251.2/24" in (await sh(host, created["id"], "ip -4 -o addr show dev eth1"))["stdout"]
    child_id = f"{created['id']}-fork"
    sandboxes.track(child_id)
    joined = NetworkAttachBody(network_id=network_id, ip=IPv4Address("10.96.251.3"), prefixlen=24)
    await host.fork_sandbox(created["id"], ForkBody(new_id=child_id, name="joined-child", networks=[joined]))
    assert [n.ip for n in (await host.get_sandbox(child_id)).networks] == ["10.96.251.3"]
    assert (await sh(host, child_id, "ping -c1 -W2 10.96.251.2"))["exit_code"] == 0  # on one bridge


async def test_sandbox_cgroups_nest_under_the_agents_own(
    agent: AgentProcess, sandbox: dict[str, Any]
) -> None:
    assert agent.process is not None
    own = dict(
        line.split(":", 2)[1:] for line in Path(f"/proc/{agent.process.pid}/cgroup").read_text().splitlines()
    )
    cgroups_path = agent.record(sandbox["id"])["driver_state"]["cgroups_path"]
    assert cgroups_path.startswith(own["memory"].rstrip("/") + "/paddock-")
    limit = Path(f"/sys/fs/cgroup/memory{cgroups_path}/memory.limit_in_bytes").read_text()
    assert int(limit) == 512 << 20


async def test_info_accounts_for_placed_memory(host: HostAgentClient, sandboxes: Sandboxes) -> None:
    before = await host.info()
    created = await sandboxes.create(mem_mib=768)
    after = await host.info()
    assert after.free_mib == before.free_mib - 768
    assert after.vm_count == before.vm_count + 1
    assert "debian:13" in after.rootfses
    await host.destroy_sandbox(created["id"])
    assert (await host.info()).free_mib == before.free_mib


async def test_duplicate_ids_are_refused(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    with pytest.raises(BadStateError):
        await host.create_sandbox(
            CreateSandboxBody(
                id=sandbox["id"], name="again", rootfs="debian:13", vcpu=1, mem_mib=256, disk_mib=2048
            )
        )


async def test_concurrent_creates_get_distinct_addresses(host: HostAgentClient, sandboxes: Sandboxes) -> None:
    created = await asyncio.gather(*(sandboxes.create() for _ in range(5)))  # more than the warm pool holds
    assert len({sandbox["ip"] for sandbox in created}) == 5
    results = await asyncio.gather(*(run(host, sandbox["id"], "hostname", "-I") for sandbox in created))
    assert [result["stdout"].strip() for result in results] == [sandbox["ip"] for sandbox in created]


@pytest.mark.parametrize("delay_s", [None, 0.0, 0.005, 0.05], ids=["destroy-first", "0ms", "5ms", "50ms"])
async def test_a_destroy_that_overtakes_its_create_still_destroys(
    agent: AgentProcess, host: HostAgentClient, delay_s: float | None
) -> None:
    """Whatever the order the create and the destroy of one id reach the agent (they come on different
    connections: under load the destroy, sent ``delay_s`` after the create, may arrive first; or it is
    sent before it), a destroy that answers ``destroyed`` leaves no sandbox of that id, then or later."""
    sandbox_id = f"sb-overtaken-{secrets.token_hex(4)}"
    agent.created_ids.append(sandbox_id)
    body = CreateSandboxBody(
        id=sandbox_id, name="racer", rootfs="debian:13", vcpu=1, mem_mib=256, disk_mib=4096
    )
    before = await host.info()
    if delay_s is None:
        assert (await host.destroy_sandbox(sandbox_id)).destroyed
        with pytest.raises(SandboxMissingError):
            await host.create_sandbox(body)
    else:
        create = asyncio.create_task(host.create_sandbox(body))
        await asyncio.sleep(delay_s)
        assert (await host.destroy_sandbox(sandbox_id)).destroyed
        (created,) = await asyncio.gather(create, return_exceptions=True)
        # Either the create came first (and was undone) or it was refused as destroyed; nothing else.
        assert isinstance(created, CreateSandboxResult | SandboxMissingError), repr(created)
    with pytest.raises(SandboxMissingError):
        await host.get_sandbox(sandbox_id)
    assert sandbox_id not in [view.id for view in await host.list_sandboxes()]
    after = await host.info()
    assert (after.vm_count, after.free_mib) == (before.vm_count, before.free_mib)  # no slot or memory held
    assert not (agent.state_dir / "sandboxes" / f"{sandbox_id}.json").exists()
    assert sandbox_cgroup_dirs([sandbox_id]) == []


async def test_a_sandbox_whose_init_dies_is_reported_stopped_and_still_destroyable(
    agent: AgentProcess, host: HostAgentClient, sandboxes: Sandboxes
) -> None:
    created = await sandboxes.create()
    driver_state = agent.record(created["id"])["driver_state"]
    init_pid = driver_state["init_pid"]
    os.kill(init_pid, 9)  # e.g. the host's OOM killer, or an operator
    for _ in range(100):
        if (await host.get_sandbox(created["id"])).status == "stopped":
            break
        await asyncio.sleep(0.02)
    assert (await host.get_sandbox(created["id"])).status == "stopped"
    with pytest.raises(BadStateError):
        await run(host, created["id"], "true")
    with pytest.raises(BadStateError):
        await host.pause_sandbox(created["id"])
    await host.destroy_sandbox(created["id"])
    with pytest.raises(SandboxMissingError):
        await host.get_sandbox(created["id"])
    assert cgroup_dirs(driver_state["cgroups_path"]) == []


async def wait_self_request(host: HostAgentClient, sandbox_id: str) -> dict[str, Any] | None:
    for _ in range(60):
        request = (await host.get_sandbox(sandbox_id)).self_request
        if request:
            return dict(request)
        await asyncio.sleep(0.1)
    return None


async def test_code_inside_can_ask_for_its_own_pause(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    url = "http://127.0.0.1:1029/self/pause?reason=batch%20done"
    result = await run(
        host, sandbox["id"], "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", url
    )
    assert result["stdout"] == "202"
    request = await wait_self_request(host, sandbox["id"])
    assert request is not None and request["action"] == "pause" and request["reason"] == "batch done"
    await host.pause_sandbox(sandbox["id"])  # what the control plane does with it
    assert (await host.get_sandbox(sandbox["id"])).self_request is None
    await host.resume_sandbox(sandbox["id"])
    other = await run(
        host,
        sandbox["id"],
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://127.0.0.1:1029/nope",
    )
    assert other["stdout"] == "404"
    wrong = await run(
        host,
        sandbox["id"],
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://127.0.0.1:1029/self/delete",
    )
    assert wrong["stdout"] == "405"


async def test_the_self_fifo_asks_for_deletion(host: HostAgentClient, sandbox: dict[str, Any]) -> None:
    result = await sh(host, sandbox["id"], "test -p /run/self && echo retire > /run/self")
    assert result["exit_code"] == 0, result
    request = await wait_self_request(host, sandbox["id"])
    assert request is not None and request["action"] == "delete" and request["reason"] == ""
