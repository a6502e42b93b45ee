"""Webhook claims on PostgreSQL (issue #36): one statement each, reading the due rows in claim order
rather than the whole backlog, and never waiting for the worker's own result writes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import event, text

from paddock_controlplane.workers import webhook_delivery
from paddock_controlplane.workers.webhook_delivery import DeliveryWorker, Outcome
from tests.controlplane.webhook_support import FakeClock, WebhookDb, webhook_db, worker_settings

pytestmark = [pytest.mark.db, pytest.mark.parametrize("db_engine", ["postgresql"], indirect=True)]

DATA = {"sandbox_id": "sb-x", "shape": "s-1vcpu-1gb", "disk_mib": 10240, "region": "eu"}


async def emit_many(db: WebhookDb, count: int, clock: FakeClock) -> None:
    for start in range(0, count, 500):
        async with db.sessions() as session, session.begin():
            for _ in range(min(500, count - start)):
                await webhook_delivery.webhooks.emit(
                    session, user_id=db.user_id, action="sandbox.create", data=DATA, occurred_at=clock()
                )


def make_worker(db: WebhookDb, clock: FakeClock) -> DeliveryWorker:
    return DeliveryWorker(db.sessions, db.box, worker_settings(db.url), clock=clock)


async def test_a_claim_does_not_wait_for_the_worker_s_result_write(cp_database_url: str) -> None:
    clock = FakeClock()
    async with webhook_db(cp_database_url) as db:
        await db.endpoint("http://127.0.0.1:9/hook")
        await emit_many(db, 2, clock)
        worker = make_worker(db, clock)
        [first] = await worker.claim(1)
        # Another transaction holds the first delivery's row: the worker's write of its result waits.
        async with db.sessions() as blocker, blocker.begin():
            await blocker.execute(
                text("SELECT id FROM webhook_deliveries WHERE id = :id FOR UPDATE"), {"id": first.id}
            )
            recording = asyncio.create_task(worker.record_many([(first, Outcome(True, clock()))]))
            await asyncio.sleep(0.2)
            assert not recording.done()
            # ... and the next claim goes on meanwhile (row locks, not one lock for all of its writes).
            [second] = await asyncio.wait_for(worker.claim(1), 5.0)
            assert second.id != first.id
        await asyncio.wait_for(recording, 5.0)
        statuses = sorted(row.status for row in await db.deliveries())
        assert statuses == ["delivered", "pending"]
        await worker.stop()


async def test_a_claim_is_one_statement_that_reads_the_due_rows_in_order(cp_database_url: str) -> None:
    clock = FakeClock()
    async with webhook_db(cp_database_url) as db:
        await db.endpoint("http://127.0.0.1:9/hook")
        await emit_many(db, 1000, clock)
        clock.advance(1)
        worker = make_worker(db, clock)
        assert len(await worker.claim(16)) == 16  # the endpoint is known from here on
        statements: list[str] = []

        def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if statement.lstrip().split(None, 1)[0].upper() in ("SELECT", "UPDATE", "WITH"):
                statements.append(statement)

        sync_engine = db.sessions.kw["bind"].sync_engine
        event.listen(sync_engine, "before_cursor_execute", seen)
        try:
            worker._likely_due = True  # as after a wake: no idle check first
            assert len(await worker.claim(16)) == 16
        finally:
            event.remove(sync_engine, "before_cursor_execute", seen)
        leases = [s for s in statements if "webhook_deliveries" in s]
        assert len(leases) == 1, leases

        # What that statement costs does not grow with the backlog: the pending rows are read in claim
        # order and the scan stops at the limit (it read and sorted all 1,000 before).
        params = {"b_now": clock(), "b_until": clock(), "b_token": "t", "b_limit": 16}
        compiled = webhook_delivery._PICK_AND_LEASE.compile(dialect=sync_engine.dialect)
        async with db.sessions() as session, session.begin():
            connection = await session.connection()
            [plan] = (
                await connection.exec_driver_sql(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + str(compiled),
                    tuple({**compiled.params, **params}[name] for name in compiled.positiontup or ()),
                )
            ).one()
            await session.rollback()
        plan = json.loads(plan) if isinstance(plan, str) else plan
        [pick] = [node for node in plan[0]["Plan"]["Plans"] if node.get("Subplan Name") == "CTE picked"]
        blocks = pick["Shared Hit Blocks"] + pick.get("Shared Read Blocks", 0)
        # 98 blocks here with the pending index; 2,002 without it (every pending row, then a sort).
        assert blocks < 400, json.dumps(pick, indent=1)[:3000]
