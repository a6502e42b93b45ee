"""Capacity (issue #12): a host without room never turns into a 500 or a ``failed`` row.

The control plane runs for real on both engines; each "host" is a small HTTP server on 127.0.0.1
speaking the host agent's internal API, registered by heartbeat like a real agent, and answering
creates with 200 or with the agent's 507. So the whole path is real: placement, the agent client's
error mapping, the retry on another host, the 503 and what is (not) left in the database.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select

from paddock_controlplane.records.models import Sandbox, User, WebhookDelivery
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.db import make_engine, make_sessionmaker
from tests.conftest import LiveServer
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, controlplane
from tests.security import fakeagent_support
from tests.security.fakeagent_support import FakeAgent

__all__ = ["controlplane"]

pytestmark = pytest.mark.db

SHAPE = "s-1vcpu-256mb"  # 256 MiB


@pytest.fixture
def cp_settings(cp_database_url: str, tmp_path: Path) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        database_url=cp_database_url,
        data_dir=tmp_path / "cp",
        host_token=SecretStr(HOST_TOKEN),
        secret_key=SecretStr("test-secret-key-0123456789"),
        region="eu",
        reconcile_interval_s=0.2,
        # Deliveries are looked at in the outbox; nothing needs to be sent.
        webhook_allow_private_targets=True,
        webhook_worker_enabled=False,
    )


@dataclass
class Rig:
    cp: ControlPlane
    api: httpx.AsyncClient
    user_id: str
    agents: dict[str, FakeAgent]

    async def beat(self, agent: FakeAgent) -> None:
        resp = await self.cp.http.post(
            "/internal/v1/hosts/heartbeat",
            json=agent.beat(),
            headers={"Authorization": f"Bearer {HOST_TOKEN}"},
        )
        assert resp.status_code == 200, resp.text

    async def db(self, query: Any) -> Any:
        engine = make_engine(self.cp.settings.database_url)
        try:
            async with make_sessionmaker(engine)() as session:
                return await session.scalar(query)
        finally:
            await engine.dispose()

    async def rows(self) -> int:
        return int(await self.db(select(func.count()).select_from(Sandbox)))

    async def events(self, action: str) -> int:
        query = select(func.count()).where(WebhookDelivery.event_action == action)
        return int(await self.db(query.select_from(WebhookDelivery)))

    async def credits_micro(self) -> int:
        return int(await self.db(select(User.credits_micro).where(User.id == self.user_id)))


@contextlib.asynccontextmanager
async def rig(cp: ControlPlane, *agents: FakeAgent) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        for agent in agents:
            server = await stack.enter_async_context(LiveServer(agent.app()))
            agent.url = server.url
        user_id, key = await cp.new_user("pro")
        api = await stack.enter_async_context(
            httpx.AsyncClient(base_url=cp.url, headers={"X-Api-Key": key}, timeout=30)
        )
        out = Rig(cp=cp, api=api, user_id=user_id, agents={agent.id: agent for agent in agents})
        for agent in agents:
            await out.beat(agent)
        hook = await api.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"})
        assert hook.status_code == 200, hook.text
        yield out


def assert_no_capacity(resp: httpx.Response, *reason: str) -> None:
    assert resp.status_code == 503, resp.text
    body = resp.json()
    assert body["status"] == "error" and body["code"] == 503
    assert body["message"].startswith("no host with capacity"), body  # the contract's wording first
    for part in reason:
        assert part in body["message"], body
    assert 1 <= int(resp.headers["retry-after"]) <= 30


async def test_a_host_that_answers_507_sends_the_create_to_another_host(controlplane: ControlPlane) -> None:
    # The full host reports the most free memory, so it is tried first; the scheduler's view was stale.
    full = FakeAgent("host-a-full", free_mib=4096, refuse={"create"})
    roomy = FakeAgent("host-b", free_mib=2048)
    async with rig(controlplane, full, roomy) as r:
        resp = await r.api.post("/v1/sandboxes", json={"shape": SHAPE})
        assert resp.status_code == 200, resp.text
        sandbox = resp.json()["data"]
        assert sandbox["status"] == "running"
        assert full.created() == [sandbox["id"]] and roomy.created() == [sandbox["id"]]
        listed = (await r.api.get("/v1/sandboxes")).json()["data"]
        assert [row["id"] for row in listed["data"]] == [sandbox["id"]]
        assert await r.events("sandbox.create") == 1


async def test_no_host_with_room_is_503_naming_the_reason_and_leaves_nothing(
    controlplane: ControlPlane,
) -> None:
    full = FakeAgent("host-a-full", refuse={"create"})
    async with rig(controlplane, full) as r:
        credits_before = await r.credits_micro()
        for _ in range(3):  # what a retrying client does
            resp = await r.api.post("/v1/sandboxes", json={"shape": SHAPE})
            assert_no_capacity(resp, "host-a-full", "256 MiB requested, 41 MiB free")
        assert len(full.created()) == 3
        for status in (None, "failed"):
            params = {"status": status} if status else {}
            listed = (await r.api.get("/v1/sandboxes", params=params)).json()["data"]
            assert listed["pagination"]["total"] == 0 and listed["data"] == []
        assert await r.rows() == 0
        assert await r.events("sandbox.create") == 0
        assert await r.credits_micro() == credits_before
        # The host gets room again: the same request now works, and is the one sandbox and event.
        full.refuse.clear()
        ok = await r.api.post("/v1/sandboxes", json={"shape": SHAPE})
        assert ok.status_code == 200, ok.text
        assert await r.rows() == 1 and await r.events("sandbox.create") == 1


async def test_memory_the_host_reports_used_is_not_placed_again(controlplane: ControlPlane) -> None:
    # 300 MiB free of 4096: the rest is held by sandboxes this database does not know (another database
    # ran this host before). One 256 MiB sandbox fits; a second must not be sent to the host at all.
    agent = FakeAgent("host-a", total_mib=4096, free_mib=300)
    async with rig(controlplane, agent) as r:
        first = await r.api.post("/v1/sandboxes", json={"shape": SHAPE})
        assert first.status_code == 200, first.text
        second = await r.api.post("/v1/sandboxes", json={"shape": SHAPE})
        assert_no_capacity(second, "no host has 256 MiB free (largest: 44 MiB)")
        agent.free_mib = 44  # the next report includes the first sandbox
        await r.beat(agent)
        assert_no_capacity(await r.api.post("/v1/sandboxes", json={"shape": SHAPE}), "largest: 44 MiB")
        assert len(agent.created()) == 1 and await r.rows() == 1
        agent.free_mib = 300  # the unknown sandboxes went away
        await r.beat(agent)
        assert (await r.api.post("/v1/sandboxes", json={"shape": SHAPE})).status_code == 200


async def test_host_id_of_no_host_is_400_and_a_known_host_without_room_is_503(
    controlplane: ControlPlane,
) -> None:
    agent = FakeAgent("host-a", free_mib=100)
    async with rig(controlplane, agent) as r:
        unknown = await r.api.post("/v1/sandboxes", json={"shape": SHAPE, "host_id": "host-nope"})
        assert unknown.status_code == 400, unknown.text
        body = unknown.json()
        assert body["status"] == "fail" and body["data"]["code"] == "VALIDATION_FAILED"
        assert "host_id" in body["data"]
        pinned = await r.api.post("/v1/sandboxes", json={"shape": SHAPE, "host_id": "host-a"})
        assert_no_capacity(pinned, "host host-a has 100 MiB free, 256 MiB requested")
        selector = await r.api.post("/v1/sandboxes", json={"shape": SHAPE, "node_selector": {"zone": "b"}})
        assert_no_capacity(selector, 'no active host matches node_selector {"zone": "b"}')
        assert agent.calls == [] and await r.rows() == 0


async def test_fork_on_a_full_host_is_503_and_creates_no_child(controlplane: ControlPlane) -> None:
    agent = FakeAgent("host-a", total_mib=4096, free_mib=400)
    async with rig(controlplane, agent) as r:
        source = (await r.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]
        resp = await r.api.post(f"/v1/sandboxes/{source['id']}/fork", json={})
        assert_no_capacity(resp, "host host-a has 144 MiB free, 256 MiB requested")
        assert [call for call, _ in agent.calls] == ["create"]
        assert await r.rows() == 1 and await r.events("sandbox.fork") == 0


async def test_a_fork_the_host_refuses_is_503_and_creates_no_child(controlplane: ControlPlane) -> None:
    # The control plane saw room; the host's own check (its 507) says otherwise: answered as a create
    # is, 503 with Retry-After and the host's reason, and no child row or event (not a ``failed`` child).
    agent = FakeAgent("host-a", refuse={"fork"})
    async with rig(controlplane, agent) as r:
        source = (await r.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]
        resp = await r.api.post(f"/v1/sandboxes/{source['id']}/fork", json={})
        assert_no_capacity(resp, "host host-a", "256 MiB requested, 41 MiB free")
        assert [call for call, _ in agent.calls] == ["create", "fork"]
        assert await r.rows() == 1 and await r.events("sandbox.fork") == 0


async def test_resume_the_host_has_no_room_for_is_503_and_stays_paused(controlplane: ControlPlane) -> None:
    agent = FakeAgent("host-a")
    async with rig(controlplane, agent) as r:
        sid = (await r.api.post("/v1/sandboxes", json={"shape": SHAPE})).json()["data"]["id"]
        assert (await r.api.post(f"/v1/sandboxes/{sid}/pause")).json()["data"]["status"] == "paused"
        agent.refuse.add("resume")
        assert_no_capacity(await r.api.post(f"/v1/sandboxes/{sid}/resume"), "41 MiB free")
        assert (await r.api.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "paused"
        assert await r.events("sandbox.resume") == 0
        agent.refuse.clear()
        resumed = await r.api.post(f"/v1/sandboxes/{sid}/resume")
        assert resumed.status_code == 200 and resumed.json()["data"]["status"] == "running"
        assert await r.events("sandbox.resume") == 1


async def test_a_host_holding_its_disk_writers_refuses_with_503_naming_the_disk(
    controlplane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent's words when its disk store's low watermark holds sandboxes (capacity.DiskView).
    held = (
        "10240 MiB requested, 0 MiB free (disk: the host's disk store is low, 1800 MiB free; the writes "
        "of 2 sandboxes are held until it has 3072 MiB free)"
    )
    monkeypatch.setattr(fakeagent_support, "FULL", {"error": "insufficient_capacity", "message": held})
    agent = FakeAgent("host-a", refuse={"create"})
    async with rig(controlplane, agent) as r:
        resp = await r.api.post("/v1/sandboxes", json={"shape": SHAPE})
        assert_no_capacity(resp, "host-a", "disk store is low", "held until it has 3072 MiB free")
        assert await r.rows() == 0 and await r.events("sandbox.create") == 0
