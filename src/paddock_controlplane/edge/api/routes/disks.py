"""Disk routes (§11.10 attach/detach/list, §11.11 CRUD): parse, call one domain function, render."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from paddock_controlplane.edge.api.deps import (
    PageDep,
    PrincipalDep,
    SandboxPrincipalDep,
    ServicesDep,
    SessionDep,
)
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records.schemas.disks import DiskAttachment, DiskCreateRequest, DiskPatchRequest
from paddock_controlplane.resources import disks
from paddock_core import envelope

router = APIRouter(tags=["disks"], route_class=BoundaryRoute)


def mark(request: Request, resource_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = resource_id


@router.post("/v1/disks")
async def create(request: Request, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    body = await optional_body(request, DiskCreateRequest)
    created = await disks.create(services, principal.user_id, body)
    mark(request, created["id"])
    return envelope.success(created)


@router.get("/v1/disks")
async def list_disks(principal: PrincipalDep, session: SessionDep, page: PageDep) -> dict[str, Any]:
    items, total = await disks.page(session, principal.user_id, limit=page.limit, offset=page.offset)
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.get("/v1/disks/{ref}")
async def get(ref: str, request: Request, principal: PrincipalDep, session: SessionDep) -> dict[str, Any]:
    mark(request, ref)
    return envelope.success(await disks.detail(session, principal.user_id, ref))


@router.patch("/v1/disks/{ref}")
async def rotate(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, ref)
    body = await optional_body(request, DiskPatchRequest)
    return envelope.success(await disks.rotate(services, principal.user_id, ref, body))


@router.delete("/v1/disks/{ref}")
async def delete(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, ref)
    await disks.delete_disk(services, principal.user_id, ref)
    return envelope.success({"deleted": True})


@router.get("/v1/sandboxes/{sandbox_id}/disks")
async def list_attached(
    sandbox_id: str,
    request: Request,
    principal: SandboxPrincipalDep,  # a delegated token may read its own sandbox's disks (§12.1)
    session: SessionDep,
    page: PageDep,
) -> dict[str, Any]:
    mark(request, sandbox_id)
    items, total = await disks.sandbox_page(
        session, principal.user_id, sandbox_id, limit=page.limit, offset=page.offset
    )
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.post("/v1/sandboxes/{sandbox_id}/disks")
async def attach(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    body = await optional_body(request, DiskAttachment)
    return envelope.success(await disks.attach(services, principal.user_id, sandbox_id, body))


@router.delete("/v1/sandboxes/{sandbox_id}/disks/{disk_id}")
async def detach(
    sandbox_id: str,
    disk_id: str,
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    mount_path: str | None = None,
) -> dict[str, Any]:
    mark(request, sandbox_id)
    await disks.detach(services, principal.user_id, sandbox_id, disk_id, mount_path)
    return envelope.success({"detached": True})
