"""Webhook endpoint routes (§11.14): parse, call one domain function, render the camelCase view."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from paddock_controlplane.edge.api.deps import PageDep, PrincipalDep, ServicesDep, SessionDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute
from paddock_controlplane.records.schemas.webhooks import CreateEndpointRequest
from paddock_controlplane.resources import webhooks
from paddock_core import envelope

router = APIRouter(prefix="/v1/webhook-endpoints", tags=["webhooks"], route_class=BoundaryRoute)


def mark(request: Request, endpoint_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = endpoint_id


@router.get("/actions")
async def actions(_: PrincipalDep) -> dict[str, Any]:
    return envelope.success(list(webhooks.ACTIONS))


@router.post("")
async def create(
    body: CreateEndpointRequest, principal: PrincipalDep, services: ServicesDep, request: Request
) -> dict[str, Any]:
    created = await webhooks.create_endpoint(
        services.sessions,
        services.secret_box,
        user_id=principal.user_id,
        url=body.url,
        events=body.events,
        allow_private=services.settings.webhook_allow_private_targets,
    )
    mark(request, created.endpoint.id)
    return envelope.success(webhooks.endpoint_view(created.endpoint, secret=created.secret))


@router.get("")
async def list_endpoints(principal: PrincipalDep, session: SessionDep, page: PageDep) -> dict[str, Any]:
    rows, total = await webhooks.list_endpoints(
        session, principal.user_id, limit=page.limit, offset=page.offset
    )
    items = [webhooks.endpoint_view(row) for row in rows]
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.get("/{endpoint_id}")
async def get_endpoint(
    endpoint_id: str, principal: PrincipalDep, session: SessionDep, request: Request
) -> dict[str, Any]:
    mark(request, endpoint_id)
    endpoint, deliveries = await webhooks.endpoint_with_deliveries(session, principal.user_id, endpoint_id)
    return envelope.success(
        {
            "endpoint": webhooks.endpoint_view(endpoint),
            "deliveries": [webhooks.delivery_view(d) for d in deliveries],
        }
    )


@router.post("/{endpoint_id}/suspend")
async def suspend(
    endpoint_id: str, principal: PrincipalDep, services: ServicesDep, request: Request
) -> dict[str, Any]:
    mark(request, endpoint_id)
    endpoint = await webhooks.set_active(services.sessions, principal.user_id, endpoint_id, active=False)
    return envelope.success(webhooks.endpoint_view(endpoint))


@router.post("/{endpoint_id}/resume")
async def resume(
    endpoint_id: str, principal: PrincipalDep, services: ServicesDep, request: Request
) -> dict[str, Any]:
    mark(request, endpoint_id)
    endpoint = await webhooks.set_active(services.sessions, principal.user_id, endpoint_id, active=True)
    return envelope.success(webhooks.endpoint_view(endpoint))


@router.delete("/{endpoint_id}")
async def delete(
    endpoint_id: str, principal: PrincipalDep, services: ServicesDep, request: Request
) -> dict[str, Any]:
    mark(request, endpoint_id)
    await webhooks.delete_endpoint(services.sessions, principal.user_id, endpoint_id)
    return envelope.success({"deleted": True})
