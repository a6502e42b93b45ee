"""Managed processes (§12.2): ``/v1/sandboxes/{id}/processes…``. The connect stream is NDJSON.

Every route takes ``SandboxPrincipalDep``: §12.1 lets a sandbox's delegated access token drive its
processes (and answers 404 for any other sandbox's)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from paddock_controlplane.edge.api.deps import SandboxPrincipalDep, ServicesDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records.schemas.processes import (
    ProcessInputRequest,
    ProcessResizeRequest,
    ProcessSignalRequest,
    ProcessStartRequest,
)
from paddock_controlplane.sandboxes import processes
from paddock_core import envelope

router = APIRouter(prefix="/v1/sandboxes", tags=["processes"], route_class=BoundaryRoute)
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _ok(data: object) -> JSONResponse:
    return JSONResponse(envelope.success(data))


@router.post("/{sandbox_id}/processes")
async def start_process(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    body = await optional_body(request, ProcessStartRequest)
    started = await processes.start(services, principal.user_id, sandbox_id, body)
    return _ok(processes.view(started))


@router.get("/{sandbox_id}/processes")
async def list_processes(
    sandbox_id: str, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    found = await processes.list_all(services, principal.user_id, sandbox_id)
    return _ok({"processes": [processes.view(process) for process in found]})


@router.get("/{sandbox_id}/processes/{process_id}")
async def get_process(
    sandbox_id: str, process_id: str, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    return _ok(processes.view(await processes.get(services, principal.user_id, sandbox_id, process_id)))


@router.delete("/{sandbox_id}/processes/{process_id}")
async def kill_process(
    sandbox_id: str,
    process_id: str,
    principal: SandboxPrincipalDep,
    services: ServicesDep,
    grace_ms: Annotated[int, Query(ge=0, le=processes.MAX_GRACE_MS)] = 5000,
) -> JSONResponse:
    killed = await processes.kill(services, principal.user_id, sandbox_id, process_id, grace_ms)
    return _ok(processes.view(killed))


@router.get("/{sandbox_id}/processes/{process_id}/connect", response_model=None)
async def connect_process(
    sandbox_id: str,
    process_id: str,
    principal: SandboxPrincipalDep,
    services: ServicesDep,
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> StreamingResponse:
    stream = await processes.connect(services, principal.user_id, sandbox_id, process_id, after)
    return StreamingResponse(stream, media_type="application/x-ndjson", headers=STREAM_HEADERS)


@router.post("/{sandbox_id}/processes/{process_id}/input")
async def process_input(
    sandbox_id: str, process_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    body = await optional_body(request, ProcessInputRequest)
    seq = await processes.send_input(services, principal.user_id, sandbox_id, process_id, body)
    return _ok({"input_seq": seq})


@router.post("/{sandbox_id}/processes/{process_id}/stdin/close")
async def close_stdin(
    sandbox_id: str, process_id: str, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    await processes.close_stdin(services, principal.user_id, sandbox_id, process_id)
    return _ok({"ok": True})


@router.post("/{sandbox_id}/processes/{process_id}/resize")
async def resize_pty(
    sandbox_id: str, process_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    body = await optional_body(request, ProcessResizeRequest)
    resized = await processes.resize(services, principal.user_id, sandbox_id, process_id, body)
    return _ok(processes.view(resized))


@router.post("/{sandbox_id}/processes/{process_id}/signal")
async def signal_process(
    sandbox_id: str, process_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    body = await optional_body(request, ProcessSignalRequest)
    signalled = await processes.send_signal(services, principal.user_id, sandbox_id, process_id, body)
    return _ok(processes.view(signalled))


@router.get("/{sandbox_id}/processes/{process_id}/wait")
async def wait_process(
    sandbox_id: str,
    process_id: str,
    principal: SandboxPrincipalDep,
    services: ServicesDep,
    scope: Annotated[Literal["leader", "tree"], Query()] = "leader",
    timeout_ms: Annotated[int, Query(ge=0, le=processes.MAX_WAIT_MS)] = 30000,
) -> JSONResponse:
    done = await processes.wait(
        services, principal.user_id, sandbox_id, process_id, scope=scope, timeout_ms=timeout_ms
    )
    return _ok(processes.view(done))
