"""Memory overcommit: a host offers more than its memory for placement, and all its sandboxes together
stay capped at that memory, so a sandbox that really uses what was overcommitted is what the kernel
kills — reported as that sandbox's OOM kill — while the agent and the other sandboxes go on.

Disk overcommit: sparse disks are thin-provisioned by default, so a hundred sandboxes with the default
10 GiB disk run at once on the dev box (~70 GiB free), where promising each disk in full stopped at 7;
what backs it is the watermark (tests/hostagent/test_disk_fill.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from paddock_hostagent.capacity import MIB, DiskView, MemoryView, Promise, Promised
from paddock_hostagent.client import HostAgentError
from paddock_hostagent.errors import InsufficientCapacity
from paddock_hostagent.settings import HostAgentSettings
from tests.hostagent.conftest import AgentProcess, Sandboxes, run, sh

pytestmark = pytest.mark.root


def idle(count: int, limit_mib: int = 256, used_mib: int = 2) -> list[Promise]:
    return [Promise(limit_mib, used_mib * MIB) for _ in range(count)]


def test_ratio_one_promises_every_limit_in_full() -> None:
    view = MemoryView(total_mib=1024, reserved_mib=100, available_mib=2000, promised=Promised.of(idle(3)))
    assert view.budget_free_mib == 1024 - 768
    assert view.machine_free_mib == 2000 - 100 - 3 * 254
    assert view.free_mib == 256


def test_an_overcommitted_host_places_idle_sandboxes_by_the_ratio() -> None:
    # 23 GiB offered 12x: a thousand idle 256 MiB sandboxes fit, as the field's dense hosts pack them.
    view = MemoryView(
        total_mib=23_000,
        reserved_mib=1024,
        available_mib=22_000,
        promised=Promised.of(idle(1000)),
        overcommit=12,
    )
    assert view.schedulable_mib == 276_000
    assert view.budget_free_mib == 276_000 - 256_000
    # expected growth: 256,000 / 12 promised share less 2,000 used
    assert view.unused_mib == 21_333 - 2000
    assert view.free_mib >= 256


def test_memory_really_in_use_stops_placement_whatever_the_ratio() -> None:
    busy = [Promise(256, 200 * MIB) for _ in range(100)]  # 20,000 MiB really in use
    view = MemoryView(
        total_mib=23_000, reserved_mib=1024, available_mib=1100, promised=Promised.of(busy), overcommit=12
    )
    assert view.budget_free_mib > 200_000  # the promise accounting alone would go on
    assert view.free_mib == (1100 - 1024) * 12  # what is really left, times the ratio
    view.admit(512)
    with pytest.raises(InsufficientCapacity) as refused:
        view.admit(2048)
    assert str(refused.value).startswith("2048 MiB requested, 912 MiB free (memory: the machine has 1100 MiB")


def test_disk_overcommit_admits_sparse_disks_by_the_ratio_and_refuses_by_real_use() -> None:
    disks = [Promise(2048, 20 * MIB) for _ in range(500)]  # 1,000 GiB promised, 10 GiB held
    assert DiskView(70_000, 4096, Promised.of(disks)).free_mib == 0
    view = DiskView(70_000, 4096, Promised.of(disks), overcommit=32)
    assert view.unused_mib == 1_024_000 // 32 - 10_000
    assert view.free_mib == (70_000 - 4096 - view.unused_mib) * 32
    view.admit(2048)
    full = DiskView(4200, 4096, Promised.of(disks), overcommit=32)
    with pytest.raises(InsufficientCapacity) as refused:
        full.admit(2048)
    assert "overcommitted 32×" in str(refused.value)


def test_the_default_disk_overcommit_fits_a_hundred_default_sandboxes_on_this_host() -> None:
    # The dev box: ~70 GiB free. Promising every 10 GiB disk in full refused the eighth sandbox; thin
    # provisioning by default counts each as 512 MiB of real room, so the hundredth fits.
    defaults = HostAgentSettings()
    assert defaults.disk_overcommit == 20
    idle_disks = [Promise(10240, 20 * MIB) for _ in range(99)]
    DiskView(70_000, defaults.disk_reserved_mib, Promised.of(idle_disks), defaults.disk_overcommit).admit(
        10240
    )
    with pytest.raises(InsufficientCapacity):
        DiskView(70_000, defaults.disk_reserved_mib, Promised.of(idle_disks[:7])).admit(10240)
    # Real use still stops it: 99 disks really holding 700 MiB each leave 700 MiB, less than the reserve.
    busy = [Promise(10240, 700 * MIB) for _ in range(99)]
    with pytest.raises(InsufficientCapacity) as refused:
        DiskView(
            70_000 - 99 * 700, defaults.disk_reserved_mib, Promised.of(busy), defaults.disk_overcommit
        ).admit(10240)
    assert str(refused.value).startswith(
        "10240 MiB requested, 0 MiB free (disk: the host's filesystem has 700"
    )


def test_a_host_whose_writers_are_held_admits_no_disk_and_says_why() -> None:
    view = DiskView(400, 256, Promised.of([Promise(10240, 0)]), 20, held=2, release_mib=3072)
    with pytest.raises(InsufficientCapacity) as refused:
        view.admit(512)
    assert str(refused.value) == (
        "512 MiB requested, 0 MiB free (disk: the host's disk store is low, 400 MiB free; the writes of 2 "
        "sandboxes are held until it has 3072 MiB free)"
    )


async def test_overcommitted_host_admits_past_its_memory_and_kills_inside_the_cap(make_agent: Any) -> None:
    agent: AgentProcess = make_agent(
        pool_size=1, extra_env={"PADDOCK_HOST_MEMORY_OVERCOMMIT": "4", "PADDOCK_HOST_TOTAL_MIB": "384"}
    )
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        try:
            info = await host.info()
            assert info.total_mib == 4 * 384 and info.free_mib == 4 * 384
            made = [await tracker.create(mem_mib=512) for _ in range(3)]  # 1,536 MiB on a 384 MiB host
            with pytest.raises(HostAgentError) as refused:
                await tracker.create(mem_mib=512)
            assert refused.value.status == 507 and "overcommitted 4×" in str(refused.value)

            # 450 MB fits the sandbox's own 512 MiB limit but not the host's 384 MiB for all sandboxes.
            hog = await sh(host, made[0]["id"], "head -c 450000000 /dev/zero | tail > /dev/null")
            assert hog["exit_code"] == 137, hog
            assert (await host.get_sandbox(made[0]["id"])).oom_kills >= 1
            for sandbox in made:
                assert (await run(host, sandbox["id"], "echo", "alive"))["stdout"] == "alive\n"
            assert (await host.info()).id == info.id  # the agent itself was not touched
        finally:
            await tracker.destroy_all()


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_a_hundred_sandboxes_with_the_default_disk_run_at_once(make_agent: Any) -> None:
    # The agent's own disk defaults (overcommit, reserve, watermarks); 10 GiB disks as the API's default.
    agent: AgentProcess = make_agent(pool_size=2, extra_env={"PADDOCK_HOST_POOL_DISK_MIB": "10240"})
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        try:
            made = []
            for _ in range(100):  # one after another, as a burst of users would get them placed
                made.append(await tracker.create(mem_mib=128, disk_mib=10240))
            views = {view.id: view for view in await host.list_sandboxes()}
            assert len(views) == 100
            assert all(views[sandbox["id"]].status == "running" for sandbox in made)
            assert {views[sandbox["id"]].disk_mib for sandbox in made} == {10240}

            async def echo(sandbox_id: str) -> str:
                return str((await run(host, sandbox_id, "echo", sandbox_id))["stdout"])

            answers: list[str] = []
            for start in range(0, 100, 20):
                batch = [sandbox["id"] for sandbox in made[start : start + 20]]
                answers += await asyncio.gather(*map(echo, batch))
            assert answers == [f"{sandbox['id']}\n" for sandbox in made]
            assert (await host.info()).disk_held == []
        finally:
            await tracker.destroy_all()
