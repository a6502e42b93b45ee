"""Identity and catalog reads: whoami, shapes, rootfs, hosts (§11.2)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from paddock_controlplane.edge.api.deps import PageDep, PrincipalDep, ServicesDep, SessionDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute
from paddock_controlplane.hosts import hosts
from paddock_controlplane.resources import catalog, usage
from paddock_core import envelope

router = APIRouter(tags=["catalog"], route_class=BoundaryRoute)


@router.get("/v1/whoami")
async def whoami(principal: PrincipalDep, session: SessionDep) -> dict[str, Any]:
    return envelope.success(await usage.whoami(session, principal.user_id))


@router.get("/v1/shapes")
async def shapes(page: PageDep) -> dict[str, Any]:
    items = [shape.view() for shape in catalog.SHAPES]
    window = items[page.offset : page.offset + page.limit]
    return envelope.success(envelope.page(window, total=len(items), limit=page.limit, offset=page.offset))


@router.get("/v1/rootfs")
async def rootfs(session: SessionDep, services: ServicesDep) -> dict[str, Any]:
    available = await hosts.available_images(session)
    return envelope.success(catalog.rootfs_view(available, services.settings.default_rootfs))


@router.get("/v1/hosts")
async def list_hosts(_: PrincipalDep, session: SessionDep, page: PageDep) -> dict[str, Any]:
    rows, total = await hosts.list_hosts(session, limit=page.limit, offset=page.offset)
    return envelope.success(
        envelope.page([hosts.host_view(h) for h in rows], total=total, limit=page.limit, offset=page.offset)
    )
