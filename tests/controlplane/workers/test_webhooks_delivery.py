"""The delivery worker against a real receiver on 127.0.0.1, with a hand-moved clock (no sleeps)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from paddock_controlplane.resources import webhooks
from paddock_controlplane.workers.webhook_delivery import RETRY_DELAYS_S, DeliveryWorker, HttpTransport
from paddock_core.timeutil import utcnow
from tests.conftest import fresh_database
from tests.controlplane.webhook_support import (
    FakeClock,
    Received,
    WebhookDb,
    running_receiver,
    verify,
    webhook_db,
    worker_settings,
)

pytestmark = pytest.mark.db

CREATE_DATA = {
    "sandbox_id": "sb-x",
    "user_id": "usr_x",
    "shape": "s-1vcpu-1gb",
    "disk_mib": 10240,
    "region": "eu",
}


def make_worker(db: WebhookDb, clock: FakeClock, **overrides: object) -> DeliveryWorker:
    return DeliveryWorker(db.sessions, db.box, worker_settings(db.url, **overrides), clock=clock)


async def test_delivery_is_signed_over_the_raw_body_and_carries_the_contract_headers(
    cp_database_url: str,
) -> None:
    clock = FakeClock()
    async with webhook_db(cp_database_url) as db, running_receiver() as receiver:
        _, secret = await db.endpoint(receiver.url + "/hook")
        data = {**CREATE_DATA, "name": "café ☕"}  # non-ASCII: the signed bytes are the sent bytes
        await db.emit("sandbox.create", data, clock())
        worker = make_worker(db, clock)
        try:
            assert await worker.run_once() == 1
        finally:
            await worker.stop()
        [got] = receiver.received
        assert got.headers["content-type"] == "application/json"
        assert got.headers["user-agent"] == "Service-Webhook/1.0"
        assert got.headers["x-webhook-timestamp"] == str(int(clock().timestamp()))
        assert got.headers["x-webhook-signature"].startswith("sha256=")
        assert verify(secret, got)
        reserialised = Received(got.path, got.headers, json.dumps(json.loads(got.body)).encode(), got.at)
        assert not verify(secret, reserialised)
        assert not verify("whsec_" + "0" * 64, got)
        assert got.json == {"event": "sandbox.create", "occurredAt": "2026-01-01T00:00:00.000Z", "data": data}
        [row] = await db.deliveries()
        assert (row.status, row.attempts, row.delivered_at is not None) == ("delivered", 1, True)


async def test_the_documented_verification_snippet_accepts_a_real_delivery(cp_database_url: str) -> None:
    docs = (Path(__file__).resolve().parents[3] / "docs" / "webhooks.md").read_text()
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", docs, re.S) if "def verify_webhook" in b)
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    async with webhook_db(cp_database_url) as db, running_receiver() as receiver:
        _, secret = await db.endpoint(receiver.url + "/hook")
        await db.emit("sandbox.create", CREATE_DATA, utcnow())
        worker = make_worker(db, FakeClock(utcnow()))
        try:
            await worker.run_once()
        finally:
            await worker.stop()
    [got] = receiver.received
    assert namespace["verify_webhook"](secret, got.headers, got.body)
    assert not namespace["verify_webhook"](secret, got.headers, got.body + b" ")
    stale = {**got.headers, "x-webhook-timestamp": str(int(got.headers["x-webhook-timestamp"]) - 3600)}
    assert not namespace["verify_webhook"](secret, stale, got.body)


async def test_retries_follow_5s_30s_2min_10min_1h_then_the_delivery_fails(cp_database_url: str) -> None:
    clock = FakeClock()
    async with webhook_db(cp_database_url) as db, running_receiver(lambda _: 503) as receiver:
        endpoint_id, _ = await db.endpoint(receiver.url + "/down")
        await db.emit("sandbox.destroy", {"sandbox_id": "sb-1"}, clock())
        worker = make_worker(db, clock)
        try:
            assert await worker.run_once() == 1
            for delay_s in RETRY_DELAYS_S:
                clock.advance(delay_s - 1)
                assert await worker.run_once() == 0, f"retried before {delay_s} s had passed"
                clock.advance(1)
                assert await worker.run_once() == 1, f"no retry {delay_s} s after the failure"
            clock.advance(7 * 24 * 3600)
            assert await worker.run_once() == 0
        finally:
            await worker.stop()
        stamps = [int(r.headers["x-webhook-timestamp"]) for r in receiver.received]
        assert [b - a for a, b in itertools.pairwise(stamps)] == [5, 30, 120, 600, 3600]
        [row] = await db.deliveries()
        assert (row.status, row.attempts, row.delivered_at) == ("failed", 6, None)
        assert row.last_error == "HTTP 503"
        endpoint = await db.endpoint_row(endpoint_id)
        assert (endpoint.failure_count, endpoint.active) == (1, True)


async def test_a_retry_that_succeeds_ends_the_delivery(cp_database_url: str) -> None:
    clock = FakeClock()
    answers = iter([500, 404, 204])
    async with webhook_db(cp_database_url) as db, running_receiver(lambda _: next(answers)) as receiver:
        await db.endpoint(receiver.url + "/flaky")
        await db.emit("disk.create", {"disk_id": "disk_1"}, clock())
        worker = make_worker(db, clock)
        try:
            await worker.run_once()
            clock.advance(5)
            await worker.run_once()
            clock.advance(30)
            await worker.run_once()
            clock.advance(3600)
            assert await worker.run_once() == 0
        finally:
            await worker.stop()
        [row] = await db.deliveries()
        assert (row.status, row.attempts) == ("delivered", 3)
        assert len(receiver.received) == 3


async def test_timeouts_and_redirects_are_failed_attempts(cp_database_url: str) -> None:
    clock = FakeClock()

    async def respond(got: Received) -> object:
        if got.path == "/slow":
            await asyncio.sleep(2)
            return 200
        return 302, [(b"location", b"/elsewhere")]

    async with webhook_db(cp_database_url) as db, running_receiver(respond) as receiver:
        await db.endpoint(receiver.url + "/slow")
        await db.endpoint(receiver.url + "/moved")
        await db.emit("network.create", {"network_id": "net_1"}, clock())
        worker = DeliveryWorker(
            db.sessions,
            db.box,
            worker_settings(db.url),
            clock=clock,
            transport=HttpTransport(timeout_s=0.5, allow_private=True),
        )
        try:
            assert await worker.run_once() == 2
        finally:
            await worker.stop()
        errors = sorted(row.last_error or "" for row in await db.deliveries())
        assert errors == ["HTTP 302", "timed out after 0.5 s"]
        assert all(row.status == "pending" and row.attempts == 1 for row in await db.deliveries())
        assert "/elsewhere" not in [r.path for r in receiver.received]


async def test_endpoint_auto_suspends_at_50_failures_and_resume_resets_it(cp_database_url: str) -> None:
    clock = FakeClock()
    healthy = False
    async with (
        webhook_db(cp_database_url) as db,
        running_receiver(lambda _: 200 if healthy else 500) as receiver,
    ):
        endpoint_id, _ = await db.endpoint(receiver.url + "/hook")
        worker = make_worker(db, clock, webhook_concurrency=25)

        async def fail_everything_pending() -> None:
            await worker.drain()
            for delay_s in RETRY_DELAYS_S:
                clock.advance(delay_s)
                await worker.drain()

        try:
            for n in range(49):
                await db.emit("sandbox.patch", {"sandbox_id": f"sb-{n}"}, clock())
            await fail_everything_pending()
            endpoint = await db.endpoint_row(endpoint_id)
            assert (endpoint.failure_count, endpoint.active) == (49, True)

            await db.emit("sandbox.patch", {"sandbox_id": "sb-49"}, clock())
            await fail_everything_pending()
            endpoint = await db.endpoint_row(endpoint_id)
            assert (endpoint.failure_count, endpoint.active) == (50, False)

            sent = len(receiver.received)
            await db.emit("sandbox.patch", {"sandbox_id": "sb-while-suspended"}, clock())
            assert await worker.drain() == 0
            assert len(receiver.received) == sent

            resumed = await webhooks.set_active(db.sessions, db.user_id, endpoint_id, active=True)
            assert (resumed.failure_count, resumed.active) == (0, True)
            healthy = True
            await db.emit("sandbox.patch", {"sandbox_id": "sb-after-resume"}, clock())
            assert await worker.drain() == 1
        finally:
            await worker.stop()
        assert receiver.received[-1].json["data"] == {"sandbox_id": "sb-after-resume"}
        assert len(receiver.received) == 50 * 6 + 1


async def test_suspended_endpoint_holds_its_pending_deliveries_until_resume(cp_database_url: str) -> None:
    clock = FakeClock()
    async with webhook_db(cp_database_url) as db, running_receiver() as receiver:
        endpoint_id, _ = await db.endpoint(receiver.url + "/hook")
        await db.emit("template.submit", {"template_id": "tpl_1"}, clock())
        await webhooks.set_active(db.sessions, db.user_id, endpoint_id, active=False)
        worker = make_worker(db, clock)
        try:
            clock.advance(3600)
            assert await worker.run_once() == 0
            await webhooks.set_active(db.sessions, db.user_id, endpoint_id, active=True)
            assert await worker.run_once() == 1
        finally:
            await worker.stop()
        assert receiver.events() == ["template.submit"]


async def test_endpoints_receive_only_the_actions_they_subscribe_to(cp_database_url: str) -> None:
    clock = FakeClock()
    async with webhook_db(cp_database_url) as db, running_receiver() as receiver:
        await db.endpoint(receiver.url + "/all")
        await db.endpoint(receiver.url + "/all-explicit", [])
        await db.endpoint(receiver.url + "/sandboxes", ["sandbox.create"])
        await db.endpoint(receiver.url + "/disks", ["disk.create", "disk.delete"])
        for action in ("sandbox.create", "disk.delete", "network.create"):
            await db.emit(action, {"n": action}, clock())
        with pytest.raises(ValueError, match="unknown webhook action"):
            await db.emit("sandbox.explode", {}, clock())
        worker = make_worker(db, clock)
        try:
            await worker.drain()
        finally:
            await worker.stop()
        everything = ["sandbox.create", "disk.delete", "network.create"]
        assert sorted(receiver.events("/all")) == sorted(everything)
        assert sorted(receiver.events("/all-explicit")) == sorted(everything)
        assert receiver.events("/sandboxes") == ["sandbox.create"]
        assert receiver.events("/disks") == ["disk.delete"]
        assert len(await db.deliveries()) == 8


async def test_retention_removes_finished_after_30_minutes_and_anything_after_72_hours(
    cp_database_url: str,
) -> None:
    clock = FakeClock()
    async with (
        webhook_db(cp_database_url) as db,
        running_receiver(lambda got: 500 if got.path == "/bad" else 200) as receiver,
    ):
        worker = make_worker(db, clock)

        async def kept() -> list[str]:
            await worker.cleanup()
            return sorted(row.event_action for row in await db.deliveries())

        try:
            await db.endpoint(receiver.url + "/ok", ["sandbox.create"])
            await db.emit("sandbox.create", {}, clock())
            await worker.drain()
            clock.advance(30 * 60 - 1)
            assert await kept() == ["sandbox.create"]
            clock.advance(2)
            assert await kept() == []

            await db.endpoint(receiver.url + "/bad", ["disk.create"])
            await db.emit("disk.create", {}, clock())
            await worker.drain()
            for delay_s in RETRY_DELAYS_S:
                clock.advance(delay_s)
                await worker.drain()
            assert [row.status for row in await db.deliveries()] == ["failed"]
            clock.advance(30 * 60 - 1)
            assert await kept() == ["disk.create"]
            clock.advance(2)
            assert await kept() == []

            held_id, _ = await db.endpoint(receiver.url + "/ok", ["network.create"])
            await db.emit("network.create", {}, clock())
            await webhooks.set_active(db.sessions, db.user_id, held_id, active=False)
            clock.advance(72 * 3600 - 1)
            assert await worker.drain() == 0
            assert await kept() == ["network.create"]
            clock.advance(2)
            assert await kept() == []
        finally:
            await worker.stop()


async def test_concurrent_workers_send_each_delivery_once(cp_database_url: str) -> None:
    clock = FakeClock()

    async def slow_ok(_: Received) -> int:
        await asyncio.sleep(0.005)
        return 200

    async with webhook_db(cp_database_url) as db, running_receiver(slow_ok) as receiver:
        await db.endpoint(receiver.url + "/hook")
        for n in range(120):
            await db.emit("sandbox.resize", {"seq": n}, clock())
        workers = [make_worker(db, clock, webhook_concurrency=8) for _ in range(4)]
        try:
            counts = await asyncio.gather(*(w.drain() for w in workers))
        finally:
            for w in workers:
                await w.stop()
        ids = [r.headers["x-webhook-delivery"] for r in receiver.received]
        assert len(ids) == len(set(ids)) == 120
        assert sum(counts) == 120 and sum(1 for c in counts if c) > 1
        assert sorted(r.json["data"]["seq"] for r in receiver.received) == list(range(120))


async def test_guard_refuses_to_deliver_to_a_private_address(cp_database_url: str) -> None:
    clock = FakeClock()
    async with webhook_db(cp_database_url) as db, running_receiver() as receiver:
        # stored while private targets were allowed; by address and by a name that resolves to loopback
        await db.endpoint(receiver.url + "/internal")
        await db.endpoint(receiver.url.replace("127.0.0.1", "localhost") + "/internal")
        await db.emit("sandbox.create", CREATE_DATA, clock())
        worker = make_worker(db, clock, webhook_allow_private_targets=False)
        try:
            assert await worker.run_once() == 2
        finally:
            await worker.stop()
        assert receiver.received == []
        for row in await db.deliveries():
            assert row.status == "pending" and "loopback, private or link-local" in (row.last_error or "")


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),
        ("2002:7f00:1::", False),
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
    ],
)
def test_only_public_addresses_are_delivery_targets(address: str, public: bool) -> None:
    assert webhooks.is_public_address(address) is public


async def test_event_to_acknowledgement_is_fast_when_woken(cp_database_url: str) -> None:
    """A running worker is woken by the emitting commit; it does not wait for its poll interval."""
    async with webhook_db(cp_database_url) as db, running_receiver() as receiver:
        await db.endpoint(receiver.url + "/hook")
        worker = DeliveryWorker(db.sessions, db.box, worker_settings(db.url, webhook_poll_interval_s=30.0))
        worker.start()
        try:
            await asyncio.sleep(0.2)  # let the first (empty) poll pass
            started = time.monotonic()
            async with asyncio.timeout(10):
                await db.emit("sandbox.pause", {"reason": "idle"}, utcnow())
                await receiver.arrived.wait()
        finally:
            await worker.stop()
        assert time.monotonic() - started < 5
        assert receiver.events() == ["sandbox.pause"]


async def test_a_stopping_worker_hands_interrupted_deliveries_back_at_once(cp_database_url: str) -> None:
    release = asyncio.Event()

    async def hold(_: Received) -> int:
        await release.wait()
        return 200

    async with webhook_db(cp_database_url) as db, running_receiver(hold) as receiver:
        await db.endpoint(receiver.url + "/hook")
        await db.emit("sandbox.destroy", {"sandbox_id": "sb-1"}, utcnow())
        stopping = DeliveryWorker(db.sessions, db.box, worker_settings(db.url, webhook_lease_s=3600))
        stopping.start()
        async with asyncio.timeout(10):
            await receiver.arrived.wait()
        await stopping.stop()  # e.g. a redeploy, while the receiver is still answering
        release.set()
        successor = make_worker(db, FakeClock(utcnow()))
        try:
            assert await successor.run_once() == 1  # no need to wait out the hour-long lease
        finally:
            await successor.stop()
        [row] = await db.deliveries()
        assert (row.status, row.attempts) == ("delivered", 1)
        assert len(receiver.received) == 2


async def test_a_live_worker_keeps_its_claim_while_an_attempt_outlasts_the_lease(
    cp_database_url: str,
) -> None:
    """A slow receiver (3 s) with 1 s leases: the sending worker renews its lease while it waits, so the
    other worker polling the same queue never takes the delivery over and the receiver gets it once."""

    async def slow(_: Received) -> int:
        await asyncio.sleep(3)
        return 200

    async with webhook_db(cp_database_url) as db, running_receiver(slow) as receiver:
        await db.endpoint(receiver.url + "/hook")
        await db.emit("sandbox.create", CREATE_DATA, utcnow())
        settings = worker_settings(db.url, webhook_lease_s=1.0, webhook_poll_interval_s=0.1)
        first = DeliveryWorker(db.sessions, db.box, settings)
        first.start()
        async with asyncio.timeout(10):
            await receiver.arrived.wait()
        second = DeliveryWorker(db.sessions, db.box, settings)
        second.start()
        try:
            await asyncio.sleep(3.5)  # three leases pass while the first attempt waits
            deadline = time.monotonic() + 10
            while (await db.deliveries())[0].status != "delivered" and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await second.stop()
            await first.stop()
        [row] = await db.deliveries()
        assert (row.status, row.attempts, len(receiver.received)) == ("delivered", 1, 1)


EMIT_ELSEWHERE = """
import asyncio, sys
from paddock_controlplane.resources import webhooks
from paddock_core.db import make_engine, make_sessionmaker, transaction

async def main(url, user_id):
    engine = make_engine(url)
    async with transaction(make_sessionmaker(engine)) as session:
        await webhooks.emit(session, user_id=user_id, action="sandbox.resume", data={"sandbox_id": "sb-1"})
    await engine.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_an_event_committed_by_another_process_wakes_the_worker_on_postgresql(
    tmp_path: Path,
) -> None:
    """Several control planes share one PostgreSQL: the one that commits an event need not deliver it.
    (PostgreSQL only: SQLite has one control plane, whose commits wake its own worker in process.)"""
    async with (
        fresh_database("postgresql", tmp_path) as database_url,
        webhook_db(database_url) as db,
        running_receiver() as receiver,
    ):
        await db.endpoint(receiver.url + "/hook")
        worker = DeliveryWorker(db.sessions, db.box, worker_settings(db.url, webhook_poll_interval_s=30.0))
        worker.start()
        try:
            await asyncio.sleep(0.5)  # the first (empty) poll passes; the listener connects
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
            emitter = await asyncio.create_subprocess_exec(
                sys.executable, "-c", EMIT_ELSEWHERE, db.url, db.user_id, env=env
            )
            assert await emitter.wait() == 0
            committed = time.monotonic()
            async with asyncio.timeout(10):
                await receiver.arrived.wait()
            waited_s = time.monotonic() - committed
        finally:
            await worker.stop()
        assert waited_s < 5  # not the 30 s poll
        assert receiver.events() == ["sandbox.resume"]
