"""A destroy removes everything of its sandbox but, at most, a pristine network kept for the next slot;
that network serves the next sandbox (drivers/runtime/pool.py's recycling) only when nothing of its
tenant is left in it: the next tenant on it finds none of the last one's files, processes, egress
rules or routes, and a network that carried a packet is destroyed, never reused."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_hostagent.client import HostAgentClient, SandboxMissingError
from paddock_hostagent.schemas import CreateSandboxBody
from tests.hostagent.conftest import (
    AgentProcess,
    Sandboxes,
    cgroup_dirs,
    sandbox_cgroup_dirs,
    sh,
    teardown_agent,
)

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def bare_agent(debian_image: Path, guest_binary_dir: Path) -> Iterator[AgentProcess]:
    """An agent without a warm pool: every create builds its slot, so the one after a destroy is
    built on the network that destroy left (if it was kept)."""
    process = AgentProcess(
        state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"), guest_dir=guest_binary_dir, pool_size=0
    )
    process.start()
    try:
        yield process
    finally:
        teardown_agent(process)


@pytest.fixture
async def boxes(bare_agent: AgentProcess) -> AsyncIterator[Sandboxes]:
    async with bare_agent.client() as client:
        tracker = Sandboxes(client, bare_agent)
        try:
            yield tracker
        finally:
            await tracker.destroy_all()


def slot_of(agent: AgentProcess, sandbox_id: str) -> str:
    return str(agent.record(sandbox_id)["driver_state"]["slot"]["id"])


def egress_table(agent: AgentProcess) -> str:
    return subprocess.run(
        ["nft", "-j", "list", "table", "ip", f"{agent.nft_table}_egress"], capture_output=True, text=True
    ).stdout


async def test_destroy_removes_everything_and_is_idempotent(
    bare_agent: AgentProcess, boxes: Sandboxes
) -> None:
    # On the agent without a pool: a pool refilling after the create would rebuild a slot on the network
    # this destroy keeps, and its new disk would be in the directory checked below (CI saw `disk` there).
    agent, host = bare_agent, boxes.host
    created = (
        await host.create_sandbox(
            CreateSandboxBody(
                id="sb-destroy-me", name="doomed", rootfs="debian:13", vcpu=1, mem_mib=256, disk_mib=2048
            )
        )
    ).model_dump()
    agent.created_ids.append(created["id"])
    driver_state = agent.record(created["id"])["driver_state"]
    slot = driver_state["slot"]
    assert cgroup_dirs(driver_state["cgroups_path"])
    await host.destroy_sandbox(created["id"])
    assert (await host.destroy_sandbox(created["id"])).destroyed
    with pytest.raises(SandboxMissingError):
        await host.get_sandbox(created["id"])
    assert cgroup_dirs(driver_state["cgroups_path"]) == []
    assert sandbox_cgroup_dirs([created["id"]]) == []
    if Path(f"/run/netns/pdk-{slot['id']}").exists():  # kept, pristine, for the next slot (pool.py)
        assert [path.name for path in Path(slot["dir"]).iterdir()] == ["slot.json"]  # nothing else of it
    else:
        assert not Path(f"/sys/class/net/pdk{slot['id']}").exists()
        assert not Path(slot["dir"]).exists()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert slot["dir"] not in mounts
    loop = os.path.basename(slot["loop_device"])
    backing = Path(f"/sys/block/{loop}/loop/backing_file")
    assert not backing.exists() or slot["dir"] not in backing.read_text()
    assert not (agent.state_dir / "sandboxes" / f"{created['id']}.json").exists()


async def test_the_next_tenant_on_a_recycled_network_finds_nothing_of_the_last(
    bare_agent: AgentProcess, boxes: Sandboxes
) -> None:
    host: HostAgentClient = boxes.host
    first = await boxes.create(name="first-tenant", egress=["203.0.113.7"], bandwidth_quota_bytes=1 << 30)
    left = await sh(
        host,
        first["id"],
        "echo secret > /root/first-was-here; nohup sleep 777 >/dev/null 2>&1 & echo started",
    )
    assert left["stdout"] == "started\n"
    first_slot = slot_of(bare_agent, first["id"])
    assert "203.0.113.7" in egress_table(bare_agent)
    await host.destroy_sandbox(first["id"])

    second = await boxes.create(name="second-tenant")
    assert slot_of(bare_agent, second["id"]) == first_slot  # the same netns, veth and address
    assert second["ip"] == first["ip"]
    seen = await sh(
        host,
        second["id"],
        "hostname; ls /root; ps -eo args | grep -c '[s]leep 777'; cat /proc/net/route | wc -l;"
        " ls /sys/class/net",
    )
    # Its own name, an empty home, no process of the last tenant, the two routes _build made, lo and eth0.
    assert seen["stdout"] == "second-tenant\n0\n3\neth0\nlo\n"
    table = egress_table(bare_agent)
    assert "203.0.113.7" not in table  # the last tenant's allowlist went with it
    quotas = [obj for obj in json.loads(table)["nftables"] if "quota" in obj]
    assert quotas == []  # and its budget: the second tenant is unmetered
    await host.destroy_sandbox(second["id"])


async def test_a_network_that_carried_a_packet_is_destroyed_not_recycled(
    bare_agent: AgentProcess, boxes: Sandboxes
) -> None:
    host: HostAgentClient = boxes.host
    talker = await boxes.create(name="talker")
    gateway = str(ipaddress.ip_network(bare_agent.subnet).network_address + 1)
    # One UDP datagram to the host (refused there; it left the sandbox all the same).
    sent = await sh(host, talker["id"], f"echo hello > /dev/udp/{gateway}/9; echo sent")
    assert sent["stdout"] == "sent\n"
    talker_slot = slot_of(bare_agent, talker["id"])
    await host.destroy_sandbox(talker["id"])
    assert not Path(f"/run/netns/pdk-{talker_slot}").exists()
    assert not (bare_agent.state_dir / "slots" / talker_slot).exists()

    after = await boxes.create(name="after")
    assert slot_of(bare_agent, after["id"]) != talker_slot
    await host.destroy_sandbox(after["id"])


def test_nothing_is_left_of_recycled_networks_once_the_agent_stops(
    debian_image: Path, guest_binary_dir: Path
) -> None:
    """The kept networks are the pool's: a stopping agent destroys them (``teardown_agent`` checks
    that no slot, netns, address or mount is left)."""
    agent = AgentProcess(
        state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"), guest_dir=guest_binary_dir, pool_size=0
    )
    agent.start()
    try:
        headers = {"Authorization": "Bearer " + agent.env()["PADDOCK_HOST_TOKEN"]}
        body: dict[str, Any] = {
            "id": f"sb-{secrets.token_hex(5)}",
            "name": "kept",
            "rootfs": "debian:13",
            "vcpu": 1,
            "mem_mib": 256,
            "disk_mib": 2048,
        }
        assert httpx.post(
            f"{agent.url}/internal/v1/sandboxes", json=body, headers=headers, timeout=60
        ).is_success
        slot = slot_of(agent, body["id"])
        assert httpx.delete(
            f"{agent.url}/internal/v1/sandboxes/{body['id']}", headers=headers, timeout=60
        ).is_success
        assert Path(f"/run/netns/pdk-{slot}").exists()  # kept for the next slot
        agent.stop()
        assert not Path(f"/run/netns/pdk-{slot}").exists()
    finally:
        teardown_agent(agent)
