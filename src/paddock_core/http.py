"""Pure-ASGI request middleware shared by the services: a request id on every response (``X-Request-Id``)
and one structured log line per request.

Pure ASGI (not BaseHTTPMiddleware) so NDJSON streams and uploads pass through unbuffered. Routes put
who and what they served in ``scope["state"]`` (``user_id``, ``wallet``, ``resource_id``); those keys
go into the log line. Headers, bodies and secrets never do.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import structlog

from paddock_core.logging import get_logger

log = get_logger("paddock.http")
LOGGED_STATE = ("user_id", "wallet", "resource_id")


class RequestContextMiddleware:
    """``quiet_paths``: routine requests (host heartbeats every 2 s) that log at debug unless they fail."""

    def __init__(self, app: Any, service: str, quiet_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.service = service
        self.quiet_paths = quiet_paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = "req_" + secrets.token_hex(8)
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status_holder = {"status": 500}

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            state = scope.get("state", {})
            quiet = status_holder["status"] < 400 and scope["path"] in self.quiet_paths
            (log.debug if quiet else log.info)(
                "request",
                service=self.service,
                method=scope["method"],
                path=scope["path"],
                status=status_holder["status"],
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
                **{key: state[key] for key in LOGGED_STATE if state.get(key) is not None},
            )
            structlog.contextvars.clear_contextvars()
