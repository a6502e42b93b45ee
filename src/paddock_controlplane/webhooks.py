"""Webhook endpoints and the event outbox (§10.16, §11.14, §11.15).

:func:`emit` records an action inside the caller's transaction: one ``pending`` delivery per matching
active endpoint, with the exact body bytes fixed at that moment. The state change and its deliveries
commit or roll back together, so a process that dies between the two can neither lose nor invent an
event. :mod:`paddock_controlplane.webhook_delivery` sends them.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.models import WebhookDelivery, WebhookEndpoint
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
    rows = (
        await session.execute(
            select(WebhookEndpoint.id, WebhookEndpoint.events).where(
                WebhookEndpoint.user_id == user_id, WebhookEndpoint.active.is_(True)
            )
        )
    ).all()
    targets = [row.id for row in rows if subscribed(row.events, action)]
    if not targets:
        return
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
