"""Request bodies bounded before anything buffers them (pure ASGI, outermost but for the request log).

Every route that reads its body whole (``request.body()``, the fast lane, FastAPI's JSON parsing)
holds it in memory, and the JSON parser then holds it again as Python objects: one exec with a 1 GiB
``stdin`` took the control plane from 204 to 5,324 MiB. ``BodyLimit`` gives each route a cap in
bytes (``None``: a route that streams its body and counts it itself, an upload). A ``Content-Length``
over the cap is refused before a byte of the body is read; a chunked body is counted as it is read,
and the read that passes the cap raises instead of returning. Either way the answer is the service's
own 413 (``refuse`` builds the exception, ``render`` the response when it reaches this middleware)
and the connection is closed, so the rest of the body is never read.

A body must also keep coming (``BODY_GRACE_S``, ``BODY_MIN_BYTES_PER_S``): once the app has waited
``t`` seconds in all for its pieces, it must have sent ``(t - BODY_GRACE_S) * BODY_MIN_BYTES_PER_S``
bytes, on every route, uploads included. Only the waits count, so an app that works before it reads
(a paused sandbox resumed first) does not make its client slow. A client that sent its head and then trickled its body (a byte now and then, or
nothing) held a connection and the request's handler for as long as it liked; now the read that
would wait past that is refused with the service's 408 (``too_slow``) and the connection closed.
An honest upload at 1 MiB/s is 64 times over the rate.

    app.add_middleware(BodyLimit, default_bytes=8 << 20, routes=[BodyRoute("PUT", r"/files", None)],
                       refuse=lambda limit, field: PayloadTooLarge(...), render=error_response,
                       too_slow=lambda reason: RequestTimeout(reason))
"""

from __future__ import annotations

import asyncio
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
#: (the reason, naming the rate) -> the service's 408 for a body that stopped coming.
TooSlow = Callable[[str], Exception]

#: How long a body may take before it must keep up ``BODY_MIN_BYTES_PER_S`` (counted from its
#: request's head): Apache's mod_reqtimeout's body=20.
BODY_GRACE_S = 20.0
#: The least average rate a body must keep after its grace (16 KiB/s, 128 kbit/s): a body of
#: ``n`` bytes may take ``BODY_GRACE_S + n / BODY_MIN_BYTES_PER_S`` seconds.
BODY_MIN_BYTES_PER_S = 16 * 1024


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


class BodyTooSlowError(BodyTooLargeError):
    """Raised by the wrapped ``receive`` when the body falls behind its rate (carries the 408)."""


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        *,
        default_bytes: int,
        refuse: Refuse,
        render: Render,
        routes: Sequence[BodyRoute] = (),
        too_slow: TooSlow | None = None,
    ) -> None:
        self.app = app
        self.default_bytes = default_bytes
        self.routes = tuple(routes)
        self.refuse = refuse
        self.render = render
        #: None: a body that stops coming is answered a bare 408 and its connection closed.
        self.too_slow = too_slow
        self.grace_s = BODY_GRACE_S
        self.min_bytes_per_s = BODY_MIN_BYTES_PER_S

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
        declared = _content_length(scope)
        if limit is not None and declared is not None and declared > limit:
            await self._refuse(self.refuse(limit, charged_to), scope, receive, send)
            return
        received = 0
        started = False
        body_done = declared == 0 or (declared is None and not _chunked(scope))
        loop = asyncio.get_running_loop()
        waited_s = 0.0  # only the time spent waiting for the client counts, not the app's own work

        async def counted() -> Message:
            nonlocal received, body_done, waited_s
            if body_done:  # what follows is the wait for a disconnect, which has no deadline
                return await receive()
            budget_s = self.grace_s + received / self.min_bytes_per_s - waited_s
            asked_at = loop.time()
            try:
                async with asyncio.timeout(max(0.0, budget_s)):  # no task per read, unlike wait_for
                    message = await receive()
            except TimeoutError:
                raise BodyTooSlowError(self._too_slow_error()) from None
            finally:
                waited_s += loop.time() - asked_at
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if limit is not None and received > limit:
                    raise BodyTooLargeError(self.refuse(limit, charged_to))
            else:
                body_done = True
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
            if isinstance(exc, BodyTooSlowError) and self.too_slow is None:
                await send(
                    {"type": "http.response.start", "status": 408, "headers": [(b"connection", b"close")]}
                )
                await send({"type": "http.response.body", "body": b""})
                return
            await self._refuse(exc.error, scope, receive, send)

    def _too_slow_error(self) -> Exception:
        message = (
            f"the request's body came slower than {self.min_bytes_per_s} bytes/s after its first"
            f" {self.grace_s:.0f} s"
        )
        return self.too_slow(message) if self.too_slow is not None else TimeoutError(message)

    async def _refuse(self, error: Exception, scope: Scope, receive: Receive, send: Send) -> None:
        """The service's 413, with ``Connection: close``: the server then closes the connection instead
        of reading (and dropping) what is left of the body."""

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.render(error)(scope, receive, closing)


def _chunked(scope: Scope) -> bool:
    return any(key == b"transfer-encoding" for key, _ in scope["headers"])


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None
