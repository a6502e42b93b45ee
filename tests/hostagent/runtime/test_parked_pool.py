"""Sandboxes parked in the warm pool (drivers/runtime/pool.py): a create of the pool image claims a booted one
and gets exactly what a cold boot gives — its name, addresses, limits and a clean teardown."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import HostAgentClient
from paddock_hostagent.schemas import ForkBody
from tests.hostagent.conftest import AgentProcess, Sandboxes, cgroup_dirs, leftovers, run, sh

pytestmark = pytest.mark.root


async def wait_parked(host: HostAgentClient, count: int) -> None:
    for _ in range(300):
        if (await host.info()).parked_slots >= count:
            break
        await asyncio.sleep(0.05)
    assert (await host.info()).parked_slots >= count, "the warm pool parked no sandbox"


def cgroup_value(cgroups_path: str, hierarchy: str, name: str) -> int:
    return int(Path(f"/sys/fs/cgroup/{hierarchy}{cgroups_path}/{name}").read_text())


def limits(cgroups_path: str) -> tuple[int, int, int]:
    """The group's memory limit, memory+swap limit and CPU quota."""
    return (
        cgroup_value(cgroups_path, "memory", "memory.limit_in_bytes"),
        cgroup_value(cgroups_path, "memory", "memory.memsw.limit_in_bytes"),
        cgroup_value(cgroups_path, "cpu", "cpu.cfs_quota_us"),
    )


async def claim(
    agent: AgentProcess, host: HostAgentClient, sandboxes: Sandboxes, **overrides: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A create once a sandbox is parked, which claimed it: the answer and the record's driver state."""
    await wait_parked(host, 1)
    created = await sandboxes.create(**overrides)
    assert agent.logged("create_phases", created["id"])["parked"] is True
    return created, agent.record(created["id"])["driver_state"]


async def test_a_claimed_sandbox_has_its_own_name_limits_and_identity(
    agent: AgentProcess, host: HostAgentClient, sandboxes: Sandboxes
) -> None:
    created, driver_state = await claim(
        agent, host, sandboxes, name="claimed-box", mem_mib=768, cpu_quota_pct=50
    )
    assert driver_state["container_id"].startswith("parked-")  # the slot's container, claimed
    result = await sh(host, created["id"], "hostname; cat /etc/hostname; grep claimed-box /etc/hosts")
    assert result["stdout"] == f"claimed-box\nclaimed-box\n{created['ip']}\tclaimed-box\n"
    cgroups_path = driver_state["cgroups_path"]
    assert limits(cgroups_path) == (768 << 20, 768 << 20, 50_000)
    # The limit holds: a process past it is killed inside the sandbox, and the sandbox says so.
    oom = await sh(host, created["id"], "head -c 900m /dev/zero | tail > /dev/null; echo $?")
    assert oom["stdout"].strip() != "0"
    assert (await host.get_sandbox(created["id"])).oom_kills >= 1

    await host.destroy_sandbox(created["id"])
    assert cgroup_dirs(cgroups_path) == []
    assert not Path(f"/run/paddock/crun/{driver_state['container_id']}").exists()


async def test_a_claimed_sandbox_smaller_than_the_parked_limits_gets_its_own(
    agent: AgentProcess, host: HostAgentClient, sandboxes: Sandboxes
) -> None:
    """Lowering the limits goes memory first, memory+swap second (the kernel refuses the other order)."""
    _, driver_state = await claim(agent, host, sandboxes, name="small-box", mem_mib=128, vcpu=2)
    assert limits(driver_state["cgroups_path"]) == (128 << 20, 128 << 20, 200_000)  # two whole CPUs


async def test_a_claimed_sandbox_can_start_paused_and_be_forked(
    agent: AgentProcess, host: HostAgentClient, sandboxes: Sandboxes
) -> None:
    created, _ = await claim(agent, host, sandboxes, name="sleeper", start_paused=True)
    assert created["status"] == "paused"
    await host.resume_sandbox(created["id"])
    await sh(host, created["id"], "echo kept > /root/note")
    fork_id = created["id"] + "-fork"
    sandboxes.track(fork_id)
    await host.fork_sandbox(created["id"], ForkBody(new_id=fork_id, name="offspring"))
    assert (await sh(host, fork_id, "cat /root/note; hostname"))["stdout"] == "kept\noffspring\n"
    assert (await run(host, created["id"], "hostname"))["stdout"] == "sleeper\n"


async def test_a_restarted_agent_stops_the_sandboxes_parked_by_the_one_before(make_agent: Any) -> None:
    agent: AgentProcess = make_agent(pool_size=3)
    agent.start()
    async with agent.client() as host:
        await wait_parked(host, 2)
        tracker = Sandboxes(host, agent)
        claimed = await tracker.create(name="keeper")
        await wait_parked(host, 2)
    parked_inits = []
    for slot_file in (agent.state_dir / "slots").glob("*/slot.json"):
        parked = json.loads(slot_file.read_text()).get("parked")
        if parked and slot_file.parent.name != agent.record(claimed["id"])["driver_state"]["slot"]["id"]:
            parked_inits.append(parked["init_pid"])
    assert len(parked_inits) >= 2

    agent.stop(signal.SIGKILL)  # a crash: the parked sandboxes are left running
    assert all(Path(f"/proc/{pid}").exists() for pid in parked_inits)
    agent.process = None
    agent.start()
    async with agent.client() as host:
        tracker.host = host
        for pid in parked_inits:  # the old agent's parked sandboxes are stopped at start
            assert not Path(f"/proc/{pid}").exists() or _is_zombie_or_other(pid)
        assert (await run(host, claimed["id"], "hostname"))["stdout"] == "keeper\n"  # the claimed one stays
        await tracker.destroy_all()


def _is_zombie_or_other(pid: int) -> bool:
    """The pid is gone, or now names another process (recycled) that is not a parked guest agent."""
    try:
        return "paddock-guest" not in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return True


async def test_pool_image_empty_parks_nothing(make_agent: Any) -> None:
    agent: AgentProcess = make_agent(extra_env={"PADDOCK_HOST_POOL_IMAGE": ""})
    agent.start()
    async with agent.client() as host:
        for _ in range(100):
            if (await host.info()).warm_slots >= agent.pool_size:
                break
            await asyncio.sleep(0.05)
        info = await host.info()
        assert info.warm_slots == agent.pool_size and info.parked_slots == 0
        tracker = Sandboxes(host, agent)
        created = await tracker.create(name="cold")
        assert agent.logged("create_phases", created["id"])["parked"] is False
        assert (await run(host, created["id"], "hostname"))["stdout"] == "cold\n"
        await tracker.destroy_all()


def half_parked_slots(agent: AgentProcess) -> list[str]:
    """The agent's slots with a parked container that the runtime has started to create but whose
    init the slot's record does not know yet (the parking is half-way)."""
    found = []
    for slot_dir in (agent.state_dir / "slots").glob("*"):
        if not Path(f"/run/paddock/crun/parked-{slot_dir.name}").exists():
            continue
        try:
            parked = json.loads((slot_dir / "slot.json").read_text()).get("parked")
        except (OSError, ValueError):
            continue
        if not parked or not parked["init_pid"]:
            found.append(slot_dir.name)
    return found


async def test_an_agent_killed_while_parking_leaves_nothing_running(make_agent: Any) -> None:
    """The parked container's id and cgroup are recorded before it boots, so the next agent stops a
    sandbox whose parking a crash cut short (the teardown also checks that nothing of the agent is
    left: such a container would keep its cgroup)."""
    agent: AgentProcess = make_agent(pool_size=3)
    agent.start()
    for _ in range(20_000):
        if half_parked_slots(agent):
            break
        await asyncio.sleep(0.0005)
    cut_short = half_parked_slots(agent)
    assert cut_short, "no parking was seen half-way"
    agent.stop(signal.SIGKILL)
    agent.process = None
    agent.start()
    async with agent.client() as host:
        await wait_parked(host, 2)
        created = await Sandboxes(host, agent).create(name="after-a-crash")
        assert (await run(host, created["id"], "hostname"))["stdout"] == "after-a-crash\n"
        await host.destroy_sandbox(created["id"])
    for slot in cut_short:  # the restarted agent stopped the container and removed the slot
        assert not Path(f"/run/paddock/crun/parked-{slot}").exists()
        assert not (agent.state_dir / "slots" / slot).exists()


def freeze_a_parking(agent: AgentProcess) -> str | None:
    """Freezes the container of a parking under way (its cgroup is there, its init not yet recorded),
    so that its guest agent never answers and the parking does not end; the slot's id."""
    for slot_dir in (agent.state_dir / "slots").glob("*"):
        try:
            parked = json.loads((slot_dir / "slot.json").read_text()).get("parked")
        except (OSError, ValueError):
            continue
        if not parked or parked["init_pid"]:
            continue
        freezer = Path(f"/sys/fs/cgroup/freezer{parked['cgroups_path']}")
        try:
            if (freezer / "cgroup.procs").read_text().split():
                (freezer / "freezer.state").write_text("FROZEN")
                return slot_dir.name
        except OSError:
            continue
    return None


async def test_an_agent_stopped_while_parking_leaves_no_slot_behind(make_agent: Any) -> None:
    """An agent told to stop (SIGTERM) while a parking does not end (its sandbox's guest never answers:
    frozen here, a loaded host in CI): the pool waits for it a while, then cancels it, and the slot it
    was parking in goes with the others: nothing of the agent's is left after the stop, nor after the
    next start."""
    agent: AgentProcess = make_agent(pool_size=3, extra_env={"PADDOCK_HOST_BOOT_TIMEOUT_S": "120"})
    agent.start()
    stuck = None
    for _ in range(40_000):
        stuck = freeze_a_parking(agent)
        if stuck:
            break
        await asyncio.sleep(0.0005)
    assert stuck, "no parking was caught half-way"
    await asyncio.sleep(1.0)
    parked = json.loads((agent.state_dir / "slots" / stuck / "slot.json").read_text())["parked"]
    assert parked["init_pid"] == 0, "the parking ended before its container was frozen"

    agent.stop()
    assert leftovers(agent.state_dir) == []  # the stopping agent removed the slot it was parking in
    assert not Path(f"/run/paddock/crun/parked-{stuck}").exists()

    agent.process = None
    agent.start()
    async with agent.client() as host:
        await wait_parked(host, 2)
    assert not (agent.state_dir / "slots" / stuck).exists()
    assert not Path(f"/run/netns/pdk-{stuck}").exists()
