"""The HTTP floor: a bare Starlette app on uvicorn, configured like Paddock's services, answering canned bodies.

    python -m bench.floor_server PORT BODIES.json

``GET /v1/sandboxes/{id}`` answers the JSON body a real control plane gave for that sandbox (same
bytes, status 200); ``POST /agent/deploy`` reads the request body and answers the gateway's real 402
quote body. No auth, no database, no validation: what any Python service on this stack pays per request.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def build(bodies: dict[str, str]) -> Starlette:
    sandbox = bodies.get("sandbox", "{}").encode()
    quote = bodies.get("quote", "{}").encode()

    async def get_sandbox(request: Request) -> Response:
        return Response(sandbox, media_type="application/json")

    async def deploy(request: Request) -> Response:
        await request.body()
        return Response(quote, status_code=402, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(
        routes=[
            Route("/v1/sandboxes/{sandbox_id}", get_sandbox),
            Route("/agent/deploy", deploy, methods=["POST"]),
            Route("/healthz", health),
        ]
    )


def main() -> None:
    port, bodies_path = int(sys.argv[1]), Path(sys.argv[2])
    app = build(json.loads(bodies_path.read_text()))
    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()
