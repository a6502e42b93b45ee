"""A host agent whose state dir is deeper than a unix socket's address (107 bytes) still boots
sandboxes: their guest sockets are bound and connected through a descriptor of their directory."""

from __future__ import annotations

from typing import Any

import pytest

from paddock_hostagent.schemas import ForkBody
from tests.hostagent.conftest import AgentProcess, Sandboxes, run

pytestmark = pytest.mark.root


async def test_sandboxes_boot_and_answer_under_a_deep_state_dir(make_agent: Any) -> None:
    agent: AgentProcess = make_agent(state_subdir="a-state-dir-" + "d" * 40 + "/" + "e" * 60, pool_size=1)
    assert len(str(agent.state_dir)) > 107
    agent.start()
    async with agent.client() as host:
        tracker = Sandboxes(host, agent)
        try:
            created = await tracker.create(name="deep")
            assert (await run(host, created["id"], "hostname"))["stdout"] == "deep\n"
            forked_id = created["id"] + "-f"
            tracker.track(forked_id)
            await host.fork_sandbox(created["id"], ForkBody(new_id=forked_id, name="deeper"))
            assert (await run(host, forked_id, "hostname"))["stdout"] == "deeper\n"
        finally:
            await tracker.destroy_all()
