"""End to end on a real control plane: an action recorded in a transaction reaches a real receiver.

Private targets are allowed here (as a self-hoster on one machine would set it), so the control
plane's own worker delivers to the receiver on 127.0.0.1.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from paddock_controlplane.resources import webhooks
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.crypto import SecretBox
from paddock_core.db import make_engine, make_sessionmaker, transaction
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, fake_hosts
from tests.controlplane.fakehost import HOST_BEAT
from tests.controlplane.webhook_support import SECRET_KEY, Receiver, running_receiver, verify

pytestmark = pytest.mark.db


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    return cp_settings.model_copy(
        update={"webhook_allow_private_targets": True, "webhook_poll_interval_s": 0.2}
    )


async def emit(controlplane: ControlPlane, user_id: str, action: str, data: dict[str, object]) -> None:
    """What the lifecycle code does: record the action inside its own transaction."""
    engine = make_engine(controlplane.settings.database_url)
    try:
        async with transaction(make_sessionmaker(engine)) as session:
            await webhooks.emit(session, user_id=user_id, action=action, data=data)
    finally:
        await engine.dispose()


async def until(receiver: Receiver, count: int) -> None:
    async with asyncio.timeout(15):
        while len(receiver.received) < count:
            receiver.arrived.clear()
            await receiver.arrived.wait()


async def test_an_emitted_action_is_delivered_signed_and_shown_on_the_endpoint(
    controlplane: ControlPlane,
) -> None:
    user_id, key = await controlplane.new_user()
    headers = {"X-Api-Key": key}
    async with running_receiver() as receiver:
        created = await controlplane.http.post(
            "/v1/webhook-endpoints", json={"url": receiver.url + "/hook"}, headers=headers
        )
        assert created.status_code == 200, created.text
        endpoint = created.json()["data"]
        data = {
            "sandbox_id": "sb-1",
            "user_id": user_id,
            "shape": "s-1vcpu-1gb",
            "disk_mib": 10240,
            "region": "eu",
        }
        await emit(controlplane, user_id, "sandbox.create", data)
        await until(receiver, 1)
        [got] = receiver.received
        assert verify(endpoint["secret"], got, tolerance_s=300)
        assert got.json["event"] == "sandbox.create" and got.json["data"] == data

        async with asyncio.timeout(10):
            while True:
                shown = await controlplane.http.get(
                    f"/v1/webhook-endpoints/{endpoint['id']}", headers=headers
                )
                [delivery] = shown.json()["data"]["deliveries"]
                if delivery["status"] == "delivered":
                    break
                await asyncio.sleep(0.05)
        assert delivery["eventAction"] == "sandbox.create"
        assert delivery["attempts"] == 1 and delivery["deliveredAt"] is not None
        assert delivery["payload"] == got.json


async def test_the_database_alone_does_not_reveal_the_signing_secret(controlplane: ControlPlane) -> None:
    _, key = await controlplane.new_user()
    async with running_receiver() as receiver:
        created = await controlplane.http.post(
            "/v1/webhook-endpoints", json={"url": receiver.url + "/hook"}, headers={"X-Api-Key": key}
        )
    secret = created.json()["data"]["secret"]
    engine = make_engine(controlplane.settings.database_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT * FROM webhook_endpoints"))).all()
    finally:
        await engine.dispose()
    dump = repr(rows)
    assert secret not in dump and secret.removeprefix("whsec_") not in dump
    [row] = rows
    assert SecretBox(SECRET_KEY).open(row.secret_sealed) == secret


async def test_delete_removes_the_endpoints_deliveries_at_once(controlplane: ControlPlane) -> None:
    user_id, key = await controlplane.new_user()
    headers = {"X-Api-Key": key}

    release = asyncio.Event()

    async def stall(_: object) -> int:
        await release.wait()
        return 200

    async with running_receiver(stall) as receiver:
        endpoint_id = (
            await controlplane.http.post(
                "/v1/webhook-endpoints", json={"url": receiver.url + "/hook"}, headers=headers
            )
        ).json()["data"]["id"]
        await controlplane.http.post(f"/v1/webhook-endpoints/{endpoint_id}/suspend", headers=headers)
        for n in range(3):
            await emit(controlplane, user_id, "network.create", {"network_id": f"net_{n}"})
        await controlplane.http.post(f"/v1/webhook-endpoints/{endpoint_id}/resume", headers=headers)
        shown = await controlplane.http.get(f"/v1/webhook-endpoints/{endpoint_id}", headers=headers)
        assert shown.json()["data"]["deliveries"] == []  # suspended endpoints get no new deliveries

        for n in range(3):
            await emit(controlplane, user_id, "network.create", {"network_id": f"net_{n}"})
        shown = await controlplane.http.get(f"/v1/webhook-endpoints/{endpoint_id}", headers=headers)
        assert len(shown.json()["data"]["deliveries"]) == 3
        deleted = await controlplane.http.delete(f"/v1/webhook-endpoints/{endpoint_id}", headers=headers)
        assert deleted.status_code == 200
        engine = make_engine(controlplane.settings.database_url)
        try:
            async with engine.connect() as conn:
                left = (await conn.execute(text("SELECT count(*) FROM webhook_deliveries"))).scalar_one()
        finally:
            await engine.dispose()
        assert left == 0
        release.set()


async def test_sandbox_lifecycle_through_the_api_announces_each_action(
    controlplane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hosts(monkeypatch)
    beat = await controlplane.http.post(
        "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
    )
    assert beat.status_code == 200
    user_id, key = await controlplane.new_user()
    headers = {"X-Api-Key": key}
    async with running_receiver() as receiver:
        created = await controlplane.http.post(
            "/v1/webhook-endpoints", json={"url": receiver.url + "/hook"}, headers=headers
        )
        secret = created.json()["data"]["secret"]
        refused = await controlplane.http.post("/v1/sandboxes", json={"shape": "s-64vcpu"}, headers=headers)
        assert refused.status_code == 400  # a failed call announces nothing
        sandbox = await controlplane.http.post(
            "/v1/sandboxes", json={"shape": "s-1vcpu-1gb"}, headers=headers
        )
        assert sandbox.status_code == 200, sandbox.text
        sandbox_id = sandbox.json()["data"]["id"]
        for step in ("pause", "resume"):
            response = await controlplane.http.post(f"/v1/sandboxes/{sandbox_id}/{step}", headers=headers)
            assert response.status_code == 200, response.text
        await until(receiver, 3)

    assert [r.json["event"] for r in receiver.received] == [
        "sandbox.create",
        "sandbox.pause",
        "sandbox.resume",
    ]
    assert all(verify(secret, r, tolerance_s=300) for r in receiver.received)
    data = receiver.received[0].json["data"]
    assert {k: data[k] for k in ("shape", "disk_mib", "region")} == {
        "shape": "s-1vcpu-1gb",
        "disk_mib": 10240,
        "region": "eu",
    }
    assert data["sandbox_id"] == sandbox_id and data["user_id"] == user_id
