"""The compute billing pass in batches (issue #36): each batch of running sandboxes is settled and committed
in its own short transaction, so an owner's create does not wait for the whole pass (one transaction
holding every owner's row took over 30 s at 100,000 sandboxes, and creates waited behind it); and two
control planes' passes side by side charge every second exactly once.

The host is the fake seam (these are the control plane's rules).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.records.models import CreditEntry, User
from paddock_controlplane.resources import billing
from paddock_controlplane.workers import reconciler
from paddock_core.db import make_engine, make_sessionmaker
from tests.controlplane.conftest import Clocked, user_client

pytestmark = pytest.mark.db

# s-1vcpu-1gb: 1 vCPU at 0.0504 USD/h + 1 GiB at 0.0162 USD/h, 100 credits per USD.
PER_SECOND_MICRO = 1400 + 450


async def balances(clocked: Clocked, user_ids: list[str]) -> dict[str, int]:
    """The balances as another connection sees them: only what has been committed."""
    engine = make_engine(clocked.cp.settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            rows = await session.execute(select(User.id, User.credits_micro).where(User.id.in_(user_ids)))
            return {str(user_id): int(credits) for user_id, credits in rows.all()}
    finally:
        await engine.dispose()


async def test_a_pass_commits_batch_by_batch_and_an_owner_can_create_meanwhile(
    clocked: Clocked, db_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clocked.services.settings, "billing_interval_s", 3600.0)  # only the test's pass
    monkeypatch.setattr(billing, "BATCH_ROWS", 1)
    owners: dict[str, str] = {}  # sandbox id -> owner
    clients = {}
    for _ in range(3):
        user_id, http = await user_client(clocked)
        clients[user_id] = http
        created = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert created.status_code == 200, created.text
        owners[created.json()["data"]["id"]] = user_id
    order = [owners[sid] for sid in sorted(owners)]  # the pass goes by sandbox id
    start = await balances(clocked, order)
    clocked.clock.advance(100)
    real = billing.settle_batch
    seen: list[dict[str, int]] = []
    created_meanwhile: list[int] = []

    async def watched(session: AsyncSession, now: dt.datetime, **kwargs: Any) -> billing.Batch:
        batch = await real(session, now, **kwargs)
        if len(seen) == 1 and db_engine == "postgresql":
            # This batch holds its sandbox's and its owner's rows; the first owner's are free.
            async with asyncio.timeout(10):
                answer = await clients[order[0]].post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
            created_meanwhile.append(answer.status_code)
        seen.append(await balances(clocked, order))
        return batch

    monkeypatch.setattr(billing, "settle_batch", watched)
    try:
        await clocked.reconcile(reconciler.billing_pass)
    finally:
        for http in clients.values():
            await http.aclose()
    charge = 100 * PER_SECOND_MICRO
    # Seen from outside while each batch ran: every batch before it already committed, none after.
    for index, balances_then in enumerate(seen[: len(order)]):
        for position, user_id in enumerate(order):
            expected = start[user_id] - charge if position < index else start[user_id]
            assert balances_then[user_id] == expected, (index, position)
    assert await balances(clocked, order) == {user_id: start[user_id] - charge for user_id in order}
    if db_engine == "postgresql":
        assert created_meanwhile == [200]


async def test_two_passes_side_by_side_charge_each_second_once(
    clocked: Clocked, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two control planes' passes at once (small batches, so they interleave on PostgreSQL): every
    sandbox is charged its seconds once, and the ledger adds up to the balances' fall."""
    monkeypatch.setattr(clocked.services.settings, "billing_interval_s", 3600.0)
    user_ids = []
    for _ in range(2):
        user_id, http = await user_client(clocked)
        async with http:
            for _ in range(3):
                created = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
                assert created.status_code == 200, created.text
        user_ids.append(user_id)
    start = await balances(clocked, user_ids)
    sessions = clocked.services.sessions
    for seconds in (40, 25):
        clocked.clock.advance(seconds)
        now = clocked.clock()
        await asyncio.gather(
            billing.billing_pass(sessions, now, batch_rows=2),
            billing.billing_pass(sessions, now, batch_rows=1),
        )
    after = await balances(clocked, user_ids)
    assert {u: start[u] - after[u] for u in user_ids} == {u: 3 * 65 * PER_SECOND_MICRO for u in user_ids}
    async with sessions() as session:
        ledger = await session.scalar(
            select(func.sum(CreditEntry.amount_micro)).where(
                CreditEntry.kind == "compute", CreditEntry.user_id.in_(user_ids)
            )
        )
    assert -int(ledger or 0) == 2 * 3 * 65 * PER_SECOND_MICRO
