"""Snapshot routes (issue #34, docs/snapshots.md): parse, call one domain function, render."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from paddock_controlplane.edge.api.deps import PageDep, PrincipalDep, ServicesDep, SessionDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records.schemas.snapshots import SnapshotCreateRequest
from paddock_controlplane.resources import snapshots
from paddock_core import envelope

router = APIRouter(tags=["snapshots"], route_class=BoundaryRoute)


def mark(request: Request, resource_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = resource_id


@router.post("/v1/sandboxes/{sandbox_id}/snapshots")
async def create(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    body = await optional_body(request, SnapshotCreateRequest)
    created = await snapshots.create(services, principal.user_id, sandbox_id, body)
    mark(request, created["id"])
    return envelope.success(created)


@router.get("/v1/snapshots")
async def list_snapshots(principal: PrincipalDep, session: SessionDep, page: PageDep) -> dict[str, Any]:
    items, total = await snapshots.page(session, principal.user_id, limit=page.limit, offset=page.offset)
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.get("/v1/snapshots/{ref}")
async def get(ref: str, request: Request, principal: PrincipalDep, session: SessionDep) -> dict[str, Any]:
    mark(request, ref)
    return envelope.success(await snapshots.detail(session, principal.user_id, ref))


@router.delete("/v1/snapshots/{ref}")
async def delete(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, ref)
    await snapshots.delete_snapshot(services, principal.user_id, ref)
    return envelope.success({"ok": True})
