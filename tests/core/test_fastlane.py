"""``paddock_core.fastlane``: what the app behind it sees when the fast lane serves, declines or passes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import PlainTextResponse

from paddock_core.fastlane import FastLane, FastRoute, unless_disconnected


class Recorder:
    """The app behind the fast lane: records the body it read and answers 'route'."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await PlainTextResponse("route")(scope, receive, send)


async def call(
    app: Any, method: str, path: str, chunks: list[bytes], *, disconnect: bool = False
) -> list[Any]:
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    if disconnect:
        messages[-1] = {"type": "http.disconnect"}
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    await app(scope, receive, send)
    return sent


def body_of(sent: list[Any]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def handler(scope: Any, params: dict[str, str], body: bytes, receive: Any) -> Any:
    if body == b"decline":
        return None
    return PlainTextResponse(f"fast {params['thing']} {body.decode()}")


async def test_serves_declines_with_the_body_replayed_and_passes_other_routes() -> None:
    behind = Recorder()
    lane = FastLane(behind, [FastRoute("POST", r"/things/(?P<thing>[^/]+)/poke", handler)])

    assert body_of(await call(lane, "POST", "/things/a1/poke", [b"he", b"llo"])) == b"fast a1 hello"
    assert behind.bodies == []

    assert body_of(await call(lane, "POST", "/things/a1/poke", [b"dec", b"line"])) == b"route"
    assert behind.bodies == [b"decline"]  # the route read the whole body the lane had consumed

    assert body_of(await call(lane, "GET", "/things/a1/poke", [b"x"])) == b"route"
    assert body_of(await call(lane, "POST", "/things/a1/poke/more", [b"y"])) == b"route"
    assert behind.bodies == [b"decline", b"x", b"y"]


async def test_a_client_gone_mid_body_gets_nothing_and_reaches_nothing() -> None:
    behind = Recorder()
    lane = FastLane(behind, [FastRoute("POST", r"/things/(?P<thing>[^/]+)/poke", handler)])
    assert await call(lane, "POST", "/things/a1/poke", [b"par", b"tial"], disconnect=True) == []
    assert behind.bodies == []


async def test_unless_disconnected_returns_the_result_or_cancels_the_work() -> None:
    async def never_leaves() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def work() -> str:
        await asyncio.sleep(0)
        return "done"

    assert await unless_disconnected(never_leaves, work()) == "done"

    left = asyncio.Event()
    cancelled = []

    async def leaves() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def slow() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    asyncio.get_running_loop().call_later(0.01, left.set)
    assert await unless_disconnected(leaves, slow()) is None
    assert cancelled == [True]


async def test_unless_disconnected_lets_a_cancellation_from_elsewhere_through() -> None:
    """A shutdown cancelling the request is not taken for the client leaving (no result of None)."""

    async def never_leaves() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(3600)
        return "never"

    request = asyncio.create_task(unless_disconnected(never_leaves, slow()))
    await started.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert request.cancelled()
