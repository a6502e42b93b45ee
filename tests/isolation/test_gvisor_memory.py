"""Memory admission on the gVisor tier: a sandbox its memory limit stopped holds no memory any more.

On gVisor the application's memory is the sentry's, so the cgroup's OOM kill takes the whole sandbox
(docs/isolation.md). Its record stays until the user destroys it, and the host agent went on counting
its limit as promised: the free memory it reported to the scheduler and its own admission shrank with
every such sandbox, so a client whose sandboxes hit their limits got 503 "no host has 4096 MiB free"
on a host that was in fact empty (on crun the hog dies and the sandbox, still holding its limit, lives
on). Measured first (``bench``-style, 3 idle ``s-2vcpu-4gb`` sandboxes): gVisor and crun admission
are the same, 4096 MiB of ``free_mib`` each and ~26 vs ~28 MiB of MemAvailable each.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any

import pytest

from paddock_hostagent.client import HostAgentError
from tests.hostagent.conftest import Sandboxes, debian_image, guest_binary_dir, make_agent

__all__ = ["debian_image", "guest_binary_dir", "make_agent"]

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc is not installed"),
]

BUDGET_MIB = 1024


async def test_a_sandbox_its_memory_limit_stopped_gives_its_memory_back(make_agent: Any) -> None:
    agent = make_agent(runtime="runsc", pool_size=0, extra_env={"PADDOCK_HOST_TOTAL_MIB": str(BUDGET_MIB)})
    agent.start()
    async with agent.client() as host:
        sandboxes = Sandboxes(host, agent)
        hog = await sandboxes.create(mem_mib=256)
        assert (await host.info()).free_mib == BUDGET_MIB - 256
        script = "x=$(head -c 400000000 /dev/zero | tr '\\0' x); echo survived ${#x}"
        try:
            result = await host.exec(hog["id"], cmd="bash", args=["-c", script], env={})
            assert "survived" not in result.stdout, result
        except HostAgentError:
            pass  # the sandbox went with the hog, mid-command
        deadline = time.monotonic() + 30
        while (view := await host.get_sandbox(hog["id"])).status != "stopped" and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert view.status == "stopped" and view.oom_kills >= 1, view

        assert (await host.info()).free_mib == BUDGET_MIB, "a stopped sandbox still counts as promised"
        whole = await sandboxes.create(mem_mib=BUDGET_MIB)  # admitted: the stopped one holds nothing
        assert whole["status"] == "running"
        await host.destroy_sandbox(hog["id"])
        assert (await host.info()).free_mib == 0
