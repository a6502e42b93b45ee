"""``GET /v1/sandboxes/{id}`` reads a polled sandbox from the database once per change, on SQLite and on
PostgreSQL (issue #36), and never serves a state older than a change another control plane committed
for longer than its bound: on PostgreSQL, the notification of that commit (``db.PgChanges``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.engine import Engine

from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.db import PgChanges, make_engine, make_sessionmaker, transaction
from tests.conftest import LiveServer
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, fake_hosts
from tests.controlplane.fakehost import HOST_BEAT

pytestmark = pytest.mark.db


class SandboxReads:
    """Counts statements that read the ``sandboxes`` table, on every engine of this process (the
    control plane's own, and ``PointReads``' connection on a SQLite file)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM sandboxes" in statement:
            self.count += 1


@pytest.fixture
def sandbox_reads() -> Any:
    reads = SandboxReads()
    event.listen(Engine, "before_cursor_execute", reads)
    yield reads
    event.remove(Engine, "before_cursor_execute", reads)


@pytest.fixture
def quiet_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # No reconciler pass while a test counts reads (its commits would end what is kept, rightly).
    return cp_settings.model_copy(update={"reconcile_interval_s": 600.0})


async def start(settings: ControlPlaneSettings) -> tuple[LiveServer, httpx.AsyncClient]:
    server = LiveServer(create_app(settings))
    await server.__aenter__()
    return server, httpx.AsyncClient(base_url=server.url, timeout=30)


@pytest.fixture
async def plane_a(
    quiet_settings: ControlPlaneSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """Control plane A, a fake host, a user's key on A's client, and a running sandbox of that user."""
    await migrate(quiet_settings)
    fake_hosts(monkeypatch)
    server, a = await start(quiet_settings)
    try:
        beat = await a.post(
            "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
        )
        assert beat.status_code == 200, beat.text
        _, key = await ControlPlane(server.url, quiet_settings, a).new_user("pro")
        a.headers["X-Api-Key"] = key
        created = await a.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert created.status_code == 200, created.text
        yield a, created.json()["data"]["id"]
    finally:
        await a.aclose()
        await server.__aexit__(None, None, None)


@pytest.fixture
async def two_planes(
    plane_a: tuple[httpx.AsyncClient, str], quiet_settings: ControlPlaneSettings
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, str]]:
    """A, and control plane B on the same database (two apps, as two processes run them), with the
    same key."""
    a, sandbox_id = plane_a
    server, b = await start(quiet_settings.model_copy(update={"data_dir": quiet_settings.data_dir / "b"}))
    try:
        b.headers["X-Api-Key"] = a.headers["X-Api-Key"]
        yield a, b, sandbox_id
    finally:
        await b.aclose()
        await server.__aexit__(None, None, None)


async def until_kept(http: httpx.AsyncClient, sandbox_id: str, reads: SandboxReads) -> None:
    """GETs until one is answered without reading the database (on PostgreSQL, once the channel is
    heard: its listener connects on the first read)."""
    for _ in range(150):
        before = reads.count
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).status_code == 200
        if reads.count == before:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("every GET of an unchanged sandbox read the database")


async def test_a_polled_sandbox_is_read_once_per_change(
    plane_a: tuple[httpx.AsyncClient, str], sandbox_reads: SandboxReads
) -> None:
    a, sandbox_id = plane_a
    await until_kept(a, sandbox_id, sandbox_reads)
    before = sandbox_reads.count
    for _ in range(40):
        got = await a.get(f"/v1/sandboxes/{sandbox_id}")
        assert got.status_code == 200 and got.json()["data"]["status"] == "running"
    assert sandbox_reads.count - before <= 2, "an unchanged sandbox was read from the database per GET"

    # A change made through this control plane is in its very next answer.
    changed = await a.patch(f"/v1/sandboxes/{sandbox_id}", json={"auto_pause_after_seconds": 777})
    assert changed.status_code == 200, changed.text
    got = (await a.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
    assert got["auto_pause_after_seconds"] == 777


@pytest.mark.parametrize("db_engine", ["postgresql"], indirect=True)
async def test_a_change_through_control_plane_b_is_seen_on_a_within_the_bound(
    two_planes: tuple[httpx.AsyncClient, httpx.AsyncClient, str], sandbox_reads: SandboxReads
) -> None:
    a, b, sandbox_id = two_planes
    for seconds in (601, 602, 603):
        await until_kept(a, sandbox_id, sandbox_reads)  # A keeps the current state
        changed = await b.patch(f"/v1/sandboxes/{sandbox_id}", json={"auto_pause_after_seconds": seconds})
        assert changed.status_code == 200, changed.text
        written = time.monotonic()
        while True:
            got = (await a.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
            if got.get("auto_pause_after_seconds") == seconds:
                break
            # B's commit is announced to A at once; a kept row alone would last up to 1 s.
            assert time.monotonic() - written < 0.4, f"A still answers {got.get('auto_pause_after_seconds')}"
            await asyncio.sleep(0.005)
    # and B's pause: another process's change of status
    paused = await b.post(f"/v1/sandboxes/{sandbox_id}/pause")
    assert paused.status_code == 200, paused.text
    written = time.monotonic()
    while (await a.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] != "paused":
        assert time.monotonic() - written < 0.4, "A still answers the sandbox as running"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("db_engine", ["postgresql"], indirect=True)
async def test_this_process_s_write_to_a_notifying_table_counts_at_its_commit(
    quiet_settings: ControlPlaneSettings,
) -> None:
    """Without waiting for its notification to come back: a caller who changed a sandbox through this
    control plane reads the change in its next request. Writes elsewhere, and rolled-back ones, keep
    what is kept (the audit trail and the webhook outbox commit all the time)."""
    await migrate(quiet_settings)
    engine = make_engine(quiet_settings.database_url)
    sessions = make_sessionmaker(engine)
    changes = PgChanges(quiet_settings.database_url, engine.sync_engine)
    changes.tables = ("network_members", "sandboxes")  # what the listener reads from the database
    try:
        async with transaction(sessions) as session:
            await session.execute(text("UPDATE plans SET name = name"))
        async with transaction(sessions) as session:
            await session.execute(select(Sandbox.id).limit(1))
        assert changes.version == 0
        with pytest.raises(RuntimeError):
            async with transaction(sessions) as session:
                await session.execute(text("UPDATE sandboxes SET name = name"))
                raise RuntimeError("rolled back")
        assert changes.version == 0
        async with transaction(sessions) as session:
            await session.execute(text("UPDATE sandboxes SET name = name"))
            assert changes.version == 0  # not before the commit
        assert changes.version == 1
    finally:
        changes.stop()
        await engine.dispose()
