"""What a hibernated sandbox costs its host at rest (issue #34: "10,000 hibernated sandboxes on one host,
costing only their disk"), on a real control plane, host agent (crun, else runc) and sandboxes.

Nothing of its running slot stays: no slot directory, network namespace, disk mount, loop device,
cgroup, process or address. An agent restart brings none of it back and does not write its record again
(with thousands hibernated, rewriting every record at each stop and start was most of a restart).
``bench/hibernate_scale.py`` measures the same with thousands of them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.hibernation.test_hibernation_live import Account, agent_get, start_ticks
from tests.hostagent.conftest import cgroup_dirs
from tests.live import LivePlatform
from tests.volumes.test_volumes_live import wait_host

pytestmark = [pytest.mark.root]


def slot_parts(state_dir: Path, sandbox_id: str) -> dict[str, Any]:
    """What a running sandbox holds on its host, from its agent's record."""
    record = json.loads((state_dir / "sandboxes" / f"{sandbox_id}.json").read_text())
    state = record["driver_state"]
    slot = state["slot"]
    return {
        "slot": slot["id"],
        "slot_dir": slot["dir"],
        "disk_image": slot["disk_image"],
        "disk_mount": slot["disk_mount"],
        "ip": slot["ip"],
        "cgroups_path": state["cgroups_path"],
        "init_pid": state["init_pid"],
        "init_ticks": state["init_ticks"],
    }


def held_of_slots(state_dir: Path, parts: dict[str, dict[str, Any]]) -> list[str]:
    """Whatever of their running slots these sandboxes still hold on the host (``slot_parts``)."""
    with open("/proc/self/mountinfo") as mountinfo:
        mounts = {line.split()[4] for line in mountinfo}
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    netns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    addresses_path = state_dir / "network" / "addresses.json"
    addresses = json.loads(addresses_path.read_text() or "{}") if addresses_path.exists() else {}
    held: list[str] = []
    for sandbox_id, part in parts.items():
        if os.path.exists(part["slot_dir"]):
            held.append(f"{sandbox_id}: slot directory {part['slot_dir']}")
        if f"pdk-{part['slot']}" in netns:
            held.append(f"{sandbox_id}: netns pdk-{part['slot']}")
        if part["disk_mount"] in mounts:
            held.append(f"{sandbox_id}: mount {part['disk_mount']}")
        if os.path.exists(part["disk_image"]) or part["disk_image"] in loops:
            held.append(f"{sandbox_id}: disk image or its loop device {part['disk_image']}")
        held += [f"{sandbox_id}: cgroup {path}" for path in cgroup_dirs(part["cgroups_path"])]
        if start_ticks(part["init_pid"]) == part["init_ticks"]:
            held.append(f"{sandbox_id}: init process {part['init_pid']}")
        if part["ip"] and addresses.get(part["ip"]) in (part["slot"], sandbox_id):
            held.append(f"{sandbox_id}: address {part['ip']}")
    return held


def test_a_hibernated_sandbox_holds_nothing_of_its_slot_and_a_restart_leaves_it_so(
    platform: LivePlatform, account: Account
) -> None:
    agent = platform.agents[0]
    ids = [account.sandbox() for _ in range(2)]
    for sandbox_id in ids:
        account.out(sandbox_id, f"echo {sandbox_id} > /root/id")
    parts = {sandbox_id: slot_parts(agent.state_dir, sandbox_id) for sandbox_id in ids}
    for sandbox_id in ids:
        assert account.hibernate(sandbox_id)["hibernated"] is True
    assert held_of_slots(agent.state_dir, parts) == []
    records = {sandbox_id: agent.state_dir / "sandboxes" / f"{sandbox_id}.json" for sandbox_id in ids}
    written = {
        sandbox_id: (path.stat().st_ino, path.stat().st_mtime_ns) for sandbox_id, path in records.items()
    }

    agent.stop()  # SIGTERM: the agent saves what changed on its way out
    agent.start()

    # The restart wrote neither record again, brought nothing of their slots back, and holds them.
    assert {s: (p.stat().st_ino, p.stat().st_mtime_ns) for s, p in records.items()} == written
    assert held_of_slots(agent.state_dir, parts) == []
    for sandbox_id in ids:
        assert agent_get(platform, f"sandboxes/{sandbox_id}")["hibernated"] is True
    wait_host(platform, account)
    woken = account.resume(ids[0])
    assert woken.status_code == 200, woken.text
    assert account.out(ids[0], "cat /root/id").strip() == ids[0]
    assert account.get(ids[1])["hibernated"] is True
