"""Volume routes (issue #34, docs/volumes.md): CRUD and resize of local persistent volumes, and their
attachment to sandboxes. Parse, call one domain function, render."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from paddock_controlplane.edge.api.deps import PageDep, PrincipalDep, ServicesDep, SessionDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records.schemas.volumes import (
    VolumeAttachment,
    VolumeCreateRequest,
    VolumeResizeRequest,
)
from paddock_controlplane.resources import volumes
from paddock_core import envelope

router = APIRouter(tags=["volumes"], route_class=BoundaryRoute)


def mark(request: Request, resource_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = resource_id


@router.post("/v1/volumes")
async def create(request: Request, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    body = await optional_body(request, VolumeCreateRequest)
    created = await volumes.create(services, principal.user_id, body)
    mark(request, created["id"])
    return envelope.success(created)


@router.get("/v1/volumes")
async def list_volumes(principal: PrincipalDep, session: SessionDep, page: PageDep) -> dict[str, Any]:
    items, total = await volumes.page(session, principal.user_id, limit=page.limit, offset=page.offset)
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.get("/v1/volumes/{ref}")
async def get(ref: str, request: Request, principal: PrincipalDep, session: SessionDep) -> dict[str, Any]:
    mark(request, ref)
    return envelope.success(await volumes.detail(session, principal.user_id, ref))


@router.patch("/v1/volumes/{ref}")
async def resize(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, ref)
    body = await optional_body(request, VolumeResizeRequest)
    return envelope.success(await volumes.resize(services, principal.user_id, ref, body))


@router.delete("/v1/volumes/{ref}")
async def delete(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, ref)
    await volumes.delete_volume(services, principal.user_id, ref)
    return envelope.success({"deleted": True})


@router.post("/v1/sandboxes/{sandbox_id}/volumes")
async def attach(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    body = await optional_body(request, VolumeAttachment)
    return envelope.success(await volumes.attach(services, principal.user_id, sandbox_id, body))


@router.delete("/v1/sandboxes/{sandbox_id}/volumes/{volume_id}")
async def detach(
    sandbox_id: str, volume_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    await volumes.detach(services, principal.user_id, sandbox_id, volume_id)
    return envelope.success({"detached": True})
