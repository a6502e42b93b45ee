"""The host agent's end of the kept channel (``channelwire.py``): hot calls from the control plane
without an HTTP request each.

A buffered exec over HTTP costs the agent uvicorn's parsing, the middleware stack and a response in two
sends on top of the command itself (a pause or resume, FastAPI's routing and dependencies too); here
the connection, its authentication and the request log's context are paid once per channel, and an
answer is one WebSocket message. Each call runs in a task of its own (calls on one channel do not wait
for each other). A cancel frame, or the channel closing, cancels an exec the way a closed HTTP
connection does (the command is killed); a pause or resume runs to its end either way, as over HTTP
(stopping one halfway would leave the sandbox frozen with its record saying otherwise).

``ChannelEndpoint`` is pure ASGI middleware that takes the WebSocket upgrade at ``channelwire.PATH``
and passes everything else on. An upgrade without the agent's bearer token is refused (403) before
it is accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import structlog
from pydantic import BaseModel, ValidationError

from paddock_core import fastlane
from paddock_core.logging import get_logger
from paddock_hostagent import channelwire, errors, processes
from paddock_hostagent.routes import (
    buffered_exec,
    check_exec_size,
    error_body,
    pause_sandbox,
    resume_sandbox,
    validation_reasons,
)
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.schemas import CreateSandboxBody, ExecBody, ForkBody, ProcessStreamBody

log = get_logger("paddock.hostagent.channel")
# WebSocket close codes (RFC 6455 §7.4.1).
_UNSUPPORTED_DATA = 1003
_POLICY_VIOLATION = 1008
_PROTOCOL_ERROR = 1002


class ChannelEndpoint:
    def __init__(self, app: fastlane.ASGIApp, authorized: Callable[[str], bool]) -> None:
        self.app = app
        self.authorized = authorized

    async def __call__(self, scope: fastlane.Scope, receive: fastlane.Receive, send: fastlane.Send) -> None:
        if scope["type"] != "websocket" or scope["path"] != channelwire.PATH:
            await self.app(scope, receive, send)
            return
        if (await receive())["type"] != "websocket.connect":
            return
        if not self.authorized(fastlane.header(scope, b"authorization")):
            log.info("channel_refused", reason="missing or invalid bearer token")
            await send({"type": "websocket.close", "code": _POLICY_VIOLATION})  # before accept: 403
            return
        # Naming a subprotocol tells the client which calls this agent takes (create and fork, the
        # streamed process start); a client that offered none (an older control plane) sends only
        # what it knows.
        protocol = channelwire.chosen(scope.get("subprotocols", ()))
        await send({"type": "websocket.accept", "subprotocol": protocol})
        log.info("channel_opened", client=str(scope.get("client")))
        await Channel(scope["app"].state.manager, send).serve(receive)


class _Window:
    """What a stream may still send before its reader grants more (``channelwire.STREAM_WINDOW_BYTES``)."""

    def __init__(self) -> None:
        self.available = channelwire.STREAM_WINDOW_BYTES
        self._granted = asyncio.Event()

    def grant(self, nbytes: int) -> None:
        self.available = min(self.available + nbytes, channelwire.STREAM_WINDOW_BYTES)
        self._granted.set()

    async def spend(self, nbytes: int) -> None:
        """Waits while the window is used up; a line may overdraw what is left (one line at most)."""
        while self.available <= 0:
            self._granted.clear()
            await self._granted.wait()
        self.available -= nbytes


class Channel:
    """One accepted channel: reads frames, runs each call in its own task, answers as they finish."""

    def __init__(self, manager: SandboxManager, send: fastlane.Send) -> None:
        self._manager = manager
        self._send = send
        self._calls: dict[int, asyncio.Task[None]] = {}  # the cancellable ones, by id
        self._running: set[asyncio.Task[None]] = set()  # all of them (the loop keeps weak references)
        self._windows: dict[int, _Window] = {}  # the streams', by id

    async def serve(self, receive: fastlane.Receive) -> None:
        try:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return  # websocket.disconnect
                frame = message.get("bytes")
                if frame is None:
                    await self._close(_UNSUPPORTED_DATA)
                    return
                try:
                    call = channelwire.decode_call(frame)
                except channelwire.FrameError as exc:
                    log.warning("channel_bad_frame", error=str(exc))
                    await self._close(_PROTOCOL_ERROR)
                    return
                if call.op == channelwire.OP_CANCEL:
                    task = self._calls.get(call.id)
                    if task is not None:
                        task.cancel()
                    continue
                if call.op == channelwire.OP_CREDIT:
                    window = self._windows.get(call.id)
                    if window is not None:
                        window.grant(call.credit)
                    continue
                task = asyncio.create_task(self._answer(call))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
                if call.op in _CANCELLABLE:
                    self._calls[call.id] = task
        finally:
            # The control plane is gone: its commands die with it.
            calls = list(self._calls.values())
            for task in calls:
                task.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            log.info("channel_closed")

    async def _close(self, code: int) -> None:
        with contextlib.suppress(OSError):  # already gone
            await self._send({"type": "websocket.close", "code": code})

    async def _answer(self, call: channelwire.Call) -> None:
        try:
            await self._answer_logged(call)
        finally:
            self._calls.pop(call.id, None)

    async def _answer_logged(self, call: channelwire.Call) -> None:
        request_id = call.request_id or "req_" + secrets.token_hex(8)
        started = time.perf_counter()
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            status, body, items = await self._serve(call)
            try:
                if items is None:
                    await self._reply(call.id, status, body)
                else:
                    window = self._windows[call.id] = _Window()
                    try:
                        await self._reply(call.id, status, body)
                        ended = False
                        async with contextlib.aclosing(items):
                            async for item, last in items:
                                await window.spend(len(item))
                                status = channelwire.STATUS_END if last else channelwire.STATUS_ITEM
                                await self._reply(call.id, status, item)
                                if last:
                                    ended = True
                                    break
                        if not ended:
                            await self._reply(call.id, channelwire.STATUS_END, b"")
                    finally:
                        self._windows.pop(call.id, None)
            except OSError:
                return  # the channel closed under the call: serve() cancels the rest
            # A create or fork is logged as its HTTP request was; the hot calls only when they fail.
            (log.debug if status < 400 and call.op in _HOT else log.info)(
                "channel_call",
                request_id=request_id,
                op=channelwire.OP_NAMES.get(call.op, str(call.op)),
                sandbox_id=call.sandbox_id,
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )

    async def _reply(self, call_id: int, status: int, body: bytes) -> None:
        await self._send(
            {"type": "websocket.send", "bytes": channelwire.encode_answer(call_id, status, body)}
        )

    async def _serve(
        self, call: channelwire.Call
    ) -> tuple[int, bytes, AsyncGenerator[tuple[bytes, bool], None] | None]:
        """(status, body) exactly as the HTTP route would answer, and a streamed call's lines."""
        try:
            stream = _STREAMS.get(call.op)
            if stream is not None:
                head, items = await stream(self._manager, call)
                return 200, head, items
            serve = _OPS.get(call.op)
            if serve is None:
                return 400, error_body("bad_request", f"unknown channel call {call.op}"), None
            return 200, await serve(self._manager, call), None
        except errors.HostAgentServerError as exc:
            return exc.status, error_body(exc.code, exc.message), None
        except Exception as exc:  # the app's 500; the channel's other calls go on
            request_id = secrets.token_hex(6)
            log.error("unhandled_error", request_id=request_id, op=call.op, exc_info=exc)
            return 500, error_body("internal", f"internal error (request {request_id})"), None


_Body = TypeVar("_Body", bound=BaseModel)


def _body(model: type[_Body], call: channelwire.Call) -> _Body:
    """The call's JSON body as the HTTP route would validate it (a 400 naming the fields otherwise)."""
    try:
        return model.model_validate_json(call.body)
    except ValidationError as exc:
        raise errors.BadRequest(validation_reasons(exc.errors())) from None


async def _exec(manager: SandboxManager, call: channelwire.Call) -> bytes:
    body = _body(ExecBody, call)
    if body.stream:
        raise errors.BadRequest("a streamed exec goes over HTTP")
    check_exec_size(body)
    result = await buffered_exec(manager, call.sandbox_id, body)
    return result.model_dump_json(exclude_none=True).encode()


async def _pause(manager: SandboxManager, call: channelwire.Call) -> bytes:
    return (await pause_sandbox(call.sandbox_id, manager)).model_dump_json().encode()


async def _resume(manager: SandboxManager, call: channelwire.Call) -> bytes:
    return (await resume_sandbox(call.sandbox_id, manager)).model_dump_json().encode()


async def _fork(manager: SandboxManager, call: channelwire.Call) -> bytes:
    return (await manager.fork(call.sandbox_id, _body(ForkBody, call))).model_dump_json().encode()


async def _create(manager: SandboxManager, call: channelwire.Call) -> bytes:
    return (await manager.create(_body(CreateSandboxBody, call))).model_dump_json().encode()


async def _process_stream(
    manager: SandboxManager, call: channelwire.Call
) -> tuple[bytes, AsyncGenerator[tuple[bytes, bool], None]]:
    """``POST …/processes/stream``: the process's view, then its frames (``processes.frames``: the
    route's own lines); ending the iteration closes the guest's stream, and the process runs on."""
    body = _body(ProcessStreamBody, call)
    view, stream = await processes.service_of(manager).start_streaming(call.sandbox_id, body)

    async def lines() -> AsyncGenerator[tuple[bytes, bool], None]:
        async with contextlib.aclosing(processes.frames(stream, 0)) as frames:
            async for frame in frames:
                yield frame.model_dump_json(exclude_none=True).encode(), frame.type in ("exit", "error")

    return view.model_dump_json().encode(), lines()


# The calls a departed caller stops (the others run to their end; their answers go nowhere). A stream
# stops too, but not its process.
_CANCELLABLE = frozenset({channelwire.OP_EXEC, *channelwire.STREAM_OPS})
# The calls made many times a second, logged at debug level when they succeed.
_HOT = channelwire.FIRST_OPS
# Each op's answer body on success; the HTTP routes' own functions where they are plain calls.
_OPS: dict[int, Callable[[SandboxManager, channelwire.Call], Awaitable[bytes]]] = {
    channelwire.OP_EXEC: _exec,
    channelwire.OP_PAUSE: _pause,
    channelwire.OP_RESUME: _resume,
    channelwire.OP_FORK: _fork,
    channelwire.OP_CREATE: _create,
}
# Each streamed op's first answer's body on success, and its lines.
_STREAMS: dict[
    int,
    Callable[
        [SandboxManager, channelwire.Call], Awaitable[tuple[bytes, AsyncGenerator[tuple[bytes, bool], None]]]
    ],
] = {channelwire.OP_PROCESS_STREAM: _process_stream}
