"""What the scheduler counts as placed on a host: a hibernated sandbox holds only its disk there (issue
#34), so the memory it had is free for the next create; a frozen pause still holds its memory."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import update

from paddock_controlplane.hosts import scheduler
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.states import SandboxStatus
from paddock_core.db import make_engine, make_sessionmaker, transaction
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import fake_host

__all__ = ["fake_host"]

pytestmark = pytest.mark.db


async def test_a_hibernated_sandbox_holds_no_memory_on_its_host(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user("pro")
    async with httpx.AsyncClient(base_url=controlplane.url, headers={"X-API-Key": key}, timeout=30) as api:
        made = [
            (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
            for _ in range(3)
        ]
    frozen, hibernated = made[1], made[2]
    engine = make_engine(controlplane.settings.database_url)
    try:
        sessions = make_sessionmaker(engine)
        async with transaction(sessions) as session:
            await session.execute(
                update(Sandbox).where(Sandbox.id == frozen).values(status=SandboxStatus.PAUSED)
            )
            await session.execute(
                update(Sandbox)
                .where(Sandbox.id == hibernated)
                .values(status=SandboxStatus.PAUSED, hibernated=True)
            )
        async with sessions() as session:
            held = await scheduler.held_by_host(session, [str(HOST_BEAT["id"])])
    finally:
        await engine.dispose()
    # The running one and the frozen one hold their 1 GiB each; the hibernated one nothing.
    assert held[str(HOST_BEAT["id"])].placed_mib == 2 * 1024
