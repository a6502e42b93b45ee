"""Delegated sandbox access tokens (§12.1): create, read, rotate and disable a sandbox's token; and a
live sandbox found by its name, which a token may ask for its own sandbox.

Only the owner's account key manages a token (``PrincipalDep``: a token itself gets 403, even on its
own sandbox). The plaintext is in the create and rotate answers only.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import select

from paddock_controlplane.edge.api.deps import CallerDep, PrincipalDep, ServicesDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records import views
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.schemas.access_tokens import AccessTokenRequest
from paddock_controlplane.records.states import TERMINAL
from paddock_controlplane.resources import access_tokens
from paddock_core import envelope, errors

router = APIRouter(tags=["access tokens"], route_class=BoundaryRoute)


def mark(request: Request, sandbox_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = sandbox_id


@router.get("/by-name/{name}")
async def by_name(name: str, request: Request, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    """The caller's live sandbox of that name (the newest, should two share it), as GET /{id} shows it.
    An extension of the contract: an account key finds any of its sandboxes, a sandbox access token
    only its own (404 for any other, as for an id), so a token can name its sandbox as the owner does."""
    if len(name) > 256:
        raise errors.ValidationFailed.field("name", "must be at most 256 characters")
    query = select(Sandbox).where(
        Sandbox.user_id == caller.user_id, Sandbox.name == name, Sandbox.status.not_in(TERMINAL)
    )
    if caller.sandbox_id is not None:
        query = query.where(Sandbox.id == caller.sandbox_id)
    async with services.sessions() as session:
        sandbox = (await session.scalars(query.order_by(Sandbox.created_at.desc()).limit(1))).first()
    if sandbox is None:
        raise errors.NotFound(f"no live sandbox named {name!r}")
    mark(request, sandbox.id)
    s = services.settings
    return envelope.success(views.sandbox_view(sandbox, scheme=s.ingress_scheme, domain=s.ingress_url_domain))


@router.post("/{sandbox_id}/access-token")
async def create(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    body = await optional_body(request, AccessTokenRequest)
    issued = await access_tokens.create(services, principal.user_id, sandbox_id, body.expires_in_seconds)
    return envelope.success(access_tokens.view(issued.row, services.clock(), issued.plaintext))


@router.get("/{sandbox_id}/access-token")
async def describe(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    return envelope.success(await access_tokens.describe(services, principal.user_id, sandbox_id))


@router.post("/{sandbox_id}/access-token/rotate")
async def rotate(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    body = await optional_body(request, AccessTokenRequest)
    issued = await access_tokens.rotate(services, principal.user_id, sandbox_id, body.expires_in_seconds)
    return envelope.success(access_tokens.view(issued.row, services.clock(), issued.plaintext))


@router.delete("/{sandbox_id}/access-token")
async def disable(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    row = await access_tokens.disable(services, principal.user_id, sandbox_id)
    return envelope.success({**access_tokens.view(row, services.clock()), "enabled": False})
