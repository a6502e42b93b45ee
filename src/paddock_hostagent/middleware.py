"""One structured log line per request (pure ASGI, so NDJSON streams and uploads are not buffered).

The control plane's ``X-Request-Id`` is kept when it sends one (``HostAgentClient`` sends the id of the
control-plane request it serves), so both services' lines correlate; it is bound for the request's
duration, so the domain's own lines (``sandbox_created`` …) carry it too.
Reads and commands log at debug level (they are frequent); lifecycle changes and errors at info.
An unexpected exception is answered here with the app's 500 handler and the kept-alive connection
stays open for the control plane's next call (``paddock_core.http.serve_guarded``).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import structlog

from paddock_core.http import serve_guarded
from paddock_core.logging import get_logger

log = get_logger("paddock.hostagent.http")


class RequestLogMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ""
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                request_id = value.decode(errors="replace")[:64]
                break
        request_id = request_id or "req_" + secrets.token_hex(8)
        started = time.perf_counter()
        status = 500

        async def send_logged(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())],
                }
            await send(message)

        try:
            with structlog.contextvars.bound_contextvars(request_id=request_id):
                await serve_guarded(self.app, scope, receive, send_logged)
        finally:
            method, path = scope["method"], scope["path"]
            quiet = status < 400 and (method == "GET" or path.endswith("/exec"))
            (log.debug if quiet else log.info)(
                "request",
                request_id=request_id,
                method=method,
                path=path,
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )
