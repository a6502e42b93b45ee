"""Liveness and readiness (§11.1). Public; liveness touches nothing."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from paddock_controlplane.edge.api.deps import ServicesDep
from paddock_core import envelope
from paddock_core.db import ping

router = APIRouter(tags=["probes"])
READY_WINDOW_S = 30.0


@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    return envelope.success({"up": True})


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    state: dict[str, Any] = {"ready": True}
    if services.reconciler_last_ok is not None:
        state["scheduler_last_ok_ms_ago"] = int((time.monotonic() - services.reconciler_last_ok) * 1000)
    try:
        await ping(services.engine)
    except Exception:
        state.update(ready=False, reason="database unavailable")
    else:
        age_ms = state.get("scheduler_last_ok_ms_ago")
        if age_ms is None:
            state.update(ready=False, reason="scheduler has not completed a pass yet")
        elif age_ms > READY_WINDOW_S * 1000:
            state.update(ready=False, reason="scheduler pass is stale")
    if state["ready"]:
        return JSONResponse(envelope.success(state))
    return JSONResponse({"status": "fail", "data": state}, status_code=503)
