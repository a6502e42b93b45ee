"""Request bodies bounded before anything buffers them (pure ASGI, outermost but for the request log).

Every route that reads its body whole (``request.body()``, the fast lane, FastAPI's JSON parsing)
holds it in memory, and the JSON parser then holds it again as Python objects: one exec with a 1 GiB
``stdin`` took the control plane from 204 to 5,324 MiB. ``BodyLimit`` gives each route a cap in
bytes (``None``: a route that streams its body and counts it itself, an upload). A ``Content-Length``
over the cap is refused before a byte of the body is read; a chunked body is counted as it is read,
and the read that passes the cap raises instead of returning. Either way the answer is the service's
own 413 (``refuse`` builds the exception, ``render`` the response when it reaches this middleware)
and the connection is closed, so the rest of the body is never read.

    app.add_middleware(BodyLimit, default_bytes=8 << 20, routes=[BodyRoute("PUT", r"/files", None)],
                       refuse=lambda limit, field: PayloadTooLarge(...), render=error_response)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from starlette import types

Scope = types.Scope
Receive = types.Receive
Send = types.Send
Message = types.Message
ASGIApp = types.ASGIApp
#: (limit in bytes, the field the body's size is charged to) -> the service's 413 exception.
Refuse = Callable[[int, str], Exception]
#: That exception -> the service's response (an ASGI app).
Render = Callable[[Exception], ASGIApp]


@dataclass(frozen=True)
class BodyRoute:
    """``limit_bytes`` for requests of ``method`` whose path matches ``path`` (``None``: no cap here);
    ``charged_to`` is the field a refusal names (``stdin`` for an exec, whose other fields are bounded apart)."""

    method: str
    path: str
    limit_bytes: int | None
    charged_to: str = "body"
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", re.compile(self.path))


class BodyTooLargeError(Exception):
    """Raised by the wrapped ``receive`` when the body passes its cap (carries the service's error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        *,
        default_bytes: int,
        refuse: Refuse,
        render: Render,
        routes: Sequence[BodyRoute] = (),
    ) -> None:
        self.app = app
        self.default_bytes = default_bytes
        self.routes = tuple(routes)
        self.refuse = refuse
        self.render = render

    def limit_for(self, scope: Scope) -> tuple[int | None, str]:
        for route in self.routes:
            if scope["method"] == route.method and route.pattern.fullmatch(scope["path"]):
                return route.limit_bytes, route.charged_to
        return self.default_bytes, "body"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, charged_to = self.limit_for(scope)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(self.refuse(limit, charged_to), scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLargeError(self.refuse(limit, charged_to))
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLargeError as exc:
            if started:
                raise
            await self._refuse(exc.error, scope, receive, send)

    async def _refuse(self, error: Exception, scope: Scope, receive: Receive, send: Send) -> None:
        """The service's 413, with ``Connection: close``: the server then closes the connection instead
        of reading (and dropping) what is left of the body."""

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.render(error)(scope, receive, closing)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None
