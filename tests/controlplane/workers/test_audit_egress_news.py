"""The audit writer asks a host for its egress attempts only when the host's heartbeat says it has some
the writer has not recorded (issue #36: asking every host every 2 s, from every control plane, was a
cost per host the control planes paid beside every request); every attempt still reaches the trail.
An agent that does not say is asked on every poll, as before.

The hosts' answers are the unit seam (tests/network/test_audit_live.py follows a real sandbox's
attempts to its trail).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.services import Services
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_controlplane.workers.audit_writer import AuditWriter
from paddock_hostagent.schemas import EgressAttempt, EgressAttempts
from tests.conftest import LiveServer
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, fake_hosts
from tests.controlplane.fakehost import HOST_BEAT

pytestmark = pytest.mark.db


class Agent:
    """One host's record of attempts, answered as ``GET /internal/v1/egress/attempts`` does."""

    def __init__(self, host_id: str, epoch: str) -> None:
        self.host_id, self.epoch = host_id, epoch
        self.attempts: list[EgressAttempt] = []
        self.asked = 0

    def attempt(self, sandbox_id: str, port: int) -> None:
        self.attempts.append(
            EgressAttempt(
                seq=len(self.attempts) + 1,
                sandbox_id=sandbox_id,
                at=time.time(),
                verdict="refused",
                address="198.18.0.9",
                protocol="tcp",
                port=port,
                packets=1,
            )
        )

    async def egress_attempts(self, epoch: str, after: int, limit: int = 1000) -> EgressAttempts:
        self.asked += 1
        start = after if epoch == self.epoch else 0
        out = self.attempts[start : start + limit]
        last = out[-1].seq if out else after
        return EgressAttempts(epoch=self.epoch, next=last, lost=0, attempts=out)

    def position(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seq": len(self.attempts)}


@dataclass
class Fleet:
    http: httpx.AsyncClient
    services: Services
    agents: dict[str, Agent]

    async def beat(self, host_id: str, *, say: bool = True) -> None:
        # No room: the sandboxes go to the fake host, these only report attempts.
        body: dict[str, Any] = {
            **HOST_BEAT,
            "id": host_id,
            "url": f"http://127.0.0.1:9/{host_id}",
            "free_mib": 0,
        }
        if say:
            body["egress_audit"] = self.agents[host_id].position()
        answer = await self.http.post(
            "/internal/v1/hosts/heartbeat", json=body, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
        )
        assert answer.status_code == 200, answer.text

    def asked(self) -> dict[str, int]:
        counts = {host_id: agent.asked for host_id, agent in self.agents.items()}
        for agent in self.agents.values():
            agent.asked = 0
        return {host_id: n for host_id, n in counts.items() if n}

    async def trail_ports(self, sandbox_id: str) -> list[int]:
        answer = await self.http.get(f"/v1/sandboxes/{sandbox_id}/audit", params={"kind": "egress"})
        assert answer.status_code == 200, answer.text
        return sorted(int(event["port"]) for event in answer.json()["data"]["items"])


@pytest.fixture
async def fleet(
    cp_settings: ControlPlaneSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Fleet]:
    # The app's own writer polls once an hour: the test drives a writer of its own.
    settings = cp_settings.model_copy(update={"audit_egress_poll_s": 3600.0})
    await migrate(settings)
    link = fake_hosts(monkeypatch)
    agents = {host_id: Agent(host_id, f"run-{host_id}") for host_id in ("quiet", "busy", "older")}

    async def for_host(services: object, host_id: str | None) -> object:
        if host_id in agents:
            return SimpleNamespace(client=agents[host_id])
        return link  # the host the sandboxes run on

    app = create_app(settings)
    async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        beat = await http.post(  # the sandboxes' host, which enforces no egress
            "/internal/v1/hosts/heartbeat",
            json={**HOST_BEAT, "egress_audit": {"epoch": "", "seq": 0}},
            headers={"Authorization": f"Bearer {HOST_TOKEN}"},
        )
        assert beat.status_code == 200, beat.text
        _, key = await ControlPlane(url=server.url, settings=settings, http=http).new_user("pro")
        http.headers["X-Api-Key"] = key
        monkeypatch.setattr(hostlink, "for_host", for_host)
        yield Fleet(http, app.state.services, agents)


async def test_only_hosts_with_attempts_not_yet_recorded_are_asked(fleet: Fleet) -> None:
    created = await fleet.http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert created.status_code == 200, created.text
    sid = str(created.json()["data"]["id"])
    writer = AuditWriter(fleet.services)
    busy, older = fleet.agents["busy"], fleet.agents["older"]
    busy.attempt(sid, 81)
    busy.attempt(sid, 82)
    older.attempt(sid, 91)
    await fleet.beat("quiet")
    await fleet.beat("busy")
    await fleet.beat("older", say=False)  # an agent from before the heartbeat said it

    await writer.poll_hosts()
    assert fleet.asked() == {"busy": 1, "older": 1}, "a host with nothing new is not asked"
    assert await fleet.trail_ports(sid) == [81, 82, 91]

    await writer.poll_hosts()
    assert fleet.asked() == {"older": 1}, "what was recorded is not asked for again"

    busy.attempt(sid, 83)
    await writer.poll_hosts()
    assert fleet.asked() == {"older": 1}, "until its next heartbeat says so, the host is not asked"
    await fleet.beat("busy")
    await fleet.beat("quiet")
    await writer.poll_hosts()
    assert fleet.asked() == {"busy": 1, "older": 1}
    assert await fleet.trail_ports(sid) == [81, 82, 83, 91]


async def test_what_another_control_plane_recorded_is_asked_for_once_and_not_written_twice(
    fleet: Fleet,
) -> None:
    """Two writers (two control planes' views of the same hosts): each records from the shared cursor,
    so an attempt is written once; a writer that finds the cursor already past the host's report stops
    asking."""
    created = await fleet.http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    sid = str(created.json()["data"]["id"])
    first, second = AuditWriter(fleet.services), AuditWriter(fleet.services)
    busy = fleet.agents["busy"]
    busy.attempt(sid, 81)
    await fleet.beat("busy")
    await first.poll_hosts()
    await second.poll_hosts()
    assert fleet.asked() == {"busy": 2}
    await first.poll_hosts()
    await second.poll_hosts()
    assert fleet.asked() == {}, "both found the cursor where the host's report says"
    assert await fleet.trail_ports(sid) == [81]
