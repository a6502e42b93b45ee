"""Template routes (§11.13): parse, call one domain function, render. The build log is NDJSON."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from paddock_controlplane.edge.api.deps import PageDep, PrincipalDep, ServicesDep, SessionDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records.schemas.templates import TemplateCreateRequest
from paddock_controlplane.resources import templates
from paddock_core import envelope, errors

router = APIRouter(tags=["templates"], route_class=BoundaryRoute)
NDJSON = "application/x-ndjson"


def mark(request: Request, resource_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = resource_id


@router.post("/v1/templates")
async def create(request: Request, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    body = await optional_body(request, TemplateCreateRequest)
    created = await templates.create(services, principal.user_id, body)
    mark(request, created["id"])
    return envelope.success(created)


@router.get("/v1/templates")
async def list_templates(principal: PrincipalDep, session: SessionDep, page: PageDep) -> dict[str, Any]:
    items, total = await templates.page(session, principal.user_id, limit=page.limit, offset=page.offset)
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.get("/v1/templates/{ref}")
async def get(
    ref: str,
    request: Request,
    principal: PrincipalDep,
    session: SessionDep,
    include: Annotated[str | None, Query()] = None,
) -> dict[str, Any]:
    mark(request, ref)
    template = await templates.get_owned(session, principal.user_id, ref)
    wanted = {part.strip() for part in (include or "").split(",")}
    return envelope.success(templates.template_view(template, include_dockerfile="dockerfile" in wanted))


@router.delete("/v1/templates/{ref}")
async def delete(
    ref: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, ref)
    template = await templates.delete_template(services, principal.user_id, ref)
    await templates.forget(services, template)
    return envelope.success({"ok": True})


def _attempt(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1 or len(raw) > 9:
        raise errors.ValidationFailed.field("attempt", "must be a positive integer")
    return int(raw)


@router.get("/v1/templates/{ref}/logs")
async def logs(
    ref: str,
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    attempt: Annotated[str | None, Query()] = None,
    follow: Annotated[bool, Query()] = False,
) -> Response:
    mark(request, ref)
    wanted = _attempt(attempt)
    template = await templates.open_log(services, principal.user_id, ref, wanted)
    if follow:
        return StreamingResponse(templates.follow(services, template.id, wanted), media_type=NDJSON)
    return Response(await templates.log_text(services, template.id, wanted), media_type=NDJSON)
