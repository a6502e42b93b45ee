"""A sandbox's audit trail (issue #35, docs/audit.md): ``GET /v1/sandboxes/{id}/audit``.

A page of events, oldest first (``order=newest``: newest first), filtered by ``kind`` (comma-separated), ``since`` and ``until``
(RFC 3339), ``limit`` events (at most ``MAX_LIMIT``) after ``cursor``; or, with ``format=jsonl`` or
``Accept: application/x-ndjson``, every matching event as JSON lines. The owner's account key only (a
delegated access token is refused like on every account-level route): the trail is how an owner
watches what an agent holding the sandbox's token did. It stays readable after the sandbox is
destroyed, until retention removes it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import select

from paddock_controlplane.edge.api.deps import PrincipalDep, ServicesDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute
from paddock_controlplane.records import audit
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_core import envelope, errors
from paddock_core.timeutil import as_utc

router = APIRouter(prefix="/v1/sandboxes", tags=["audit"], route_class=BoundaryRoute)

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: Kinds a client may ask for (``dropped`` markers come with any filter that asks for them).
KINDS = audit.KINDS
FORMATS = ("json", "jsonl")
#: A page's order: ``oldest`` first (the default) or ``newest`` first (what the console shows).
ORDERS = ("oldest", "newest")
NDJSON = "application/x-ndjson"
#: Events read per query while exporting.
EXPORT_PAGE = 1000


def _kinds(raw: str | None) -> tuple[str, ...]:
    if raw is None or raw == "":
        return ()
    kinds = tuple(dict.fromkeys(part.strip() for part in raw.split(",")))
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or len(kinds) > len(KINDS):
        raise errors.ValidationFailed.field(
            "kind", f"must be one or more of {', '.join(KINDS)}, comma-separated"
        )
    return kinds


def _instant(name: str, raw: str | None) -> dt.datetime | None:
    if raw is None or raw == "":
        return None
    try:
        value = dt.datetime.fromisoformat(raw) if len(raw) <= 64 else None
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise errors.ValidationFailed.field(
            name, "must be an RFC 3339 time with a zone, e.g. 2026-01-02T03:04:05Z"
        )
    try:
        return as_utc(value)
    except (OverflowError, ValueError):
        raise errors.ValidationFailed.field(name, "is out of range") from None


def _limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18 or int(raw) < 1:
        raise errors.ValidationFailed.field(
            "limit", f"must be an integer from 1 (above {MAX_LIMIT} is clamped)"
        )
    return min(int(raw), MAX_LIMIT)


def _cursor(raw: str | None) -> audit.Cursor | None:
    if raw is None or raw == "":
        return None
    try:
        return audit.Cursor.decode(raw) if len(raw) <= 200 else audit.Cursor.decode("")
    except (ValueError, OverflowError):
        raise errors.ValidationFailed.field("cursor", "is not a cursor this server returned") from None


def _newest_first(raw: str | None, answer: str) -> bool:
    if raw is None or raw == "":
        return False
    if raw not in ORDERS:
        raise errors.ValidationFailed.field("order", f"must be one of {', '.join(ORDERS)}")
    if raw == "newest" and answer == "jsonl":
        raise errors.ValidationFailed.field("order", "the JSON lines export is oldest first only")
    return raw == "newest"


def _format(request: Request) -> str:
    raw = request.query_params.get("format")
    if raw is None or raw == "":
        return "jsonl" if NDJSON in request.headers.get("accept", "") else "json"
    if raw not in FORMATS:
        raise errors.ValidationFailed.field("format", f"must be one of {', '.join(FORMATS)}")
    return raw


async def _visible(services: Services, sandbox_id: str, user_id: str) -> None:
    """404 unless the caller owns the sandbox, or owned it and its row is gone but its trail is not."""
    async with services.sessions() as session:
        owner = await session.scalar(select(Sandbox.user_id).where(Sandbox.id == sandbox_id))
        if owner is None:
            seen = await audit.has_events(session, sandbox_id, user_id)
        else:
            seen = owner == user_id
    if not seen:
        raise errors.NotFound("sandbox not found")


@router.get("/{sandbox_id}/audit", response_model=None)
async def get_audit(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse | StreamingResponse:
    params = request.query_params
    kinds = _kinds(params.get("kind"))
    since, until = _instant("since", params.get("since")), _instant("until", params.get("until"))
    limit, after, answer = _limit(params.get("limit")), _cursor(params.get("cursor")), _format(request)
    newest_first = _newest_first(params.get("order"), answer)
    await _visible(services, sandbox_id, principal.user_id)
    # What is still queued in this process goes in first, so a trail read just after an action shows it.
    await services.audit.flush_now()
    if answer == "jsonl":
        lines = _export(services, sandbox_id, principal.user_id, kinds, since, until, after)
        return StreamingResponse(lines, media_type=NDJSON, headers={"Cache-Control": "no-store"})
    async with services.sessions() as session:
        rows, following = await audit.page(
            session,
            sandbox_id,
            principal.user_id,
            kinds=kinds,
            since=since,
            until=until,
            after=after,
            limit=limit,
            newest_first=newest_first,
        )
    pagination: dict[str, Any] = {"limit": limit, "count": len(rows), "next_cursor": None}
    if following is not None:
        pagination["next_cursor"] = following.encode()
    return JSONResponse(
        envelope.success({"items": [audit.view(row) for row in rows], "pagination": pagination})
    )


async def _export(
    services: Services,
    sandbox_id: str,
    user_id: str,
    kinds: tuple[str, ...],
    since: dt.datetime | None,
    until: dt.datetime | None,
    after: audit.Cursor | None,
) -> AsyncIterator[bytes]:
    while True:
        async with services.sessions() as session:
            rows, after = await audit.page(
                session,
                sandbox_id,
                user_id,
                kinds=kinds,
                since=since,
                until=until,
                after=after,
                limit=EXPORT_PAGE,
            )
        if rows:
            yield b"".join(
                json.dumps(audit.view(row), ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
                for row in rows
            )
        if after is None:
            return
