"""The API side of the audit trail (``records/audit.py``): one ``api`` event per call on a sandbox.

``AuditMiddleware`` sits just inside the body limit and outside the fast lane, so it sees both lanes'
requests on ``/v1/sandboxes/{id}/…``: the method, the route template (the matched route's, or the
fast lane's), the status, the caller's key or token id (``scope["state"]["key_id"]``, set when the
caller is resolved) and a SHA-256 of the inputs, secrets and env values taken out before hashing
(``audit.input_digest``). The events a request's work notes (a command, a file) wait in the request's
``RequestAudit`` and are queued after its ``api`` event, with its caller. Nothing here touches the
database: ``AuditLog`` is an in-memory queue the writer flushes.

The E2B API and the E2B sandbox edge wrap their apps in the same middleware, each with its own
``locate`` (which requests are on which sandbox; ``edge/e2b/audit_targets.py``), so an agent on E2B's SDK
leaves the trail an agent on ``/v1`` does.

Not recorded: requests without a valid key (401: no owner to file them under), ``POST /v1/sandboxes``
(no sandbox yet; its ``create`` is the first thing the host reports), WebSockets, and reads of the
audit trail itself, which would otherwise add to what they page through.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from paddock_controlplane.records import audit
from paddock_controlplane.records.services import Services
from paddock_core import fastlane
from paddock_core.timeutil import utcnow

#: ``/v1/sandboxes/<id>`` and everything below it; the id is a path segment.
SANDBOX_PATH = re.compile(r"/v1/sandboxes/(?P<sandbox_id>[^/]+)(?P<rest>/.*)?")
NOT_A_SANDBOX = frozenset({"by-ip"})
#: The scope key the metrics' fast-lane tagging sets (``paddock_core.metrics.ROUTE_KEY``).
ROUTE_KEY = "paddock.route"
JSON_TYPES = (b"application/json", b"text/json")
#: Routes whose body is a file's bytes, whatever its type says: counted by size, never hashed.
RAW_BODIES = frozenset({"/files", "/files/tar"})


@dataclass(frozen=True)
class Target:
    """A request the trail files: the sandbox it is on, the route to name when neither a matched route
    nor the fast lane names one (the path, its id templated), and whether its body is raw bytes."""

    sandbox_id: str
    route: str
    raw_body: bool = False


#: Which sandbox a request is on, from its scope alone; None for a request the trail leaves out.
Locate = Callable[[fastlane.Scope], Target | None]


def v1_target(scope: fastlane.Scope) -> Target | None:
    match = SANDBOX_PATH.fullmatch(scope["path"])
    if match is None or match["sandbox_id"] in NOT_A_SANDBOX or match["rest"] == "/audit":
        return None
    rest = match["rest"] or ""
    route = "/v1/sandboxes/{sandbox_id}" + audit.bounded(rest, audit.MAX_PATH_CHARS)
    return Target(match["sandbox_id"], route, rest in RAW_BODIES)


def template_of(scope: fastlane.Scope, target: Target) -> str:
    """The route template: the matched route's, the fast lane's, or the target's."""
    tagged = scope.get(ROUTE_KEY)
    if isinstance(tagged, str):
        return tagged
    route = getattr(scope.get("route"), "path", None)
    if isinstance(route, str):
        return route
    return target.route


class AuditMiddleware:
    """Files an ``api`` event for each request ``locate`` places on a sandbox. ``services`` is for an app
    that does not carry them in ``app.state`` (the E2B edge's plain ASGI app)."""

    def __init__(
        self, app: fastlane.ASGIApp, locate: Locate = v1_target, services: Services | None = None
    ) -> None:
        self.app = app
        self.locate = locate
        self.services = services

    async def __call__(self, scope: fastlane.Scope, receive: fastlane.Receive, send: fastlane.Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        target = self.locate(scope)
        if target is None:
            await self.app(scope, receive, send)
            return
        services = self.services or scope["app"].state.services
        sandbox_id, at, started = target.sandbox_id, utcnow(), time.perf_counter()
        content_type = fastlane.header(scope, b"content-type").encode().split(b";")[0].strip().lower()
        json_body = not target.raw_body and (
            content_type in JSON_TYPES or (content_type == b"" and scope["method"] != "PUT")
        )
        kept: list[bytes] = []
        counts = {"bytes": 0, "status": 500}

        async def counted_receive() -> fastlane.Message:
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                counts["bytes"] += len(chunk)
                if json_body and counts["bytes"] <= audit.MAX_DIGEST_BODY_BYTES:
                    kept.append(chunk)
            return message

        async def status_send(message: fastlane.Message) -> None:
            if message["type"] == "http.response.start":
                counts["status"] = message["status"]
            await send(message)

        noted = audit.RequestAudit()
        token = audit.CURRENT.set(noted)
        try:
            await self.app(scope, counted_receive, status_send)
        finally:
            audit.CURRENT.reset(token)
            state = scope.get("state", {})
            user_id = state.get("user_id")
            if isinstance(user_id, str):
                actor = state.get("key_id")
                whole = counts["bytes"] <= audit.MAX_DIGEST_BODY_BYTES
                detail = {
                    "method": scope["method"],
                    "route": template_of(scope, target),
                    "status": counts["status"],
                    "duration_ms": audit.elapsed_ms(started),
                }
                if counts["bytes"]:
                    detail["input_bytes"] = counts["bytes"]
                body = (kept[0] if len(kept) == 1 else b"".join(kept)) if whole else None
                event = audit.Pending(sandbox_id, user_id, at, "api", detail, actor)
                event.inputs = (scope.get("query_string", b""), body, counts["bytes"], json_body)
                if body is not None and len(body) > audit.DEFERRED_BODY_BYTES:
                    event.row()  # hashed now: the queue holds small bodies only
                services.audit.add(event)
                for event in noted.events:
                    event.actor = actor
                    services.audit.add(event)
            else:  # a refused caller's request: its work (none, normally) is still filed
                for event in noted.events:
                    services.audit.add(event)
            noted.events = []
            noted.closed = True
