"""Control-plane fixtures: a real server on a fresh database, users and keys made through the domain."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select

from paddock_controlplane.app import create_app
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import WebhookDelivery
from paddock_controlplane.records.services import Services
from paddock_controlplane.resources import accounts, webhooks
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core import tls
from paddock_core.db import make_engine, make_sessionmaker, transaction
from tests.conftest import LiveServer
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink
from tests.controlplane.webhook_support import FakeClock

HOST_TOKEN = "test-host-token-0123456789"


@dataclass
class ControlPlane:
    url: str
    settings: ControlPlaneSettings
    http: httpx.AsyncClient

    async def new_user(self, plan: str = "pro", credits: int = 500) -> tuple[str, str]:
        """Create a user and a key through the domain (what the admin CLI does); returns (user id, key)."""
        engine = make_engine(self.settings.database_url)
        try:
            async with transaction(make_sessionmaker(engine)) as session:
                user = await accounts.create_user(session, plan_id=plan, signup_credits=credits)
                key = await accounts.create_key(session, user.id)
            return user.id, key.plaintext
        finally:
            await engine.dispose()


@pytest.fixture
def cp_settings(cp_database_url: str, tmp_path: Path) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        database_url=cp_database_url,
        data_dir=tmp_path / "cp",
        host_token=SecretStr(HOST_TOKEN),
        secret_key=SecretStr("test-secret-key-0123456789"),
        region="eu",
        reconcile_interval_s=0.2,
        # The fake host beats once, when a test's fixture registers it: at the default 15 s a slow test
        # on a loaded box saw its host declared dead and its sandboxes errored (CI). A host's death is
        # tested with real agents (tests/integration/test_recovery.py, tests/multihost/).
        host_dead_after_s=10**9,
    )


@pytest.fixture
async def controlplane(cp_settings: ControlPlaneSettings) -> AsyncIterator[ControlPlane]:
    # The app migrates as it starts: a no-op on cp_settings' database, a migrated copy, that shows it is at head.
    async with (
        LiveServer(create_app(cp_settings)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30, verify=tls.client_context()) as http,
    ):
        yield ControlPlane(url=server.url, settings=cp_settings, http=http)


def fake_hosts(monkeypatch: pytest.MonkeyPatch) -> FakeHostLink:
    """Every host the control plane links to is this one fake host (the unit-test seam), for the test."""
    link = FakeHostLink()

    async def for_host(services: object, host_id: str | None) -> FakeHostLink:
        return link

    monkeypatch.setattr(hostlink, "for_host", for_host)
    return link


# --- a control plane whose clock a test moves by hand, on the fake host ----------------------------


@dataclass
class Clocked:
    cp: ControlPlane
    clock: FakeClock
    services: Services
    host: FakeHostLink

    async def subscribe(self, user_id: str, *events: str) -> None:
        """An endpoint of ``user_id``'s for ``events`` at a dead local URL: their deliveries are written
        (and never land), for :meth:`events_of` to read."""
        await webhooks.create_endpoint(
            self.services.sessions,
            self.services.secret_box,
            user_id=user_id,
            url="http://127.0.0.1:9/hook",
            events=list(events),
            allow_private=True,
        )

    async def events_of(self, action: str) -> list[dict[str, object]]:
        """The ``data`` of every ``action`` event written so far, oldest first."""
        async with self.services.sessions() as session:
            rows = await session.scalars(
                select(WebhookDelivery)
                .where(WebhookDelivery.event_action == action)
                .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
            )
            return [dict(json.loads(row.payload)["data"]) for row in rows]

    async def balance(self, user_id: str) -> int:
        engine = make_engine(self.cp.settings.database_url)
        try:
            async with make_sessionmaker(engine)() as session:
                return await accounts.balance_micro(session, user_id)
        finally:
            await engine.dispose()

    async def reconcile(self, step: Any) -> None:
        """One reconciler pass now (the background loop also runs them; the outcome is the same), and
        what it set off (an auto-pause runs as a task) carried out before this returns: what a test reads
        next is the pass's whole outcome, with no sleep to guess how long that takes."""
        self.services.billing_last = self.services.storage_billing_last = -math.inf  # never billed
        # Neither beside the app's own loop (every 0.2 s here) nor beside what it set off: on
        # PostgreSQL a pass skips the rows another transaction holds locked, and a billing pass the loop
        # started locks every running sandbox's row in turn (CI saw a timeout skip the sandbox it was
        # to hibernate). The loop may also have run this very pass a moment before, on the same
        # advanced clock: what that set off is waited for too, as is what this one sets off.
        async with self.services.reconciling:
            await self.services.tasks.drain()
            async with transaction(self.services.sessions) as session:
                await step(session, self.services)
        await self.services.tasks.drain()

    async def status(self, http: httpx.AsyncClient, sandbox_id: str, wanted: str) -> dict[str, Any]:
        for _ in range(100):
            view = (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
            if view["status"] == wanted:
                return dict(view)
            await asyncio.sleep(0.05)
        raise AssertionError(f"{sandbox_id} is {view['status']}, wanted {wanted}")


@pytest.fixture
async def clocked(
    cp_settings: ControlPlaneSettings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Clocked]:
    link = fake_hosts(monkeypatch)
    clock = FakeClock(start=None)
    settings = cp_settings.model_copy(update={"host_dead_after_s": 10**9})
    app = create_app(settings, clock=clock)
    async with (
        LiveServer(app) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30, verify=tls.client_context()) as http,
    ):
        beat = await http.post(
            "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
        )
        assert beat.status_code == 200
        cp = ControlPlane(url=server.url, settings=settings, http=http)
        yield Clocked(cp, clock, app.state.services, link)


async def user_client(clocked: Clocked, credits: int = 500) -> tuple[str, httpx.AsyncClient]:
    user_id, key = await clocked.cp.new_user("pro", credits=credits)
    return user_id, httpx.AsyncClient(
        base_url=clocked.cp.url, headers={"X-API-Key": key}, timeout=30, verify=tls.client_context()
    )
