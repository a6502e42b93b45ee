"""Routes host agents call: heartbeat registration. Authenticated by the shared host token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from paddock_controlplane import hosts
from paddock_controlplane.api.deps import HostAuthDep, ServicesDep
from paddock_controlplane.api.routes.bodies import BoundaryRoute
from paddock_core.db import transaction

router = APIRouter(
    prefix="/internal/v1", tags=["internal"], include_in_schema=False, route_class=BoundaryRoute
)


class Heartbeat(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    url: str = Field(min_length=1, max_length=300)
    status: str = "active"
    free_mib: int = 0
    total_mib: int = 0
    vm_count: int = 0
    rootfses: list[str] = []
    buildable: list[str] = []
    labels: dict[str, str] = {}
    sandboxes: list[dict[str, Any]] = []


@router.post("/hosts/heartbeat")
async def heartbeat(beat: Heartbeat, _: HostAuthDep, services: ServicesDep) -> dict[str, Any]:
    async with transaction(services.sessions) as session:
        await hosts.record_heartbeat(session, beat.model_dump(), services.clock())
    if services.on_heartbeat is not None:
        await services.on_heartbeat(beat.model_dump())
    return {"ok": True}
