"""A fork's path to ``running`` (§11.9): what the control plane does before and after the host's fork,
and in what order, since the host's fork is what a client waiting for ``running`` waits on."""

from __future__ import annotations

from paddock_controlplane import lifecycle
from paddock_controlplane.schemas import ForkSandboxRequest
from tests.controlplane.conftest import Clocked, user_client


async def test_a_fork_has_asked_its_host_by_the_time_it_answers_forking(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    async with http:
        source = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]
        clocked.host.boot_delay_s = 0.2  # the host's fork is still under way when the answer is made
        clocked.host.calls.clear()

        child = await lifecycle.fork(clocked.services, user_id, source, ForkSandboxRequest())

        # The answer is still ``forking`` (the contract's answer), but the host was asked before it was
        # made, not after it was rendered and sent.
        assert child.status == "forking"
        assert clocked.host.calls == [("fork", child.id)]
        view = await clocked.status(http, child.id, "running")
        assert view["forked_from"] == source
