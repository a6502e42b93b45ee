"""Network routes (§11.10 attach/detach, §11.12 CRUD): parse, call one domain function, render."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from paddock_controlplane.edge.api.deps import PageDep, PrincipalDep, ServicesDep, SessionDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records.schemas.networks import NetworkAttachRequest, NetworkCreateRequest
from paddock_controlplane.resources import networks
from paddock_core import envelope

router = APIRouter(tags=["networks"], route_class=BoundaryRoute)


def mark(request: Request, resource_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = resource_id


@router.post("/v1/networks")
async def create(request: Request, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    body = await optional_body(request, NetworkCreateRequest)
    created = await networks.create(services, principal.user_id, body.name)
    mark(request, created["id"])
    return envelope.success(created)


@router.get("/v1/networks")
async def list_networks(principal: PrincipalDep, session: SessionDep, page: PageDep) -> dict[str, Any]:
    items, total = await networks.page(session, principal.user_id, limit=page.limit, offset=page.offset)
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.get("/v1/networks/{network_id}")
async def get(
    network_id: str, request: Request, principal: PrincipalDep, session: SessionDep
) -> dict[str, Any]:
    mark(request, network_id)
    return envelope.success(await networks.detail(session, principal.user_id, network_id))


@router.delete("/v1/networks/{network_id}")
async def delete(
    network_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, network_id)
    await networks.delete_network(services, principal.user_id, network_id)
    return envelope.success({"ok": True})


@router.post("/v1/sandboxes/{sandbox_id}/networks")
async def attach(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    body = await optional_body(request, NetworkAttachRequest)
    await networks.attach(services, principal.user_id, sandbox_id, body.id)
    return envelope.success({"ok": True})


@router.delete("/v1/sandboxes/{sandbox_id}/networks/{network_id}")
async def detach(
    sandbox_id: str, network_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    await networks.detach(services, principal.user_id, sandbox_id, network_id)
    return envelope.success({"ok": True})
