"""Pure-ASGI request middleware shared by the services: a request id on every response (``X-Request-Id``)
and one structured log line per request.

Pure ASGI (not BaseHTTPMiddleware) so NDJSON streams and uploads pass through unbuffered. Routes put
who and what they served in ``scope["state"]`` (``user_id``, ``wallet``, ``resource_id``); those keys
go into the log line. Headers, bodies and secrets never do.

It is also where an unexpected exception ends (``serve_guarded``). Starlette's outermost
``ServerErrorMiddleware`` answers the 500 and then *re-raises*, and uvicorn drops the kept-alive
connection on a raised exception, so the client's next request on it fails with ECONNRESET. Here,
inside that middleware, the exception is answered by the app's own ``Exception`` handler (the
service's 500 envelope, logged with the request id) and goes no further: the connection stays usable.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from paddock_core import envelope
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
            await serve_guarded(self.app, scope, receive, send_with_id)
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


def current_request_id() -> str | None:
    """The id of the request this task serves (bound above), for the calls it makes onward: the host
    agent logs a control-plane call under the control plane's id."""
    request_id = structlog.contextvars.get_contextvars().get("request_id")
    return str(request_id) if request_id else None


async def serve_guarded(app: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Runs ``app``; an exception that escapes it before the response has started is answered with the
    app's ``Exception`` handler and not re-raised (the connection stays open). One that escapes after
    a complete response is logged. One that escapes mid-response is re-raised: closing the connection
    is then the only honest way to tell the client its response is cut short."""
    started = finished = False

    async def tracking_send(message: dict[str, Any]) -> None:
        nonlocal started, finished
        if message["type"] == "http.response.start":
            started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            finished = True
        await send(message)

    try:
        await app(scope, receive, tracking_send)
    except Exception as exc:
        if started and not finished:
            raise
        if finished:
            log.error("exception_after_response", path=scope.get("path"), exc_info=exc)
            return
        response = await unexpected_response(scope, exc)
        await response(scope, receive, send)


async def unexpected_response(scope: dict[str, Any], exc: Exception) -> Response:
    """The app's own ``Exception`` handler renders (and logs) the 500; without one, the JSend error."""
    app = scope.get("app")
    handlers = getattr(app, "exception_handlers", {}) or {}
    handler = handlers.get(Exception) or handlers.get(500)
    if handler is not None:
        response: Response = await handler(Request(scope), exc)
        return response
    request_id = scope.get("state", {}).get("request_id")
    log.error("unhandled_exception", path=scope.get("path"), request_id=request_id, exc_info=exc)
    return JSONResponse(envelope.error(f"internal error (request {request_id})", 500), 500)
