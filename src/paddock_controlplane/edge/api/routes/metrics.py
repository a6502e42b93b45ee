"""Metrics routes (§12.5, issue #35): a sandbox's resource samples, and its account's totals.

``GET /v1/sandboxes/{id}/metrics?window_s=`` answers the newest sample kept and the samples of the last
``window_s`` seconds (raw, every ``metrics_interval_s``, for windows up to an hour; one-minute rollups
beyond); ``GET /v1/metrics`` the account's totals over its running sandboxes' newest samples, and
``GET /v1/metrics/timeseries?window_s=`` those sums at each instant of the window. docs/observability.md
has the shapes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from paddock_controlplane.edge.api.deps import PrincipalDep, SandboxPrincipalDep, ServicesDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute
from paddock_controlplane.records import queries, sandbox_metrics
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.states import SandboxStatus
from paddock_core import envelope

router = APIRouter(tags=["metrics"], route_class=BoundaryRoute)

DEFAULT_WINDOW_S = 300
WindowQuery = Annotated[
    int,
    Query(
        ge=1,
        le=sandbox_metrics.ROLLUP_RETENTION_S,
        description="seconds of history, up to a day (default 300); raw samples up to an hour, "
        "one-minute averages beyond",
    ),
]


def _seconds(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


@router.get("/v1/sandboxes/{sandbox_id}/metrics")
async def sandbox_metrics_route(
    sandbox_id: str,
    principal: SandboxPrincipalDep,
    services: ServicesDep,
    window_s: WindowQuery = DEFAULT_WINDOW_S,
) -> dict[str, Any]:
    async with services.sessions() as session:
        await queries.get_owned(session, principal.user_id, sandbox_id)  # 404 for anyone else's
        interval_s, latest, samples = await sandbox_metrics.window(
            session, sandbox_id, services.clock(), window_s, services.settings.metrics_interval_s
        )
    return envelope.success(
        {
            "sandbox_id": sandbox_id,
            "interval_s": _seconds(interval_s),
            "latest": sandbox_metrics.sample_view(latest) if latest is not None else None,
            "samples": [sandbox_metrics.sample_view(row) for row in samples],
        }
    )


@router.get("/v1/metrics")
async def account_metrics(principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    interval_s = services.settings.metrics_interval_s
    async with services.sessions() as session:
        running = (
            await session.scalars(
                select(Sandbox.id).where(
                    Sandbox.user_id == principal.user_id, Sandbox.status == SandboxStatus.RUNNING
                )
            )
        ).all()
        totals = await sandbox_metrics.account_now(
            session,
            principal.user_id,
            list(running),
            services.clock(),
            fresh_s=sandbox_metrics.fresh_s(interval_s),
        )
    return envelope.success({"interval_s": _seconds(interval_s), **totals})


@router.get("/v1/metrics/timeseries")
async def account_timeseries(
    principal: PrincipalDep, services: ServicesDep, window_s: WindowQuery = DEFAULT_WINDOW_S
) -> dict[str, Any]:
    async with services.sessions() as session:
        interval_s, points = await sandbox_metrics.account_series(
            session, principal.user_id, services.clock(), window_s, services.settings.metrics_interval_s
        )
    return envelope.success({"interval_s": _seconds(interval_s), "samples": points})
