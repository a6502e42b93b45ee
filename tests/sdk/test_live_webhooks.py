"""Webhook endpoints through the SDK, and ``paddock.webhooks.verify`` on real deliveries from the real
control plane (its own delivery worker POSTing to a receiver on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import paddock
from paddock.webhooks import verify
from tests.controlplane.webhook_support import Receiver, running_receiver
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


async def until(receiver: Receiver, count: int, timeout_s: float = 20) -> None:
    async with asyncio.timeout(timeout_s):
        while len(receiver.received) < count:
            receiver.arrived.clear()
            await receiver.arrived.wait()


async def test_a_real_delivery_verifies_and_tampering_does_not(live: LivePlatform) -> None:
    async with running_receiver() as receiver, paddock.AsyncClient(live.url, live.api_key()) as client:
        actions = await client.webhooks.actions()
        assert actions[:2] == ["sandbox.create", "sandbox.destroy"] and "network.attach" in actions
        endpoint = await client.webhooks.create(receiver.url + "/hook", events=["sandbox.create"])
        assert endpoint.secret and endpoint.secret.startswith("whsec_") and endpoint.active
        assert endpoint.events == ["sandbox.create"] and endpoint.failure_count == 0

        sb = await client.sandboxes.create("s-1vcpu-256mb", disk_mib=2048)
        await sb.destroy()
        await until(receiver, 1)
        delivery = receiver.received[0]

        event = verify(delivery.body, delivery.headers, endpoint.secret)
        assert event["event"] == "sandbox.create" and event["data"]["sandbox_id"] == sb.id
        assert event == json.loads(delivery.body)
        # header names in any case, as frameworks hand them over
        upper = {k.upper(): v for k, v in delivery.headers.items()}
        assert verify(delivery.body, upper, endpoint.secret)["event"] == "sandbox.create"

        with pytest.raises(paddock.WebhookVerificationError, match="does not match"):
            verify(delivery.body, delivery.headers, "whsec_" + "0" * 64)
        with pytest.raises(paddock.WebhookVerificationError, match="does not match"):
            verify(delivery.body.replace(sb.id.encode(), b"sb-forged"), delivery.headers, endpoint.secret)
        reserialised = json.dumps(json.loads(delivery.body), indent=1).encode()
        with pytest.raises(paddock.WebhookVerificationError):
            verify(reserialised, delivery.headers, endpoint.secret)
        sent_at = int(delivery.headers["x-webhook-timestamp"])
        with pytest.raises(paddock.WebhookVerificationError, match="tolerance"):
            verify(delivery.body, delivery.headers, endpoint.secret, now=sent_at + 301)
        with pytest.raises(paddock.WebhookVerificationError, match="tolerance"):
            verify(delivery.body, delivery.headers, endpoint.secret, now=sent_at - 301)
        assert verify(delivery.body, delivery.headers, endpoint.secret, tolerance_s=600, now=sent_at + 599)
        with pytest.raises(paddock.WebhookVerificationError, match="missing"):
            verify(delivery.body, {"x-webhook-timestamp": str(int(time.time()))}, endpoint.secret)

        # the endpoint's own view: the delivery recorded (once the worker has written the outcome)
        async with asyncio.timeout(10):
            while (detail := await client.webhooks.get(endpoint.id)).deliveries[0].status == "pending":
                await asyncio.sleep(0.1)
        assert detail.secret is None and [d.event_action for d in detail.deliveries] == ["sandbox.create"]
        assert detail.deliveries[0].status == "delivered" and detail.deliveries[0].attempts == 1
        assert detail.deliveries[0].delivered_at
        assert [e.id for e in await client.webhooks.list()] == [endpoint.id]
        assert (await client.webhooks.suspend(endpoint.id)).active is False
        assert (await client.webhooks.resume(endpoint.id)).active is True
        await client.webhooks.delete(endpoint.id)
        with pytest.raises(paddock.NotFoundError):
            await client.webhooks.get(endpoint.id)
        with pytest.raises(paddock.ValidationError) as bad:
            await client.webhooks.create("ftp://example.com/hook")
        assert "url" in bad.value.fields
