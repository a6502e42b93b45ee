"""The code interpreter on port 49999 (placeholder until the interpreter lands: every route answers 501)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from paddock_controlplane.models import Sandbox
from paddock_controlplane.services import Services


async def handle(services: Services, sandbox: Sandbox, request: Request) -> Response:
    if request.url.path == "/health":
        return Response(status_code=204)
    return JSONResponse(
        {
            "code": 501,
            "message": f"{request.method} {request.url.path} is not served by Paddock's interpreter yet",
        },
        status_code=501,
    )
