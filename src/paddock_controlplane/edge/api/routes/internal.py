"""Routes host agents and operators call, authenticated by the shared host token: heartbeat
registration, and draining a host (``paddock admin host drain`` does the same against the database)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from paddock_controlplane.edge.api.deps import HostAuthDep, ServicesDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute
from paddock_controlplane.hosts import hosts
from paddock_controlplane.records.schemas.hosts import Heartbeat
from paddock_core.db import transaction

router = APIRouter(
    prefix="/internal/v1", tags=["internal"], include_in_schema=False, route_class=BoundaryRoute
)


@router.post("/hosts/heartbeat")
async def heartbeat(beat: Heartbeat, _: HostAuthDep, services: ServicesDep) -> dict[str, Any]:
    body = beat.model_dump()
    async with transaction(services.sessions) as session:
        await hosts.record_heartbeat(session, body, services.clock())
        overlay = await hosts.overlay_peers(session, beat.id)
    answer: dict[str, Any] = {"ok": True, "overlay": overlay}
    if services.on_heartbeat is not None:
        answer.update(await services.on_heartbeat(body) or {})
    return answer


@router.post("/hosts/{host_id}/drain")
async def drain_host(host_id: str, _: HostAuthDep, services: ServicesDep) -> dict[str, Any]:
    """No new placements on the host; its sandboxes keep running. ``DELETE`` puts it back in service."""
    async with transaction(services.sessions) as session:
        host = await hosts.set_drained(session, host_id, True)
        return hosts.host_view(host)


@router.delete("/hosts/{host_id}/drain")
async def undrain_host(host_id: str, _: HostAuthDep, services: ServicesDep) -> dict[str, Any]:
    async with transaction(services.sessions) as session:
        host = await hosts.set_drained(session, host_id, False)
        return hosts.host_view(host)
