"""The control plane's link to a host that re-registers at another address."""

from __future__ import annotations

import asyncio

import pytest

from paddock_controlplane.hosts import hostlink
from paddock_hostagent.client import HostAgentClient
from tests.controlplane.conftest import Clocked

pytestmark = pytest.mark.db


async def test_a_host_that_moves_gets_a_new_link_and_the_old_one_is_closed(clocked: Clocked) -> None:
    services = clocked.services
    old = HostAgentClient("http://127.0.0.1:9", "token")
    services.hostlinks["host-moving"] = hostlink.HostLink("http://127.0.0.1:9", old)

    hostlink.forget_if_moved(services, "host-moving", "http://127.0.0.1:9")  # same address: kept
    assert services.hostlinks["host-moving"].client is old

    before = set(services.tasks.running)
    hostlink.forget_if_moved(services, "host-moving", "http://127.0.0.1:10")
    assert "host-moving" not in services.hostlinks  # the next call builds one for the new address
    await asyncio.gather(*(set(services.tasks.running) - before))
    # Its HTTP sessions (and its kept channel) are closed, not left open until the far end gives up.
    assert old._http.is_closed
