"""The gateway's request guard, pure ASGI, in the contract's order (§5.3.3 steps 1–2).

It runs inside ``paddock_core.http.RequestContextMiddleware``, which gives every request (rejected
ones included) its request id and its log line. Then:

1. the rate limit on every ``/agent/*`` route (§4), before anything else;
2. the 50 MiB body cap (§2.5): ``Content-Length`` is checked before reading, a chunked body is read
   up to the cap and no further; the body is then replayed to the app.
"""

from __future__ import annotations

import json
from typing import Any

from paddock_gateway.errors import GatewayError, RequestTooLarge
from paddock_gateway.ratelimit import RateLimiter


async def send_error(send: Any, exc: GatewayError) -> None:
    body = json.dumps(exc.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *[(k.lower().encode(), v.encode()) for k, v in exc.headers.items()],
    ]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GatewayGuard:
    def __init__(self, app: Any, limiter: RateLimiter, max_body_bytes: int) -> None:
        self.app = app
        self.limiter = limiter
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = await self.guard(scope, receive)
        except GatewayError as exc:
            await send_error(send, exc)
            return
        await self.app(scope, receive, send)

    async def guard(self, scope: dict[str, Any], receive: Any) -> Any:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if scope["path"].startswith("/agent/") or scope["path"] == "/agent":
            peer = (scope.get("client") or ("", 0))[0]
            client_ip = self.limiter.client_ip(peer, headers.get("x-forwarded-for"))
            await self.limiter.check(client_ip, headers.get("x-wallet-address"))
        if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS") and "content-length" not in headers:
            return receive
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            raise RequestTooLarge()
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RequestTooLarge()
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        return replay
