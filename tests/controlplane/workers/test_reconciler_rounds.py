"""What a reconciler round costs its database when there is little to do: the passes with nothing due
this round (compute and storage billing, between their ``billing_interval_s``; orphaned snapshots,
looked for every ``ORPHAN_AFTER_S``) open no transaction. An idle control plane opened 12 a second,
3 of them for those; each is a pool checkout and two round trips to PostgreSQL at least."""

from __future__ import annotations

import asyncio
import math
import time
from types import SimpleNamespace
from typing import Any

import pytest

from paddock_controlplane.records.services import Services
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


def test_a_control_plane_that_never_billed_bills_at_its_first_pass_whatever_the_hosts_uptime() -> None:
    """The monotonic clock counts from the host's boot: "never billed" must be due even when the host
    has been up for less than one ``billing_interval_s`` (a new CI machine was; its first pass billed
    nothing)."""
    settings = SimpleNamespace(billing_interval_s=time.monotonic() + 3600.0)  # longer than this uptime
    services = Services(settings, None, None, None, None)  # type: ignore[arg-type]
    assert reconciler.billing_due(services)
    assert reconciler.storage_billing_due(services)
    services.billing_last = services.storage_billing_last = time.monotonic()
    assert not reconciler.billing_due(services) and not reconciler.storage_billing_due(services)
