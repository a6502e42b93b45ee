"""The edge's one ASGI app: which sandbox and port a request is for, and who may make it.

- The sandbox and port come from ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` (what the SDK sends when
  ``E2B_SANDBOX_URL`` is set) or from the host ``<port>-<sandbox id>.<domain>`` (the ingress's names).
- A sandbox that is missing, gone or not running answers 502 "… was not found": the SDK reads that as
  the sandbox not running (``SandboxNotRunningException``). A paused one whose E2B ``autoResume`` is on
  is resumed first, as E2B's auto-resume does on an SDK call or port traffic; requests that find it
  paused at once share one resume. Its lifetime then starts again, and one woken from hibernation runs
  its template's start command (``fresh_start.resume_on_activity``).
- Port 49983 is envd, served here; it requires the sandbox's ``envdAccessToken`` in ``X-Access-Token``
  (``identity.envd_access_token``). The user comes by Basic auth (``user``/``root``; none: the image's).
- Any other port goes to that port of the sandbox, as the ingress does (``user_ports``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sqlalchemy import bindparam, select
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from paddock_controlplane.edge.api import caller
from paddock_controlplane.edge.e2b import errors as e2b_errors
from paddock_controlplane.edge.e2b import fresh_start, identity, store
from paddock_controlplane.edge.e2b.edge import connect, files, filesystem, interpreter, process, user_ports
from paddock_controlplane.edge.e2b.edge.connect import ConnectError
from paddock_controlplane.edge.e2b.edge.context import USERS, Call, audited_as, mapped
from paddock_controlplane.edge.ingress.routing import parse_host
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.queries import running_sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import CLOSED, SandboxStatus
from paddock_core import errors
from paddock_core.logging import get_logger

log = get_logger("paddock.e2b.edge")

ENVD_PORT = identity.ENVD_PORT
INTERPRETER_PORT = identity.INTERPRETER_PORT
#: Each service's unary, server-streaming and client-streaming methods.
SERVICES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "process.Process": (process.UNARY, process.STREAMS, process.CLIENT_STREAMS),
    "filesystem.Filesystem": (filesystem.UNARY, filesystem.STREAMS, {}),
}
#: Per service, the unary calls that end with their caller (the modules' ``READS``).
READS: dict[str, frozenset[str]] = {
    "process.Process": process.READS,
    "filesystem.Filesystem": filesystem.READS,
}
_BY_ID = select(Sandbox).where(Sandbox.id == bindparam("sandbox_id"))


def not_found(sandbox_id: str) -> Response:
    return JSONResponse(
        {"code": 502, "message": f"The sandbox {sandbox_id} was not found", "sandboxId": sandbox_id},
        status_code=502,
    )


def target_of(request: Request, services: Services) -> tuple[str, int] | None:
    """The sandbox id and port a request names; None when it names none."""
    sandbox_id = request.headers.get("e2b-sandbox-id", "")
    port_text = request.headers.get("e2b-sandbox-port", "")
    if sandbox_id:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            return None
        return sandbox_id, int(port_text)
    host = request.headers.get("host", "")
    domain = identity.domain(services.settings)
    name, sep, port = domain.rpartition(":")  # the ingress's URL domain may carry its port
    domain = name if sep and port.isdigit() else domain
    target = parse_host(host, domain) if domain else None
    return (target.sandbox_id, target.port) if target else None


def _user(request: Request) -> str | Response | None:
    """The E2B user named by Basic auth (``user:``), None when the SDK names nobody (its default)."""
    header = request.headers.get("authorization", "")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return JSONResponse({"code": 401, "message": "Authorization: must be Basic <user>:"}, status_code=401)
    try:
        user = base64.b64decode(value, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        return JSONResponse(
            {"code": 401, "message": "Authorization: invalid Basic credentials"}, status_code=401
        )
    if user not in USERS:
        return JSONResponse(
            {"code": 400, "message": f"Authorization: user {user!r} is not one of {', '.join(USERS)}"},
            status_code=400,
        )
    return user


class EdgeApp:
    def __init__(self, services: Services) -> None:
        self.services = services
        #: The resume under way for each auto-resuming sandbox, shared by the requests that found it paused.
        self._wakes: dict[str, asyncio.Task[None]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                return
            await user_ports.websocket(scope, receive, send)
            return
        request = Request(scope, receive)
        response = await self.handle(request)
        await response(scope, receive, send)

    async def sandbox(self, sandbox_id: str, request: Request, port: int) -> Sandbox | Response | None:
        """The running sandbox a request is for; None when there is none (missing, gone, or paused
        without ``autoResume``, or paused and the request carries nothing that would open it); a
        Response when its resume was refused (no room, no credit)."""
        if len(sandbox_id) > 64:
            return None
        services = self.services
        # A running sandbox used a moment ago is in the exec path's cache (``running_sandbox``'s, 1 s,
        # dropped at once by any change this process makes): a command costs no database trip, as on /v1.
        cached = services.running.get(sandbox_id)
        if cached is not None:
            return cached
        row = await services.reads.first(_BY_ID, {"sandbox_id": sandbox_id})
        if row is None or row.status in (*CLOSED, SandboxStatus.ERROR):
            return None
        if row.status == SandboxStatus.PAUSED:
            async with services.sessions() as session:
                e2b_row = await store.get(session, sandbox_id)
            if e2b_row is None or not e2b_row.auto_resume or not self._may_wake(request, row, port):
                return None
            refused = await self._wake(row)
            if refused is not None:
                return refused
        try:
            return await running_sandbox(services, row.user_id, sandbox_id)
        except errors.PaddockError:
            return None

    def _may_wake(self, request: Request, sandbox: Sandbox, port: int) -> bool:
        """Whether the request would be let in once the sandbox runs, checked before it is resumed: a
        sandbox id is no secret, and a stranger's request must not run (and bill) someone's sandbox
        again. The sandbox's token (``X-Access-Token`` or ``e2b-traffic-access-token``) opens every
        port; a signed URL opens envd's ``/files``; public traffic opens the other ports, as the
        ingress wakes a sandbox with ingress on for anyone."""
        if identity.carries_token(self.services.settings, sandbox.id, request.headers):
            return True
        if port == ENVD_PORT:
            return request.url.path == "/files" and self._refusal(request, sandbox) is None
        return port != INTERPRETER_PORT and bool(sandbox.ingress_enabled)

    async def _wake(self, row: Sandbox) -> Response | None:
        task = self._wakes.get(row.id)
        if task is None:
            task = asyncio.create_task(self._resume(row.user_id, row.id))
            self._wakes[row.id] = task
            task.add_done_callback(lambda _: self._wakes.pop(row.id, None))
        try:
            await asyncio.shield(task)
        except errors.InvalidState:
            return None  # resumed meanwhile by another path (a connect, the ingress): waited for next
        except errors.PaddockError as exc:  # no room on its host, no credit, over the plan's slots
            return e2b_errors.from_paddock(
                exc, f"sandbox {row.id} is paused and could not resume: {exc.message}"
            )
        return None

    async def _resume(self, user_id: str, sandbox_id: str) -> None:
        resumed = await fresh_start.resume_on_activity(self.services, user_id, sandbox_id)
        log.info("e2b_auto_resume", sandbox_id=sandbox_id, status=resumed.status)

    async def handle(self, request: Request) -> Response:
        target = target_of(request, self.services)
        if target is None:
            return JSONResponse(
                {
                    "code": 400,
                    "message": "E2b-Sandbox-Id and E2b-Sandbox-Port (1..65535) are required, "
                    "or a host <port>-<sandbox id>.<domain>",
                },
                status_code=400,
            )
        sandbox_id, port = target
        sandbox = await self.sandbox(sandbox_id, request, port)
        if sandbox is None:
            return not_found(sandbox_id)
        if isinstance(sandbox, Response):
            return sandbox
        if port == ENVD_PORT:
            return await self.envd(request, sandbox)
        if port == INTERPRETER_PORT:
            return await interpreter.handle(self.services, sandbox, request)
        return await user_ports.forward(self.services, sandbox, port, request)

    async def envd(self, request: Request, sandbox: Sandbox) -> Response:
        path = request.url.path
        if path == "/health":
            return Response(status_code=204)
        refused = self._refusal(request, sandbox)
        if refused is not None:
            return JSONResponse({"code": 401, "message": refused}, status_code=401)
        actor = "envd" if "x-access-token" in request.headers else "signed_url"
        audited_as(request, sandbox, actor)
        user = _user(request)
        if isinstance(user, Response):
            return user
        link = await hostlink.for_host(self.services, sandbox.host_id)
        call = Call(self.services, sandbox, link, user, actor)
        if path == "/files":
            if request.method == "GET":
                return await files.download(call, request)
            if request.method == "POST":
                return await files.upload(call, request)
            return JSONResponse(
                {"code": 405, "message": f"{request.method} /files is not allowed"}, status_code=405
            )
        service, _, method = path.strip("/").partition("/")
        if service in SERVICES and request.method == "POST":
            return await self.rpc(call, request, service, method)
        return JSONResponse(
            {"code": 404, "message": f"{request.method} {path} is not served by envd"}, status_code=404
        )

    def _refusal(self, request: Request, sandbox: Sandbox) -> str | None:
        """Why envd refuses the request (None: it may go on). The sandbox's token in ``X-Access-Token``
        opens all of it; without the header, ``/files`` also opens to a signed URL (the SDK's
        ``download_url``/``upload_url``: ``signature``, ``signature_expiration``, ``username``), as
        envd's does."""
        settings, params = self.services.settings, request.query_params
        token = request.headers.get("x-access-token")
        if token is None and request.url.path == "/files" and "signature" in params:
            return identity.check_file_signature(
                settings,
                sandbox.id,
                method=request.method,
                path=params.get("path", ""),
                user=params.get("username", ""),
                signature=params["signature"],
                expiration=params.get("signature_expiration"),
                now=time.time(),
            )
        if not identity.check_envd_access_token(settings, sandbox.id, token or ""):
            return "X-Access-Token: missing or not this sandbox's (or, for /files, a signed URL)"
        return None

    async def rpc(self, call: Call, request: Request, service: str, method: str) -> Response:
        unary, streams, client_streams = SERVICES[service]
        stream = connect.is_stream(request.headers.get("content-type", ""))
        try:
            if stream and method in client_streams:
                # Read as it arrives: each message acts before the next comes (input reaches the
                # process while the SDK's stream stays open); the one answer follows the request's end.
                with mapped():
                    answer = await client_streams[method](call, connect.stream_messages(request.stream()))
                return Response(
                    connect.envelope(answer) + connect.end_of_stream(), media_type=connect.STREAM_CONTENT_TYPE
                )
            body = await connect.read_body(request.stream())
            if stream and method in streams:
                message = connect.stream_request(body)
                return StreamingResponse(
                    _enveloped(streams[method](call, message)), media_type=connect.STREAM_CONTENT_TYPE
                )
            if not stream and method in unary:
                work = unary[method](call, connect.unary_request(body))
                with mapped():
                    if method in READS[service]:
                        # A read whose caller gives up takes its command in the sandbox with it, as
                        # /v1's do (``edge/api/caller.py``).
                        return await caller.while_connected(request, work, JSONResponse)
                    return JSONResponse(await work)
            raise ConnectError("unimplemented", f"{service}/{method} is not served by Paddock's envd")
        except ClientDisconnect:
            return Response(status_code=499)  # the client went away mid-request: nobody reads this
        except ConnectError as exc:
            if stream:
                return Response(connect.end_of_stream(exc), media_type=connect.STREAM_CONTENT_TYPE)
            return JSONResponse(exc.wire(), status_code=connect.HTTP_STATUS[exc.code])


async def _enveloped(messages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """A server stream's envelopes: each message, then the end (with the error that ended it, if any)."""
    error: ConnectError | None = None
    last = b""  # a process's end event goes out with the stream's end, in one write
    try:
        with mapped():
            async for message in messages:
                if "end" in (message.get("event") or {}):
                    last = connect.envelope(message)
                    continue
                yield connect.envelope(message)
    except ConnectError as exc:
        error = exc
    except Exception as exc:  # the stream is already 200: the error goes in its end envelope
        log.exception("e2b_edge_stream_failed", error=str(exc))
        error = ConnectError("internal", "internal error")
    finally:
        aclose: Callable[[], Awaitable[None]] | None = getattr(messages, "aclose", None)
        if aclose is not None:
            await aclose()
    yield last + connect.end_of_stream(error)
