"""Any port other than envd's and the interpreter's: the request goes to that port of the sandbox, as the
ingress sends it (to the sandbox's address, from the control plane; never anywhere a tenant names). The
URL is rebuilt from the parsed path and query; hop-by-hop headers are dropped; the body streams both
ways. A port nothing listens on answers 502 "… port is not open", which the SDK reads as such.

Who may reach a port: the ingress's rule (the sandbox's ``ingress_enabled``; a desktop's noVNC ports never
without a token unless it was made through the E2B API), or a caller holding the sandbox's ``envdAccessToken`` in ``X-Access-Token`` or
``e2b-traffic-access-token`` (what the sandbox's creator got). Without either: 403, as no sandbox's port
is opened to the network by the edge alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from paddock_controlplane.edge.e2b import identity, store
from paddock_controlplane.edge.ingress.proxy import backend_tls
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import computer, desktop_access

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "e2b-sandbox-id",
        "e2b-sandbox-port",
        *identity.TOKEN_HEADERS,
    }
)
CONNECT_TIMEOUT_S = 5.0
_clients: dict[bool, httpx.AsyncClient] = {}


def client(*, tls: bool = False) -> httpx.AsyncClient:
    """The client to sandboxes' ports; ``tls`` for those whose app serves HTTPS itself (E2B's
    ``httpsPorts``), whose certificate is not checked, as the ingress's (``proxy.backend_tls``)."""
    if tls not in _clients:
        _clients[tls] = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=32),
            trust_env=False,
            follow_redirects=False,
            verify=backend_tls() if tls else True,
        )
    return _clients[tls]


async def close() -> None:
    for made in list(_clients.values()):
        await made.aclose()
    _clients.clear()


def _port_closed(sandbox_id: str, port: int, reason: str) -> Response:
    return JSONResponse(
        {
            "code": 502,
            "message": f"The sandbox {sandbox_id} is running but port is not open: port {port} ({reason})",
            "sandboxId": sandbox_id,
            "port": port,
        },
        status_code=502,
    )


async def refusal(services: Services, sandbox: Sandbox, port: int, request: Request) -> str | None:
    """Why the request may not reach ``port``, or None when it may."""
    if identity.carries_token(services.settings, sandbox.id, request.headers):
        return None
    token_hint = "send its envdAccessToken in X-Access-Token or e2b-traffic-access-token"
    if not sandbox.ingress_enabled:
        return f"port {port} of sandbox {sandbox.id}: ingress is off for this sandbox; {token_hint}"
    if port in desktop_access.NOVNC_PORTS and await computer.is_desktop_image(services, sandbox.rootfs):
        # e2b-desktop's stream is on 6080, one of these, and its URL carries no token: a desktop made
        # through the E2B API with public traffic serves it as an ordinary port, as the ingress does;
        # a native desktop's stay its live view's (docs/e2b.md).
        async with services.sessions() as session:
            if await store.get(session, sandbox.id) is not None:
                return None
        return (
            f"port {port} of sandbox {sandbox.id} is one of a desktop's live-view ports "
            f"({desktop_access.NOVNC_PORTS.start}-{desktop_access.NOVNC_PORTS.stop - 1}), which open only "
            f"with a live-view link; {token_hint}, or start the stream on another port with require_auth"
        )
    return None


async def forward(services: Services, sandbox: Sandbox, port: int, request: Request) -> Response:
    refused = await refusal(services, sandbox, port, request)
    if refused is not None:
        return JSONResponse({"code": 403, "message": refused}, status_code=403)
    if not sandbox.ip:
        return _port_closed(sandbox.id, port, "the sandbox has no address")
    ports = sandbox.app_ports
    tls = ports.tls(port)
    query = request.url.query
    url = httpx.URL(scheme="https" if tls else "http", host=str(sandbox.ip), port=port, path=request.url.path)
    if query:
        url = url.copy_with(query=query.encode())
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
    host = ports.host_for(port) or request.headers.get("host", f"{sandbox.ip}:{port}")
    headers.append(("host", host))
    has_body = request.method not in ("GET", "HEAD", "OPTIONS") or "content-length" in request.headers

    async def body() -> AsyncIterator[bytes]:
        async for chunk in request.stream():
            if chunk:
                yield chunk

    upstream = client(tls=tls).build_request(
        request.method, url, headers=headers, content=body() if has_body else None
    )
    try:
        answer = await client(tls=tls).send(upstream, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return _port_closed(sandbox.id, port, type(exc).__name__)
    except httpx.HTTPError as exc:
        return JSONResponse(
            {"code": 502, "message": f"port {port} of sandbox {sandbox.id}: {exc}"}, status_code=502
        )
    out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
    return StreamingResponse(
        answer.aiter_raw(),
        status_code=answer.status_code,
        headers=out_headers,
        background=BackgroundTask(answer.aclose),
    )


async def websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """WebSockets through the edge are not served yet (docs/e2b.md): refused before the handshake."""
    if scope["type"] == "websocket":
        with contextlib.suppress(Exception):
            await asyncio.wait_for(receive(), 5)
            await send({"type": "websocket.close", "code": 1011, "reason": "not served by Paddock's edge"})
