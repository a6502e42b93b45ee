"""What a create runs under its account's lock (issue #36). One account's creates take turns on that
lock, and each statement there is a round trip through a busy event loop: on two control planes and
PostgreSQL, one account's creates topped out at 1 ÷ the time the lock is held (~65/s at 14 statements
after it). So the lock is followed by one statement of checks (the caps' counts, the name, a numbered
name to fall back to, and on PostgreSQL the placement lock), then placement's reads, then the insert."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import event, insert, select

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.sandboxes import names
from paddock_core.db import transaction
from tests.controlplane.conftest import Clocked, user_client
from tests.controlplane.fakehost import HOST_BEAT
from tests.controlplane.hosts import rows as rows_of

pytestmark = pytest.mark.db


class Statements:
    """The statements the app's engine runs, with the connection each ran on."""

    def __init__(self, clocked: Clocked) -> None:
        self.seen: list[tuple[int, str]] = []
        self.engine = clocked.services.engine.sync_engine
        event.listen(self.engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append((id(conn), " ".join(statement.split())))

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)

    def under_account_lock(self) -> list[str]:
        """The statements between the last create's account lock and its insert, on its connection."""
        lock = max(i for i, (_, s) in enumerate(self.seen) if s.startswith("UPDATE users SET lock_version"))
        conn = self.seen[lock][0]
        mine = [s for c, s in self.seen[lock + 1 :] if c == conn]
        return mine[: next(i for i, s in enumerate(mine) if s.startswith("INSERT INTO sandboxes"))]


async def test_a_create_runs_one_statement_of_checks_then_placement_under_its_account_lock(
    clocked: Clocked, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, api = await user_client(clocked)
    statements = Statements(clocked)
    try:
        async with api:
            for _ in range(2):  # the first also reads the account's plan, which is then kept for 5 s
                statements.seen.clear()
                made = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
                assert made.status_code == 200, made.text
            between = statements.under_account_lock()
            # The checks; the leading hosts; the one host's held memory. Before: the caps, the name,
            # the placement lock, the hosts, the host's row locked, its memory.
            assert len(between) == 3, between
            assert "pg_advisory_xact_lock" in between[0] or clocked.services.engine.dialect.name == "sqlite"

            # An account whose plain names are all taken (here the only one) gets the numbered name
            # checked with them, with no trip more.
            monkeypatch.setattr(names, "ADJECTIVES", ["busy"])
            monkeypatch.setattr(names, "ANIMALS", ["bee"])
            async with transaction(clocked.services.sessions) as session:
                row = rows_of.running_sandbox(
                    "sb-busybee", owner, HOST_BEAT["id"], clocked.clock(), mem_mib=1
                )
                await session.execute(insert(Sandbox), [{**row, "name": "busy-bee"}])
            statements.seen.clear()
            numbered = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
            assert numbered.status_code == 200, numbered.text
            assert numbered.json()["data"]["name"].startswith("busy-bee-"), numbered.json()["data"]
            assert len(statements.under_account_lock()) == 3, statements.under_account_lock()

            # A name the caller gives that is taken is still refused.
            taken = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "busy-bee"})
            assert taken.status_code == 409, taken.text
            assert "a sandbox named 'busy-bee' already exists" in taken.text, taken.text
    finally:
        statements.close()


async def _running(api: httpx.AsyncClient) -> str:
    """A new sandbox's id."""
    made = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert made.status_code == 200, made.text
    return str(made.json()["data"]["id"])


async def test_a_destroy_and_its_reclaim_read_the_row_once_each_with_its_memberships(
    clocked: Clocked,
) -> None:
    """Every sandbox made is destroyed once. The destroy and the reclaim after it each read the row, its
    memberships joined, in one statement, and write only what changed: through the ORM they read the
    whole row three times (the destroy once, the reclaim twice), each with a second statement for the
    memberships, and flushed twice."""
    _, api = await user_client(clocked)
    statements = Statements(clocked)
    try:
        async with api:
            sandbox_id = await _running(api)
            statements.seen.clear()
            gone = await api.delete(f"/v1/sandboxes/{sandbox_id}")
            assert gone.status_code == 200, gone.text
            status = select(Sandbox.status).where(Sandbox.id == sandbox_id)  # this test's own poll

            async def current() -> str | None:
                async with clocked.services.sessions() as session:  # each read sees the latest commit
                    return await session.scalar(status)

            deadline = time.monotonic() + 10
            while await current() != "destroyed" and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert await current() == "destroyed"
            ran = [s for _, s in statements.seen if not s.startswith("SELECT sandboxes.status FROM")]
            full_reads = [
                s for s in ran if s.startswith("SELECT sandboxes.id, sandboxes.user_id, sandboxes.name")
            ]
            assert len(full_reads) == 2, ran
            assert all("LEFT OUTER JOIN network_members" in s for s in full_reads), full_reads
            assert not [s for s in ran if s.startswith("SELECT network_members")], ran
            updates = [s for s in ran if s.startswith("UPDATE sandboxes")]
            assert len(updates) == 2 and "destroyed_at" in updates[1], updates
    finally:
        statements.close()


async def test_a_fork_runs_the_creates_one_statement_of_checks_under_its_account_lock(
    clocked: Clocked,
) -> None:
    """A fork checks the caps and its child's name in the create's one statement (which on PostgreSQL
    also takes the placement lock its room check needs): under its account's lock it reads its source,
    the checks, its host (the tier's refusal of a copy) and its room, then inserts. Before, the caps,
    the placement lock and the name were a statement each."""
    _, api = await user_client(clocked)
    statements = Statements(clocked)
    try:
        async with api:
            source_id = await _running(api)
            for _ in range(2):  # the first also reads the account's plan, which is then kept for 5 s
                statements.seen.clear()
                forked = await api.post(f"/v1/sandboxes/{source_id}/fork", json={})
                assert forked.status_code == 200, forked.text
            between = statements.under_account_lock()
            assert len(between) == 5, between
            assert between[0].startswith("SELECT sandboxes.id, sandboxes.user_id"), between  # the source
            assert "count(" in between[1] and "sandboxes.name" in between[1], between
            if clocked.services.engine.dialect.name == "postgresql":
                assert "pg_advisory_xact_lock" in between[1], between
            assert not [s for s in between if "pg_advisory_xact_lock" in s][1:], between
            child = forked.json()["data"]
            assert child["status"] == "forking" and child["name"], child
    finally:
        statements.close()
