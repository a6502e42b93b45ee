"""Hot routes served without the framework's routing and dependency machinery (pure ASGI).

FastAPI spends ~0.5 ms of CPU per request here on routing, dependency solving and its exception
layers — as much as the buffered exec it carries costs end to end. ``FastLane`` sits in the
middleware stack (inside the request-id/log middleware, so every request still gets both), matches a
few ``(method, path)`` pairs itself, reads the body and offers it to a handler. The handler serves the
common case and returns a response; for anything else (a streaming request, a body that does not
validate) it returns ``None`` and the request continues, body replayed, to the regular route, which
stays the one definition of the endpoint's behaviour, errors and OpenAPI entry.

    app.add_middleware(FastLane, routes=[FastRoute("POST", r"/v1/things/(?P<thing_id>[^/]+)/poke", poke)])
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from starlette import types

T = TypeVar("T")
# Starlette's own ASGI types, so its Request.receive and Response instances type-check as they are.
Scope = types.Scope
Message = types.Message
Receive = types.Receive
Send = types.Send
ASGIApp = types.ASGIApp
# (scope, path parameters, body, receive) -> an ASGI response to send, or None to fall through.
Handler = Callable[[Scope, dict[str, str], bytes, Receive], Awaitable[ASGIApp | None]]


@dataclass(frozen=True)
class FastRoute:
    method: str
    path: str
    handler: Handler
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", re.compile(self.path))


class FastLane:
    def __init__(self, app: ASGIApp, routes: Sequence[FastRoute]) -> None:
        self.app = app
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.routes:
                if scope["method"] != route.method:
                    continue
                match = route.pattern.fullmatch(scope["path"])
                if match is None:
                    continue
                body, more = await _read_body(receive)
                if more is not None:  # the client left mid-body: nothing to answer
                    return
                response = await route.handler(scope, match.groupdict(), body, receive)
                if response is not None:
                    await response(scope, receive, send)
                    return
                await self.app(scope, _replay(body, receive), send)
                return
        await self.app(scope, receive, send)


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The whole request body, or the disconnect message that cut it short."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client goes away (after the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client went away first: ``work`` is then cancelled (a buffered
    exec dies with its caller). Call it once the request body has been read.

    ``work`` runs in the caller's task, and a watcher task cancels that task when the client leaves: one
    task and no ``asyncio.wait`` per request (~25 µs less than running ``work`` in a task of its own).
    A cancellation from elsewhere (a shutdown) still propagates."""
    caller = asyncio.current_task()
    assert caller is not None
    left = False

    async def watch() -> None:
        nonlocal left
        await until_disconnect(receive)
        left = True
        caller.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if left and caller.uncancel() == 0:
            return None
        raise
    finally:
        watcher.cancel()


def header(scope: Scope, name: bytes) -> str:
    """The first value of request header ``name`` (lower case), or ``""``."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return ""
