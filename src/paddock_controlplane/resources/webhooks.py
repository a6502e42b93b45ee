"""Webhook endpoints and the event outbox (§10.16, §11.14, §11.15).

:func:`emit` records an action inside the caller's transaction: one ``pending`` delivery per matching
active endpoint, with the exact body bytes fixed at that moment. The state change and its deliveries
commit or roll back together, so a process that dies between the two can neither lose nor invent an
event. :mod:`paddock_controlplane.workers.webhook_delivery` sends them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from sqlalchemy import Table, bindparam, delete, event, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from paddock_controlplane.records.models import WebhookDelivery, WebhookEndpoint
from paddock_controlplane.resources import accounts
from paddock_core import errors
from paddock_core.crypto import SecretBox
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.timeutil import as_utc, rfc3339, utcnow

#: Every action, in the contract's order (§11.14). The actions endpoint serves this list.
ACTIONS: tuple[str, ...] = (
    "sandbox.create",
    "sandbox.destroy",
    "sandbox.pause",
    "sandbox.resume",
    "sandbox.fork",
    "sandbox.patch",
    "sandbox.resize",
    "sandbox.egress.set",
    "sandbox.ssh_pubkey.update",
    "sandbox.bandwidth.update",
    "disk.create",
    "disk.delete",
    "disk.attach",
    "disk.detach",
    "network.create",
    "network.delete",
    "network.attach",
    "network.detach",
    "template.submit",
    "template.delete",
    "template.build.start",
    "template.build.complete",
    "sandbox.timeout",
    "snapshot.create",
    "snapshot.delete",
    "volume.create",
    "volume.resize",
    "volume.delete",
    "volume.attach",
    "volume.detach",
)
ACTION_SET = frozenset(ACTIONS)


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return rfc3339(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable in webhook data")


def render_payload(action: str, data: dict[str, Any], occurred_at: dt.datetime) -> str:
    """The body sent on every attempt: ``{"event", "occurredAt", "data"}`` as compact UTF-8 JSON."""
    body = {"event": action, "occurredAt": rfc3339(occurred_at), "data": data}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def subscribed(events: list[Any] | None, action: str) -> bool:
    return not events or action in events


_ENDPOINTS = cast(Table, WebhookEndpoint.__table__)
# Built once (every state change emits): the user's active endpoints. FOR KEY SHARE (PostgreSQL): an
# endpoint deleted concurrently is either seen gone or waits for this transaction, so the new
# deliveries never reference a vanished endpoint.
_SUBSCRIBERS = (
    select(_ENDPOINTS.c.id, _ENDPOINTS.c.events)
    .where(_ENDPOINTS.c.user_id == bindparam("user_id"), _ENDPOINTS.c.active.is_(True))
    .with_for_update(read=True, key_share=True)
)


async def emit(
    session: AsyncSession,
    *,
    user_id: str,
    action: str,
    data: dict[str, Any],
    occurred_at: dt.datetime | None = None,
) -> None:
    """Record ``action`` for ``user_id`` in the caller's transaction (the outbox).

    One delivery per active endpoint of the user subscribed to ``action``; nothing when there is none.
    Call it after the state change succeeded, inside the same transaction. An unknown action is a
    programming error (``ValueError``), never silently dropped.
    """
    if action not in ACTION_SET:
        raise ValueError(f"unknown webhook action {action!r}")
    when = as_utc(occurred_at) if occurred_at is not None else utcnow()
    # Through the session, not its connection: the caller's pending ORM changes are flushed first.
    rows = (await session.execute(_SUBSCRIBERS, {"user_id": user_id})).all()
    targets = [row.id for row in rows if subscribed(row.events, action)]
    if not targets:
        return
    await _announce(session)
    payload = render_payload(action, data, when)
    await session.execute(
        insert(WebhookDelivery),
        [
            {
                "id": new_id("whd_"),
                "endpoint_id": endpoint_id,
                "user_id": user_id,
                "event_action": action,
                "payload": payload,
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": when,
                "created_at": when,
            }
            for endpoint_id in targets
        ],
    )


# --- waking local workers ----------------------------------------------------------------------------

_WAKE_FLAG = "paddock_webhook_emitted"
_wakers: set[Callable[[], None]] = set()
#: PostgreSQL: NOTIFYed (once) by every transaction that makes deliveries due, so workers in other
#: processes wake when it commits (NOTIFY is transactional: a rollback sends nothing).
NOTIFY_CHANNEL = "paddock_webhooks"


async def _announce(session: AsyncSession) -> None:
    """Wake delivery workers when the caller's transaction commits: this process's at once (an
    ``after_commit`` hook), and on PostgreSQL every other process's too (``pg_notify``)."""
    if session.info.get(_WAKE_FLAG):
        return
    session.info[_WAKE_FLAG] = True
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(select(func.pg_notify(NOTIFY_CHANNEL, "")))


def add_waker(callback: Callable[[], None]) -> None:
    """Call ``callback`` after every commit that emitted deliveries in this process."""
    _wakers.add(callback)


def remove_waker(callback: Callable[[], None]) -> None:
    _wakers.discard(callback)


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    if session.info.pop(_WAKE_FLAG, False):
        for wake in list(_wakers):
            wake()


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_WAKE_FLAG, None)


# --- SSRF guard -------------------------------------------------------------------------------------


class TargetRefused(Exception):
    """The URL's host is not a public address (and private targets are not allowed)."""


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            return is_public_address(str(embedded))
    return ip.is_global and not ip.is_multicast


async def resolve_public(host: str, port: int, *, timeout_s: float = 5.0) -> list[str]:
    """The addresses ``host`` resolves to, all of them public; :class:`TargetRefused` otherwise."""
    try:
        addresses = [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout=timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise TargetRefused(f"host {host!r} does not resolve") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise TargetRefused(f"host {host!r} does not resolve")
    if not all(is_public_address(a) for a in addresses):
        raise TargetRefused("url resolves to a loopback, private or link-local address")
    return addresses


def refusal(exc: TargetRefused, setting: str) -> str:
    """The refusal, naming the operator's setting that allows private addresses when that was why."""
    reason = str(exc)
    if "private" in reason:
        reason += f" (an operator who means it allows private addresses with {setting}=true)"
    return reason


async def check_target(url: str, *, allow_private: bool) -> None:
    """Create-time check of an endpoint URL (syntax is checked by the caller)."""
    if allow_private:
        return
    parts = urlsplit(url)
    await resolve_public(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))


# --- endpoints ----------------------------------------------------------------------------------------

Sessions = async_sessionmaker[AsyncSession]
SECRET_PREFIX = "whsec_"
MAX_URL_CHARS = 2048
#: Deliveries shown with an endpoint, newest first.
MAX_DELIVERIES_SHOWN = 500


@dataclass(frozen=True)
class CreatedEndpoint:
    endpoint: WebhookEndpoint
    #: The plaintext signing secret: shown once, never stored in the clear.
    secret: str


def validate_url(url: object) -> str:
    if not isinstance(url, str) or not url.strip():
        raise errors.ValidationFailed.field("url", "is required")
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise errors.ValidationFailed.field("url", f"must be at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise errors.ValidationFailed.field("url", "is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise errors.ValidationFailed.field("url", "must be an absolute http or https URL")
    if not parts.hostname:
        raise errors.ValidationFailed.field("url", "must name a host")
    return url


def validate_events(events: object) -> list[str]:
    if events is None:
        return []
    if not isinstance(events, list):
        raise errors.ValidationFailed.field("events", "must be a list of action names")
    chosen: list[str] = []
    for index, action in enumerate(events):
        if not isinstance(action, str) or action not in ACTION_SET:
            raise errors.ValidationFailed.field(f"events[{index}]", f"unknown action {action!r}")
        if action not in chosen:
            chosen.append(action)
    return chosen


async def create_endpoint(
    sessions: Sessions,
    secret_box: SecretBox,
    *,
    user_id: str,
    url: object,
    events: object,
    allow_private: bool,
) -> CreatedEndpoint:
    """Validate, check the plan's endpoint maximum, store the secret sealed; the secret is returned once."""
    url = validate_url(url)
    chosen = validate_events(events)
    try:
        await check_target(url, allow_private=allow_private)
    except TargetRefused as exc:
        raise errors.ValidationFailed.field(
            "url", refusal(exc, "PADDOCK_CP_WEBHOOK_ALLOW_PRIVATE_TARGETS")
        ) from None
    secret = SECRET_PREFIX + secrets.token_hex(32)
    async with transaction(sessions) as session:
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        if plan.webhook_endpoints is not None:
            count = await session.scalar(
                select(func.count()).select_from(WebhookEndpoint).where(WebhookEndpoint.user_id == user_id)
            )
            if int(count or 0) >= plan.webhook_endpoints:
                raise errors.QuotaExceeded(
                    f"your plan allows {plan.webhook_endpoints} webhook endpoints; delete one first"
                )
        endpoint = WebhookEndpoint(
            id=new_id("wh_"),
            user_id=user_id,
            url=url,
            secret_sealed=secret_box.seal(secret),
            events=chosen,
            active=True,
            failure_count=0,
            created_at=utcnow(),
        )
        session.add(endpoint)
    return CreatedEndpoint(endpoint=endpoint, secret=secret)


async def list_endpoints(
    session: AsyncSession, user_id: str, *, limit: int, offset: int
) -> tuple[list[WebhookEndpoint], int]:
    mine = WebhookEndpoint.user_id == user_id
    total = await session.scalar(select(func.count()).select_from(WebhookEndpoint).where(mine))
    rows = await session.scalars(
        select(WebhookEndpoint)
        .where(mine)
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
        .limit(limit)
        .offset(offset)
    )
    return list(rows.all()), int(total or 0)


async def get_endpoint(session: AsyncSession, user_id: str, endpoint_id: str) -> WebhookEndpoint:
    endpoint = await session.get(WebhookEndpoint, endpoint_id)
    if endpoint is None or endpoint.user_id != user_id:
        raise errors.NotFound("webhook endpoint not found")
    return endpoint


async def endpoint_with_deliveries(
    session: AsyncSession, user_id: str, endpoint_id: str
) -> tuple[WebhookEndpoint, list[WebhookDelivery]]:
    endpoint = await get_endpoint(session, user_id, endpoint_id)
    deliveries = await session.scalars(
        select(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint.id)
        .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
        .limit(MAX_DELIVERIES_SHOWN)
    )
    return endpoint, list(deliveries.all())


async def set_active(sessions: Sessions, user_id: str, endpoint_id: str, *, active: bool) -> WebhookEndpoint:
    """Suspend (``active=False``) or resume; resume resets ``failureCount``. Both are idempotent."""
    async with transaction(sessions) as session:
        endpoint = await get_endpoint(session, user_id, endpoint_id)
        values: dict[str, Any] = {"active": active}
        if active:
            values["failure_count"] = 0
            await _announce(session)  # held deliveries are due again
        await session.execute(
            update(WebhookEndpoint).where(WebhookEndpoint.id == endpoint.id).values(**values)
        )
        await session.refresh(endpoint)
    return endpoint


async def delete_endpoint(sessions: Sessions, user_id: str, endpoint_id: str) -> None:
    """Delete the endpoint and every delivery of it, at once."""
    async with transaction(sessions) as session:
        endpoint = await get_endpoint(session, user_id, endpoint_id)
        await session.execute(delete(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id))
        await session.execute(delete(WebhookEndpoint).where(WebhookEndpoint.id == endpoint.id))


# --- wire views (camelCase, §10.16) ---------------------------------------------------------------


def endpoint_view(endpoint: WebhookEndpoint, *, secret: str | None = None) -> dict[str, Any]:
    view: dict[str, Any] = {"id": endpoint.id, "url": endpoint.url}
    if secret is not None:
        view["secret"] = secret
    view.update(
        events=list(endpoint.events or []),
        active=bool(endpoint.active),
        failureCount=int(endpoint.failure_count),
        createdAt=rfc3339(endpoint.created_at),
        userId=endpoint.user_id,
    )
    return view


def delivery_view(delivery: WebhookDelivery) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": delivery.id,
        "endpointId": delivery.endpoint_id,
        "eventAction": delivery.event_action,
        "status": delivery.status,
        "attempts": int(delivery.attempts),
        "deliveredAt": rfc3339(delivery.delivered_at) if delivery.delivered_at else None,
        "lastError": delivery.last_error,
        "createdAt": rfc3339(delivery.created_at),
        "payload": json.loads(delivery.payload),
    }
    if delivery.status == "pending":
        view["nextAttemptAt"] = rfc3339(delivery.next_attempt_at)
    return view
