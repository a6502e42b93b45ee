"""Exec and files (§11.5, §11.6). Streams are unwrapped: NDJSON frames and raw bytes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from paddock_controlplane.edge.api import caller
from paddock_controlplane.edge.api.deps import (
    FileCallerDep,
    SandboxPrincipalDep,
    ServicesDep,
    scope_principal,
)
from paddock_controlplane.edge.api.errors import error_response
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body, unknown_fields
from paddock_controlplane.records import queries, validation
from paddock_controlplane.records.schemas.commands import ExecRequest, FileUrlRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import commands, file_urls, fileops
from paddock_core import envelope, errors, fastlane, jsonbody
from paddock_core.timeutil import rfc3339

router = APIRouter(prefix="/v1/sandboxes", tags=["exec and files"], route_class=BoundaryRoute)
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# stdin is bytes for the command, streamed to it and never stored: a NUL there is data. Everywhere
# else (cmd, args, env) the kernel would cut the string at it.
EXEC_NUL_ALLOWED = frozenset({"stdin"})


def _path(request: Request) -> str:
    return validation.guest_path(request.query_params.get("path"))  # a 400 naming ``path``


@router.post("/{sandbox_id}/exec", response_model=None)
async def exec_command(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse | StreamingResponse:
    body = await optional_body(request, ExecRequest, EXEC_NUL_ALLOWED)
    if request.query_params.get("stream", "").lower() == "true" or body.stream:
        sandbox, env = await commands.prepare_exec(services, principal.user_id, sandbox_id, body)
        return StreamingResponse(
            commands.exec_stream(services, sandbox, body, env),
            media_type="application/x-ndjson",
            headers=STREAM_HEADERS,
        )
    return await _buffered(services, sandbox_id, principal.user_id, body, request.receive)


async def _buffered(
    services: Services, sandbox_id: str, user_id: str, body: ExecRequest, receive: fastlane.Receive
) -> JSONResponse:
    """A buffered exec whose client disconnects is killed too."""
    sandbox, env = await commands.prepare_exec(services, user_id, sandbox_id, body)
    result = await fastlane.unless_disconnected(receive, commands.exec_buffered(services, sandbox, body, env))
    if result is None:
        result = {"result": {"stdout": "", "stderr": "", "exit_code": -1, "error": "client gone"}}
    # A JSONResponse of plain data skips FastAPI's jsonable_encoder walk (~0.4 ms of CPU per exec).
    return JSONResponse(envelope.success(result))


async def _fast_exec(
    scope: fastlane.Scope, params: dict[str, str], raw: bytes, receive: fastlane.Receive
) -> JSONResponse | None:
    """The fast lane's buffered exec; streams and bodies that do not validate go to the route above."""
    if b"stream" in scope.get("query_string", b"") or "\x00" in params["sandbox_id"]:
        return None  # the route serves streams and renders the 400 for a NUL
    try:
        # The same parser as the route (NUL, NaN, depth); a body it refuses goes on to the route,
        # which renders the 400.
        data = jsonbody.parse(raw, nul_allowed=EXEC_NUL_ALLOWED) if raw.strip() else {}
        if unknown_fields(data, ExecRequest):
            return None  # the route names them in its Warning header
        body = ExecRequest.model_validate(data)
    except ValueError:
        return None
    if body.stream:
        return None
    try:
        services, principal = await scope_principal(scope, params["sandbox_id"])
        return await _buffered(services, params["sandbox_id"], principal.user_id, body, receive)
    except errors.PaddockError as exc:
        return error_response(exc)


FAST_ROUTES = [fastlane.FastRoute("POST", r"/v1/sandboxes/(?P<sandbox_id>[^/]+)/exec", _fast_exec)]


# Files beyond one file's bytes (fileops: run inside the sandbox). Declared before ``/files`` so that
# the fixed paths win.


async def _while_connected(request: Request, operation: Awaitable[dict[str, Any]]) -> Response:
    """A read's JSend answer; it ends with its caller (``caller.py``). An operation that changes the tree
    (mkdir, rename, remove) is awaited as it is, to its end."""
    return await caller.while_connected(
        request, operation, lambda result: JSONResponse(envelope.success(result))
    )


def _depth(request: Request) -> int:
    return validation.listing_depth(request.query_params.get("depth"), fileops.MAX_DEPTH)


@router.get("/{sandbox_id}/files/list")
async def list_files(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> Response:
    path, depth = _path(request), _depth(request)
    return await _while_connected(
        request, fileops.list_dir(services, principal.user_id, sandbox_id, path, depth)
    )


@router.get("/{sandbox_id}/files/stat")
async def stat_file(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> Response:
    path = _path(request)
    return await _while_connected(request, fileops.stat(services, principal.user_id, sandbox_id, path))


@router.post("/{sandbox_id}/files/mkdir")
async def make_dir(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    # 200 either way, as every JSend success (spec §5.1); ``created`` says whether it was made now.
    result = await fileops.make_dir(services, principal.user_id, sandbox_id, _path(request))
    return JSONResponse(envelope.success(result))


@router.post("/{sandbox_id}/files/rename")
async def rename_file(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    source = validation.guest_path(request.query_params.get("source"), "source")
    destination = validation.guest_path(request.query_params.get("destination"), "destination")
    result = await fileops.rename(services, principal.user_id, sandbox_id, source, destination)
    return JSONResponse(envelope.success(result))


@router.delete("/{sandbox_id}/files")
async def remove_file(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    path = _path(request)
    await fileops.remove(services, principal.user_id, sandbox_id, path)
    return JSONResponse(envelope.success({"path": path, "removed": True}))


@router.put("/{sandbox_id}/files/tar")
async def put_tar(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    length = request.headers.get("content-length")
    result = await fileops.upload_tar(
        services,
        principal.user_id,
        sandbox_id,
        _path(request),
        request.stream(),
        int(length) if length and length.isdigit() else None,
    )
    return JSONResponse(envelope.success(result))


@router.get("/{sandbox_id}/files/tar", response_model=None)
async def get_tar(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> StreamingResponse:
    download = await fileops.download_tar(services, principal.user_id, sandbox_id, _path(request))
    headers = {"Content-Length": str(download.size)} if download.size is not None else {}
    return StreamingResponse(download.chunks, media_type="application/x-tar", headers=headers)


@router.get("/{sandbox_id}/files/watch", response_model=None)
async def watch_dir(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> StreamingResponse:
    recursive = request.query_params.get("recursive", "").lower() == "true"
    lines = await fileops.watch(services, principal.user_id, sandbox_id, _path(request), recursive)
    return StreamingResponse(lines, media_type="application/x-ndjson", headers=STREAM_HEADERS)


@router.post("/{sandbox_id}/files/url")
async def file_url(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    """A signed link that reads (``GET``) or writes (``PUT``) ``path`` without a key until it expires
    (``sandboxes/file_urls.py``); the owner's key or the sandbox's token makes one, for its sandbox."""
    body = await optional_body(request, FileUrlRequest)
    path = validation.guest_path(body.path)
    async with services.sessions() as session:
        await queries.get_owned(session, principal.user_id, sandbox_id)  # 404 for anyone else's
    expires = int(services.clock().timestamp()) + body.expires_in_s
    secret = services.settings.secret_key.get_secret_value()
    signed = file_urls.query(secret, sandbox_id, body.operation, path, expires)
    relative = f"/v1/sandboxes/{sandbox_id}/files?{urlencode(signed)}"
    return envelope.success(
        {
            "url": str(request.base_url).rstrip("/") + relative,
            "path": relative,
            "method": file_urls.METHODS[body.operation],
            "expires_at": rfc3339(dt.datetime.fromtimestamp(expires, dt.UTC)),
        }
    )


@router.put("/{sandbox_id}/files")
async def put_file(
    sandbox_id: str, request: Request, user_id: FileCallerDep, services: ServicesDep
) -> JSONResponse:
    path = _path(request)
    length = request.headers.get("content-length")
    result = await commands.upload(
        services,
        user_id,
        sandbox_id,
        path,
        request.stream(),
        int(length) if length and length.isdigit() else None,
    )
    return JSONResponse(envelope.success(result))


@router.get("/{sandbox_id}/files", response_model=None)
async def get_file(
    sandbox_id: str, request: Request, user_id: FileCallerDep, services: ServicesDep
) -> StreamingResponse:
    path = _path(request)
    download = await commands.download(services, user_id, sandbox_id, path)
    headers = {"Content-Length": str(download.size)} if download.size is not None else {}
    return StreamingResponse(download.chunks, media_type="application/octet-stream", headers=headers)
