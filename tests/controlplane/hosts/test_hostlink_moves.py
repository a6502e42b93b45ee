"""The control plane's link to a host that re-registers at another address."""

from __future__ import annotations

import asyncio

import pytest

from paddock_controlplane.hosts import hostlink
from paddock_hostagent.client import HostAgentClient
from tests.controlplane.conftest import Clocked

pytestmark = pytest.mark.db

#: The real one: the ``clocked`` fixture puts its fake host in place of ``hostlink.for_host``.
FOR_HOST = hostlink.for_host


async def test_a_host_that_moves_gets_a_new_link_and_the_old_one_is_closed(clocked: Clocked) -> None:
    services = clocked.services
    old = HostAgentClient("http://127.0.0.1:9", "token")
    services.hostlinks["host-moving"] = hostlink.HostLink("http://127.0.0.1:9", old, runtime="crun")

    hostlink.forget_if_changed(services, "host-moving", "http://127.0.0.1:9", "crun")  # the same: kept
    assert services.hostlinks["host-moving"].client is old

    before = set(services.tasks.running)
    hostlink.forget_if_changed(services, "host-moving", "http://127.0.0.1:10", "crun")
    assert "host-moving" not in services.hostlinks  # the next call builds one for the new address
    await asyncio.gather(*(set(services.tasks.running) - before))
    # Its HTTP sessions (and its kept channel) are closed, not left open until the far end gives up.
    assert old._http.is_closed


async def test_a_host_back_under_another_runtime_gets_a_new_link(clocked: Clocked) -> None:
    """Its boots' deadline follows its runtime (a VM host's is longer), which the link holds."""
    services = clocked.services
    old = HostAgentClient("http://127.0.0.1:9", "token")
    services.hostlinks["host-retiered"] = hostlink.HostLink("http://127.0.0.1:9", old, runtime="crun")
    before = set(services.tasks.running)
    hostlink.forget_if_changed(services, "host-retiered", "http://127.0.0.1:9", "qemu")
    assert "host-retiered" not in services.hostlinks
    await asyncio.gather(*(set(services.tasks.running) - before))
    assert old._http.is_closed


async def test_calls_that_find_no_link_at_once_share_the_one_made(clocked: Clocked) -> None:
    """A burst of creates to a host this process has no link to yet: each call reads the host's row,
    and before, each made a link of its own, the last one kept and the others never closed."""
    services = clocked.services
    services.hostlinks.pop("host-test-1", None)
    links = await asyncio.gather(*(FOR_HOST(services, "host-test-1") for _ in range(6)))
    try:
        assert len({id(link) for link in links}) == 1
        assert services.hostlinks["host-test-1"] is links[0]
    finally:
        await links[0].aclose()
        services.hostlinks.pop("host-test-1", None)
