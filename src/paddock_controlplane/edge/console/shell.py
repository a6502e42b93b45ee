"""``/console/shell-ws/{sandbox_id}``: the API's shell WebSocket for a browser, which cannot set headers.

``GET /v1/sandboxes/{id}/shell-ws`` takes the key in ``X-Api-Key`` on the upgrade request, which a
browser's ``WebSocket`` cannot send, and a key in the URL would end up in logs and history. So the
console's socket is accepted first and its first message carries the key:
``{"type": "auth", "api_key": "..."}`` (text, at most 4 KiB, within 10 s). The key is then put on the
request as ``X-Api-Key`` and the API's own handler runs it: the same authentication, token scoping,
query (``rows``, ``cols``, ``process_id``) and messages as §12.5. An error the API answers before its
upgrade becomes a text frame ``{"type": "error", "error": "...", "status": N}`` and a close with code
``4000 + N`` (4401, 4404, …), as the socket is already open.

A page on another site could open this socket too, but it has no key to send: nothing ambient (no
cookie) authenticates it. An ``Origin`` other than this host's is refused all the same, before the
upgrade (HTTP 403).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

from starlette.types import Message, Receive, Scope
from starlette.websockets import WebSocket

from paddock_controlplane.edge.api.routes import shell as api_shell

AUTH_TIMEOUT_S = 10.0
MAX_AUTH_BYTES = 4096
MAX_KEY_CHARS = 1024


async def console_shell_ws(websocket: WebSocket, sandbox_id: str) -> None:
    if not _same_origin(websocket):
        await websocket.close(1008, "cross-origin socket refused")  # before accept: the server's 403
        return
    await websocket.accept()
    key = await _auth_message(websocket)
    if key is None:
        return
    headers = [(k, v) for k, v in websocket.scope["headers"] if k.lower() != b"x-api-key"]
    # The denial-response extension is declared because this module renders the handler's denials.
    extensions = {**websocket.scope.get("extensions", {}), "websocket.http.response": {}}
    scope: Scope = {
        **websocket.scope,
        "headers": [*headers, (b"x-api-key", key.encode())],
        "extensions": extensions,
    }
    inner = WebSocket(scope, _replayed_connect(websocket.receive), _AcceptedSend(websocket))
    await api_shell.shell_ws(inner, sandbox_id)


def _header_safe(key: str) -> bool:
    return key.isascii() and key.isprintable()


def _same_origin(websocket: WebSocket) -> bool:
    origin = websocket.headers.get("origin")
    if origin is None:  # not a browser: nothing to check
        return True
    return urlsplit(origin).netloc.lower() == websocket.headers.get("host", "").lower()


async def _auth_message(websocket: WebSocket) -> str | None:
    """The key from the first message, or ``None`` once the socket is closed with the reason."""
    try:
        message = await asyncio.wait_for(websocket.receive(), AUTH_TIMEOUT_S)
    except TimeoutError:
        await _refuse(websocket, 401, "no auth message within 10 s")
        return None
    text = message.get("text")
    if message["type"] != "websocket.receive" or not isinstance(text, str):
        await _refuse(websocket, 400, 'the first message must be text: {"type": "auth", "api_key": "…"}')
        return None
    if len(text) > MAX_AUTH_BYTES:
        await _refuse(websocket, 400, f"the auth message is over {MAX_AUTH_BYTES} bytes")
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    key = doc.get("api_key") if isinstance(doc, dict) and doc.get("type") == "auth" else None
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or not _header_safe(key):
        await _refuse(websocket, 401, "api_key: missing or malformed in the auth message")
        return None
    return key


async def _refuse(websocket: WebSocket, status: int, message: str) -> None:
    await websocket.send_text(json.dumps({"type": "error", "error": message, "status": status}))
    await websocket.close(4000 + status)


def _replayed_connect(receive: Receive) -> Receive:
    """The API handler's view of the socket starts at its connect message, which was already read."""
    replayed = False

    async def inner() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "websocket.connect"}
        return await receive()

    return inner


class _AcceptedSend:
    """The API handler's sends on a socket that is already open: its ``accept`` is dropped, and a
    denial response (its plain-HTTP error before the upgrade) becomes an error frame and a close."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.status = 0
        self.body = b""

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            return
        if kind == "websocket.http.response.start":
            self.status = int(message["status"])
            return
        if kind == "websocket.http.response.body":
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                await _refuse(self.websocket, self.status, _message(self.body))
            return
        await self.websocket.send(message)


def _message(body: bytes) -> str:
    """The message of a JSend fail or error envelope, as the API wrote it."""
    try:
        doc: Any = json.loads(body)
    except ValueError:
        return "request refused"
    data = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return str(doc["message"])
    return "request refused"
