"""``GET /v1/sandboxes/{id}/shell-ws``: a terminal in the sandbox over a WebSocket (spec §12.5).

Authenticated like every route (``X-Api-Key`` on the upgrade request). Query: ``rows``, ``cols`` (the
first window size, default 24×80) and ``process_id`` (attach to an existing PTY process instead of
starting a login shell; leaving then only detaches). Errors before the upgrade are answered as plain
HTTP with the JSend envelope (a 4xx naming the field), not as a WebSocket.

Messages, client → server: binary = keystrokes (bytes for the PTY); text = JSON, either
``{"type": "resize", "rows": R, "cols": C}`` or ``{"type": "input", "data": "text"}``.
Server → client: binary = terminal output; text = ``{"type": "exit", "exit_code": N, "signal": …}``
(then the socket closes with 1000) or ``{"type": "error", "error": "…"}`` (then 1011).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from paddock_controlplane.edge import terminals
from paddock_controlplane.edge.api.deps import principal_for_key
from paddock_controlplane.edge.api.errors import error_response
from paddock_controlplane.records.services import Services
from paddock_core import errors
from paddock_hostagent.schemas import ProcessPty

router = APIRouter(prefix="/v1/sandboxes", tags=["terminals"])
MAX_SIDE = 10000


def _side(websocket: WebSocket, name: str, default: int) -> int:
    raw = websocket.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_SIDE:
        raise errors.ValidationFailed.field(name, f"must be an integer from 1 to {MAX_SIDE}")
    return int(raw)


async def _open(websocket: WebSocket, sandbox_id: str) -> terminals.Terminal:
    services: Services = websocket.app.state.services
    principal = await principal_for_key(services, websocket.headers.get("x-api-key", ""))
    # A delegated access token (§12.1) may open a shell in its own sandbox only, as it may drive its
    # processes (a shell is one); any other sandbox is 404 to it.
    principal.require_scope(sandbox_id)
    pty = ProcessPty(rows=_side(websocket, "rows", 24), cols=_side(websocket, "cols", 80))
    attach_to = websocket.query_params.get("process_id") or None
    return await terminals.Terminal.open(
        services, principal.user_id, sandbox_id, pty=pty, attach_to=attach_to
    )


@router.websocket("/{sandbox_id}/shell-ws")
async def shell_ws(websocket: WebSocket, sandbox_id: str) -> None:
    try:
        terminal = await _open(websocket, sandbox_id)
    except errors.PaddockError as exc:
        await websocket.send_denial_response(error_response(exc))
        return
    await websocket.accept()
    reader = asyncio.create_task(_client_to_terminal(websocket, terminal))
    try:
        async for frame in terminal.frames():
            if frame.type == "data":
                await websocket.send_bytes(terminals.decode(frame))
            elif frame.type == "exit":
                await websocket.send_text(
                    json.dumps({"type": "exit", "exit_code": frame.exit_code, "signal": frame.signal})
                )
                await websocket.close(1000)
            else:
                await websocket.send_text(json.dumps({"type": "error", "error": frame.error}))
                await websocket.close(1011)
    except (WebSocketDisconnect, RuntimeError, errors.PaddockError):
        pass  # the client left (or the sandbox went away): end the session below
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        await terminal.close()


async def _client_to_terminal(websocket: WebSocket, terminal: terminals.Terminal) -> None:
    """Keystrokes and resizes until the client goes away, which ends the session."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes"):
                await terminal.write(message["bytes"])
            elif message.get("text"):
                await _control(terminal, message["text"])
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        await terminal.close()
        with contextlib.suppress(Exception):
            await websocket.close(1000)


async def _control(terminal: terminals.Terminal, text: str) -> None:
    try:
        doc = json.loads(text)
    except ValueError:
        await terminal.write(text.encode())  # a plain text frame is typed input too
        return
    if not isinstance(doc, dict):
        return
    if doc.get("type") == "resize" and isinstance(doc.get("rows"), int) and isinstance(doc.get("cols"), int):
        await terminal.resize(doc["rows"], doc["cols"])
    elif doc.get("type") == "input" and isinstance(doc.get("data"), str):
        await terminal.write(doc["data"].encode())
