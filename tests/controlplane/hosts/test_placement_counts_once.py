"""A create's placement reads the sandboxes held on its host once (issue #36): the count it decides by
is taken under the placement lock, so it stands, where it was taken twice (before choosing, and
again once the host's row was locked). That count is the part of a create that grows with the host's
sandboxes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import scheduler
from paddock_controlplane.records.models import Sandbox
from paddock_core.db import transaction
from tests.controlplane.conftest import Clocked, user_client
from tests.controlplane.fakehost import HOST_BEAT
from tests.controlplane.hosts import rows as rows_of

pytestmark = pytest.mark.db

LIVE = 1000
EACH_MIB = 64  # 1,000 × 64 MiB placed of the fake host's 65,536: room for one 1 GiB sandbox


async def test_a_create_beside_1000_sandboxes_counts_their_memory_once(
    clocked: Clocked, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, _ = await clocked.cp.new_user("enterprise", credits=1000)
    placed_at = clocked.clock() - dt.timedelta(minutes=1)  # before the host's report
    rows = [
        rows_of.running_sandbox(f"sb-dense{n:05d}", owner, HOST_BEAT["id"], placed_at, mem_mib=EACH_MIB)
        for n in range(LIVE)
    ]
    async with transaction(clocked.services.sessions) as session:
        await session.execute(insert(Sandbox), rows)
    counted: list[list[str]] = []
    real = scheduler.held_by_host

    async def held_by_host(session: AsyncSession, host_ids: Collection[str]) -> dict[str, scheduler.Held]:
        counted.append(list(host_ids))
        return await real(session, host_ids)

    monkeypatch.setattr(scheduler, "held_by_host", held_by_host)
    _, api = await user_client(clocked)
    async with api:
        made = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert made.status_code == 200, made.text
        assert counted == [[HOST_BEAT["id"]]], "the host's sandboxes are read once per placement"
        # The one count saw all 1,000 and the new one: 512 MiB are left, and 1 GiB is refused.
        counted.clear()
        refused = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert refused.status_code == 503, refused.text
    assert "no host with capacity: no host has 1024 MiB free (largest: 512 MiB)" in refused.json()["message"]
