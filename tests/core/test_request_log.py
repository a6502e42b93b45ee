"""The request log line: one per request; routine heartbeats stay out of the info log unless they fail."""

from __future__ import annotations

from typing import Any

import structlog
from starlette.responses import PlainTextResponse

from paddock_core.http import RequestContextMiddleware


async def serve(app: Any, path: str) -> list[dict[str, Any]]:
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with structlog.testing.capture_logs() as logs:
        await app({"type": "http", "method": "POST", "path": path, "headers": []}, receive, send)
    assert any(dict(m.get("headers", [])).get(b"x-request-id") for m in sent if "headers" in m)
    return [entry for entry in logs if entry["event"] == "request"]


def app_answering(status: int) -> Any:
    return RequestContextMiddleware(
        PlainTextResponse("ok", status_code=status), service="t", quiet_paths=frozenset({"/beat"})
    )


async def test_quiet_paths_log_at_debug_unless_they_fail() -> None:
    [ok_beat] = await serve(app_answering(200), "/beat")
    [failed_beat] = await serve(app_answering(401), "/beat")
    [other] = await serve(app_answering(200), "/v1/whoami")
    assert ok_beat["log_level"] == "debug"
    assert failed_beat["log_level"] == "info" and failed_beat["status"] == 401
    assert other["log_level"] == "info" and other["path"] == "/v1/whoami"
