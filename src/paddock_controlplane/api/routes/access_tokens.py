"""Delegated sandbox access tokens (§12.1): create, read, rotate and disable a sandbox's token.

Only the owner's account key manages a token (``PrincipalDep``: a token itself gets 403, even on its
own sandbox). The plaintext is in the create and rotate answers only.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from paddock_controlplane import access_tokens
from paddock_controlplane.api.deps import PrincipalDep, ServicesDep
from paddock_controlplane.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.schemas import AccessTokenRequest
from paddock_core import envelope

router = APIRouter(tags=["access tokens"], route_class=BoundaryRoute)


def mark(request: Request, sandbox_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = sandbox_id


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
