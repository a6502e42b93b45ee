"""What a reconciler round costs its database when there is little to do: the passes with nothing due
this round (compute and storage billing, between their ``billing_interval_s``; orphaned snapshots,
looked for every ``ORPHAN_AFTER_S``) open no transaction. An idle control plane opened 12 a second,
3 of them for those; each is a pool checkout and two round trips to PostgreSQL at least."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from paddock_controlplane.workers import reconciler
from paddock_controlplane.workers.reconciler import PASSES, OrphanedSnapshots, Reconciler
from tests.controlplane.conftest import Clocked


async def test_a_round_opens_no_transaction_for_a_pass_with_nothing_due(
    clocked: Clocked, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = clocked.services
    test_task = asyncio.current_task()
    opened: list[int] = []
    real_transaction = reconciler.transaction

    def counted(sessions: Any) -> Any:
        if asyncio.current_task() is test_task:  # not the app's own loop, which runs beside
            opened.append(1)
        return real_transaction(sessions)

    monkeypatch.setattr(reconciler, "transaction", counted)
    passes = [OrphanedSnapshots() if isinstance(step, OrphanedSnapshots) else step for step in PASSES]
    rounds = Reconciler(services, passes)

    async def one_round() -> int:
        opened.clear()
        await rounds.run_once()
        return len(opened)

    services.billing_last = services.storage_billing_last = time.monotonic()  # both just billed
    assert await one_round() == len(PASSES) - 2  # the orphaned snapshots' first look is due
    assert await one_round() == len(PASSES) - 3
    services.billing_last = services.storage_billing_last = -math.inf  # an interval has gone by
    assert await one_round() == len(PASSES) - 1
    await services.tasks.drain()  # the compute billing it set off
