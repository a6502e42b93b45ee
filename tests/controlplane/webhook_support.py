"""Webhook test helpers: a real receiver on 127.0.0.1, a hand-moved clock, a migrated database."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_controlplane.app import MIGRATIONS
from paddock_controlplane.records.models import WebhookDelivery, WebhookEndpoint
from paddock_controlplane.resources import accounts, webhooks
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.crypto import SecretBox
from paddock_core.db import make_engine, make_sessionmaker, transaction, upgrade
from tests.conftest import LiveServer

SECRET_KEY = "test-secret-key-0123456789"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def verify(secret: str, received: Received, *, tolerance_s: float | None = None) -> bool:
    """What a receiver does: recompute the HMAC over ``<timestamp>.<raw body>``, compare in constant time."""
    timestamp = received.headers["x-webhook-timestamp"]
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + received.body, hashlib.sha256).hexdigest()
    fresh = tolerance_s is None or abs(time.time() - int(timestamp)) <= tolerance_s
    return fresh and hmac.compare_digest(received.headers["x-webhook-signature"], f"sha256={expected}")


@dataclass
class Receiver:
    """An ASGI webhook receiver. ``respond`` picks the status (and may stall) per request."""

    received: list[Received] = field(default_factory=list)
    respond: Callable[[Received], Any] = field(default_factory=lambda: lambda _: 200)
    url: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        item = Received(path=scope["path"], headers=headers, body=body, at=time.monotonic())
        self.received.append(item)
        self.arrived.set()
        answer = self.respond(item)
        if asyncio.iscoroutine(answer):
            answer = await answer
        status, extra = answer if isinstance(answer, tuple) else (answer, [])
        await send({"type": "http.response.start", "status": int(status), "headers": extra})
        await send({"type": "http.response.body", "body": b"ok"})

    def events(self, path: str | None = None) -> list[str]:
        return [r.json["event"] for r in self.received if path is None or r.path == path]


@asynccontextmanager
async def running_receiver(respond: Callable[[Received], Any] | None = None) -> AsyncIterator[Receiver]:
    receiver = Receiver()
    if respond is not None:
        receiver.respond = respond
    async with LiveServer(receiver) as server:
        receiver.url = server.url
        yield receiver


class FakeClock:
    """An injectable clock moved by hand: the retry schedule is tested without sleeping."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.now = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def worker_settings(database_url: str, **overrides: Any) -> ControlPlaneSettings:
    values: dict[str, Any] = {"webhook_allow_private_targets": True, **overrides}
    return ControlPlaneSettings(database_url=database_url, secret_key=SecretStr(SECRET_KEY), **values)


@dataclass
class WebhookDb:
    """A migrated database with one user, for driving the domain and the worker directly."""

    url: str
    sessions: async_sessionmaker[AsyncSession]
    box: SecretBox
    user_id: str

    async def endpoint(self, url: str, events: list[str] | None = None) -> tuple[str, str]:
        created = await webhooks.create_endpoint(
            self.sessions, self.box, user_id=self.user_id, url=url, events=events, allow_private=True
        )
        return created.endpoint.id, created.secret

    async def emit(self, action: str, data: dict[str, Any], occurred_at: dt.datetime) -> None:
        async with transaction(self.sessions) as session:
            await webhooks.emit(
                session, user_id=self.user_id, action=action, data=data, occurred_at=occurred_at
            )

    async def deliveries(self) -> list[WebhookDelivery]:
        async with self.sessions() as session:
            rows = await session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.created_at))
            return list(rows.all())

    async def endpoint_row(self, endpoint_id: str) -> WebhookEndpoint:
        async with self.sessions() as session:
            row = await session.get(WebhookEndpoint, endpoint_id)
            assert row is not None
            return row


@asynccontextmanager
async def webhook_db(database_url: str, plan: str = "enterprise") -> AsyncIterator[WebhookDb]:
    await upgrade(MIGRATIONS, database_url)
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    async with transaction(sessions) as session:
        user = await accounts.create_user(session, plan_id=plan, signup_credits=500)
    try:
        yield WebhookDb(database_url, sessions, SecretBox(SECRET_KEY), user.id)
    finally:
        await engine.dispose()
