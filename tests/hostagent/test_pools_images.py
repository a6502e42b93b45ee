"""The per-image pools (drivers/runtime/pool.py, ``ImagePools``): once an image the default pool does not park
(``devbox:1``), or a disk smaller than the pool's, has been asked for, the agent parks a sandbox of it, and
the next such create claims it and gets exactly what a cold boot gives: the image's files, its own name,
limits and disk size. A parked sandbox is promised to no one."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_hostagent.client import HostAgentClient
from paddock_hostagent.drivers.storage import xfsreadahead
from paddock_hostagent.images import ImageStore
from paddock_hostagent.schemas import ForkBody
from tests.hostagent.conftest import AgentProcess, Sandboxes, image_cache, run, sh

pytestmark = pytest.mark.root

POOL_SIZE = 2  # the default pool: one slot readied for forks, one parked debian:13 at 10 GiB


@pytest.fixture
async def pools(make_agent: Any) -> Any:
    """An agent whose default pool parks debian:13 at the default 10 GiB (as in production)."""
    agent: AgentProcess = make_agent(pool_size=POOL_SIZE, extra_env={"PADDOCK_HOST_POOL_DISK_MIB": "10240"})
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        try:
            yield agent, host, tracker
        finally:
            await tracker.destroy_all()


def pool_slots(agent: AgentProcess) -> dict[str, float]:
    """The agent's ``paddock_host_pool_slots`` by kind: ``parked`` (the default pool's), ``images``."""
    text = httpx.get(agent.url + "/metrics", timeout=10).text
    found = re.findall(r'^paddock_host_pool_slots\{kind="(\w+)"\} ([0-9.e+]+)$', text, re.MULTILINE)
    return {kind: float(value) for kind, value in found}


async def wait_parked(agent: AgentProcess, kind: str, count: int, what: str) -> None:
    for _ in range(600):
        if pool_slots(agent).get(kind, 0) >= count:
            break
        await asyncio.sleep(0.05)
    assert pool_slots(agent).get(kind, 0) >= count, f"no sandbox of {what} was parked"


def cgroup_limits(cgroups_path: str) -> tuple[int, int]:
    memory = Path(f"/sys/fs/cgroup/memory{cgroups_path}/memory.limit_in_bytes").read_text()
    quota = Path(f"/sys/fs/cgroup/cpu{cgroups_path}/cpu.cfs_quota_us").read_text()
    return int(memory), int(quota)


async def root_size_mib(host: HostAgentClient, sandbox_id: str) -> int:
    return int((await sh(host, sandbox_id, "df -BM --output=size / | tail -1 | tr -dc 0-9"))["stdout"])


async def test_a_devbox_create_claims_a_parked_devbox_with_its_files_and_the_users_limits(pools: Any) -> None:
    """The parked devbox has a 2 GiB disk (the size first asked for); a create asking 4 GiB claims it,
    grown on claim without writing the grown superblock home (that freeze is left out of the create):
    XFS's log worker writes it home within a second or so, or a fork before that freezes the source
    for its clone; either way the fork copies the grown disk whole."""
    agent, host, sandboxes = pools
    ImageStore(image_cache()).build("devbox:1")
    await wait_parked(agent, "parked", POOL_SIZE - 1, "debian:13")
    baseline = await host.info()
    first = await sandboxes.create(rootfs="devbox:1", disk_mib=2048)  # boots cold, and is counted
    assert agent.logged("create_phases", first["id"])["parked"] is False
    await host.destroy_sandbox(first["id"])
    await wait_parked(agent, "images", 1, "devbox:1")
    parked = await host.info()
    # Parked, not promised: no sandbox on the host, and nothing of the admission's budget taken.
    assert parked.vm_count == 0
    assert parked.free_mib >= baseline.free_mib - 64

    created = await sandboxes.create(
        rootfs="devbox:1", name="dev-claimed", mem_mib=768, cpu_quota_pct=50, disk_mib=4096
    )
    assert agent.logged("create_phases", created["id"])["parked"] is True
    assert (await run(host, created["id"], "git", "--version"))["stdout"].startswith("git version")
    assert (await sh(host, created["id"], "command -v gcc make python3"))["exit_code"] == 0
    identity = await sh(host, created["id"], "hostname; cat /etc/hostname; grep dev-claimed /etc/hosts")
    assert identity["stdout"] == f"dev-claimed\ndev-claimed\n{created['ip']}\tdev-claimed\n"
    env = await run(host, created["id"], "printenv", "GREETING", env={"GREETING": "hello"})
    assert env["stdout"] == "hello\n"
    assert cgroup_limits(agent.record(created["id"])["driver_state"]["cgroups_path"]) == (768 << 20, 50_000)
    view = await host.get_sandbox(created["id"])
    assert (view.rootfs, view.mem_mib, view.disk_mib) == ("devbox:1", 768, 4096)
    assert 3900 <= await root_size_mib(host, created["id"]) <= 4096
    # The space is there: 3 GiB would not fit the disk it was parked with.
    written = await sh(host, created["id"], "fallocate -l 3G /root/big && stat -c %s /root/big")
    assert written["stdout"] == f"{3 << 30}\n"
    fork_id = created["id"] + "-fork"
    sandboxes.track(fork_id)
    await host.fork_sandbox(created["id"], ForkBody(new_id=fork_id, name="dev-fork"))
    assert (await sh(host, fork_id, "stat -c %s /root/big; hostname"))["stdout"] == f"{3 << 30}\ndev-fork\n"
    assert 3900 <= await root_size_mib(host, fork_id) <= 4096
    image = Path(agent.record(created["id"])["driver_state"]["slot"]["disk_image"])
    assert xfsreadahead.superblock_blocks(image) == 4096 << 8, "the grown superblock is home"


async def test_a_small_disk_claims_a_parked_sandbox_of_its_size(pools: Any) -> None:
    """The default pool's disks are 10 GiB, which cannot shrink: once a 2 GiB disk has been asked for,
    the next 2 GiB create claims a sandbox parked on one."""
    agent, host, sandboxes = pools
    await wait_parked(agent, "parked", POOL_SIZE - 1, "debian:13")
    first = await sandboxes.create(disk_mib=2048)
    assert agent.logged("create_phases", first["id"])["parked"] is False
    await host.destroy_sandbox(first["id"])
    await wait_parked(agent, "images", 1, "debian:13 on a 2 GiB disk")

    created = await sandboxes.create(name="small-disk", disk_mib=2048)
    assert agent.logged("create_phases", created["id"])["parked"] is True
    assert 1900 <= await root_size_mib(host, created["id"]) <= 2048
    assert (await run(host, created["id"], "hostname"))["stdout"] == "small-disk\n"
