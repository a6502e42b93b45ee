"""Volume routes (issue #34, docs/volumes.md): CRUD and resize of local persistent volumes, their files
without a sandbox (``resources/volume_files.py``), and their attachment to sandboxes. Parse, call one
domain function, render."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from paddock_controlplane.edge.api.deps import PageDep, PrincipalDep, ServicesDep, SessionDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records import validation
from paddock_controlplane.records.schemas.volumes import (
    VolumeAttachment,
    VolumeCreateRequest,
    VolumeResizeRequest,
)
from paddock_controlplane.resources import volume_files, volumes
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


# -- a volume's files, without a sandbox ---------------------------------------------------------


def _path(request: Request) -> str:
    return validation.guest_path(request.query_params.get("path"))  # a 400 naming ``path``


@router.get("/v1/volumes/{ref}/files/list")
async def list_files(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    mark(request, ref)
    depth = validation.listing_depth(request.query_params.get("depth"), volume_files.MAX_DEPTH)
    listed = await volume_files.list_dir(services, principal.user_id, ref, _path(request), depth)
    return JSONResponse(envelope.success(listed))


@router.get("/v1/volumes/{ref}/files/stat")
async def stat_file(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    mark(request, ref)
    return JSONResponse(
        envelope.success(await volume_files.stat_path(services, principal.user_id, ref, _path(request)))
    )


@router.post("/v1/volumes/{ref}/files/mkdir")
async def make_dir(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    mark(request, ref)
    return JSONResponse(
        envelope.success(await volume_files.make_dir(services, principal.user_id, ref, _path(request)))
    )


@router.put("/v1/volumes/{ref}/files")
async def put_file(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    mark(request, ref)
    path = _path(request)
    data = await request.body()  # bounded by BODY_ROUTES (VOLUME_FILE_BYTES)
    return JSONResponse(
        envelope.success(await volume_files.write(services, principal.user_id, ref, path, data))
    )


@router.get("/v1/volumes/{ref}/files", response_model=None)
async def get_file(ref: str, request: Request, principal: PrincipalDep, services: ServicesDep) -> Response:
    mark(request, ref)
    data = await volume_files.read(services, principal.user_id, ref, _path(request))
    return Response(data, media_type="application/octet-stream")


@router.delete("/v1/volumes/{ref}/files")
async def remove_file(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    mark(request, ref)
    path = _path(request)
    await volume_files.remove(services, principal.user_id, ref, path)
    return JSONResponse(envelope.success({"path": path, "removed": True}))


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
