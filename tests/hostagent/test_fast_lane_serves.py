"""The host agent's fast lane really serves a buffered exec, and leaves the rest to its routes.

The lane (``routes.fast_routes`` in ``paddock_core.fastlane.FastLane``) sits in front of the FastAPI
app; here that app is a recorder, and the sandbox manager a fake at its interface, so what answers a
request — the lane or the routes behind it — shows directly.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from paddock_core.fastlane import FastLane
from paddock_hostagent.routes import fast_routes
from paddock_hostagent.schemas import ExecBody

TOKEN = "t0ken"
PATH = "/internal/v1/sandboxes/sb-1/exec"


class FakeExec:
    def __init__(self) -> None:
        self.closed = False

    async def collect(self) -> dict[str, Any]:
        return {"stdout": "hi\n", "stderr": "", "exit_code": 0, "exec_ms": 1.5}

    async def close(self) -> None:
        self.closed = True


class FakeManager:
    """``SandboxManager.open_exec``, the one call the buffered exec makes."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, str]] = []
        self.streams: list[FakeExec] = []

    async def open_exec(self, sandbox_id: str, body: ExecBody) -> FakeExec:
        self.opened.append((sandbox_id, body.cmd))
        self.streams.append(FakeExec())
        return self.streams[-1]


class Routes:
    """Stands for the FastAPI routes behind the lane: records what reaches it, answers 418."""

    def __init__(self) -> None:
        self.reached: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.reached.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b"routes"})


async def post(lane: FastLane, manager: FakeManager, body: dict[str, Any], token: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the caller stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": PATH,
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {token}".encode())],
        "app": SimpleNamespace(state=SimpleNamespace(manager=manager)),
    }
    await lane(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_a_buffered_exec_is_answered_by_the_lane_and_never_reaches_the_routes() -> None:
    routes, manager = Routes(), FakeManager()
    lane = FastLane(routes, fast_routes(lambda header: header == f"Bearer {TOKEN}"))

    status, body = await post(lane, manager, {"cmd": "echo", "args": ["hi"]}, TOKEN)
    assert status == 200 and json.loads(body) == {
        "stdout": "hi\n",
        "stderr": "",
        "exit_code": 0,
        "exec_ms": 1.5,
    }
    assert routes.reached == [] and manager.opened == [("sb-1", "echo")]
    assert manager.streams[0].closed, "the guest stream is closed once the result is in"

    # what the lane leaves to the routes: a bad token (they answer 401) and a stream
    assert await post(lane, manager, {"cmd": "echo"}, "wrong") == (418, b"routes")
    assert await post(lane, manager, {"cmd": "echo", "stream": True}, TOKEN) == (418, b"routes")
    assert await post(lane, manager, {"cmd": ""}, TOKEN) == (418, b"routes")  # does not validate
    assert len(routes.reached) == 3 and manager.opened == [("sb-1", "echo")]
