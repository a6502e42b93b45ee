"""A host restarted on another tier: the agent starts, and a sandbox the new tier's driver cannot run is
stopped by its own driver, reported ``error`` with the reason, refused with a 409 naming it, and
destroyed cleanly.

Before, a host agent restarted with ``PADDOCK_HOST_RUNTIME=qemu`` over a container sandbox's record
crashed at start (``KeyError: 'dir'`` in the QEMU driver's handle), and ``paddock serve`` exited with it.
The first test boots no VM (the QEMU agent only starts); the second boots one, then restarts as crun.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import BadStateError
from paddock_hostagent.drivers.vm.vmimage import KERNEL_ROOT
from tests.hostagent.conftest import Sandboxes, debian_image, guest_binary_dir, make_agent

__all__ = ["debian_image", "guest_binary_dir", "make_agent"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.qemu,
    pytest.mark.skipif(not (KERNEL_ROOT / "boot").is_dir(), reason="no VM kernel: run scripts/setup-host.sh"),
]


def alive(pid: int) -> bool:
    """Running: a killed process its (re)parent has not reaped yet is a zombie, not alive."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_an_agent_restarted_on_the_vm_tier_reports_the_container_it_cannot_run(make_agent: Any) -> None:
    agent = make_agent(runtime="crun", pool_size=1, extra_env={"PADDOCK_HOST_VM_ACCEL": "tcg"})
    agent.start()
    async with agent.client() as host:
        sandbox = await Sandboxes(host, agent).create()
        sandbox_id = sandbox["id"]
        assert (await host.exec(sandbox_id, cmd="true", args=[], env={})).exit_code == 0
    init_pid = int(agent.record(sandbox_id)["driver_state"]["init_pid"])
    assert alive(init_pid)
    agent.stop()

    agent.runtime = "qemu"
    agent.start(timeout_s=300)  # the first start builds the VM tier's initramfs
    async with agent.client() as host:
        assert (await host.info()).runtime == "qemu"
        [view] = [view for view in await host.list_sandboxes() if view.id == sandbox_id]
        assert view.status == "error", view
        reason = view.status_reason or ""
        assert "container tier (crun)" in reason and "vm tier (qemu)" in reason and "stopped" in reason, (
            reason
        )
        assert (await host.get_sandbox(sandbox_id)).status == "error"
        assert not alive(init_pid), "the container tier's sandbox was left running, unmanaged"
        with pytest.raises(BadStateError) as refused:
            await host.exec(sandbox_id, cmd="true", args=[], env={})
        assert refused.value.status == 409 and "container tier (crun)" in str(refused.value)

        await host.destroy_sandbox(sandbox_id)
        assert sandbox_id not in {view.id for view in await host.list_sandboxes()}
    # The make_agent fixture's teardown asserts that no slot, loop device, mount, netns, cgroup or
    # address of the container tier (the sandbox's or the old warm pool's) is left behind.


async def test_an_agent_restarted_on_the_container_tier_reports_the_vm_it_cannot_run(make_agent: Any) -> None:
    agent = make_agent(runtime="qemu", pool_size=0, extra_env={"PADDOCK_HOST_VM_ACCEL": "tcg"})
    agent.start(timeout_s=300)
    async with agent.client() as host:
        sandbox = await Sandboxes(host, agent).create(mem_mib=256)  # one VM boot (TCG: ~10 s)
        sandbox_id = sandbox["id"]
    qemu_pid = int(agent.record(sandbox_id)["driver_state"]["pid"])
    assert alive(qemu_pid)
    agent.stop()

    agent.runtime = "crun"
    agent.start()
    async with agent.client() as host:
        [view] = [view for view in await host.list_sandboxes() if view.id == sandbox_id]
        assert view.status == "error", view
        reason = view.status_reason or ""
        assert "vm tier (qemu)" in reason and "container tier (crun)" in reason, reason
        assert not alive(qemu_pid), "the VM was left running, unmanaged"
        with pytest.raises(BadStateError):
            await host.pause_sandbox(sandbox_id)
        await host.destroy_sandbox(sandbox_id)
        assert sandbox_id not in {view.id for view in await host.list_sandboxes()}
    assert not list((agent.state_dir / "vm" / "slots").glob("*")), "the VM's files were left behind"
