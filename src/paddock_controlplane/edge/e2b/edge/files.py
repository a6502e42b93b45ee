"""envd's ``/files``: ``GET`` downloads a file, ``POST`` writes one (``multipart/form-data``, one part per
file named by ``path`` or by the part's filename; or ``application/octet-stream`` with ``path``), through
the same host calls as Paddock's ``/v1/…/files``. A write makes the file's missing parent directories, as
envd does. Either direction may be gzip (``Content-Encoding`` on a write, ``Accept-Encoding`` on a read;
``gzip_body``). Errors are envd's ``{"code", "message"}`` with its statuses (404 missing, 400 bad path,
413 over the upload cap, 507 full).

Files are read and written as root whatever E2B user the SDK names: Paddock's file calls take no user
(docs/e2b.md, Users); the user only places a relative path (``/home/user``, ``/root`` for ``root``)."""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message

from paddock_controlplane.edge.e2b.edge import gzip_body
from paddock_controlplane.edge.e2b.edge.context import Call
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.sandboxes import commands
from paddock_controlplane.sandboxes.activity import touch
from paddock_core import errors

#: Parts of one multipart upload (the SDK sends one per file).
MAX_FILES = 100


def envd_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _path(request: Request, given: str | None) -> str:
    path = given if given is not None else request.query_params.get("path", "")
    if not path:
        raise errors.ValidationFailed.field("path", "is required")
    if "\0" in path or len(path) > 4096:
        raise errors.ValidationFailed.field("path", "must be under 4096 bytes, without NUL")
    if not path.startswith("/"):
        # envd resolves a relative path in the user's home; Paddock's images run as root.
        path = posixpath.join("/root" if _user(request) == "root" else "/home/user", path)
    return posixpath.normpath(path)


def _user(request: Request) -> str:
    return request.query_params.get("username", "") or "user"


def _failure(exc: Exception) -> JSONResponse:
    if isinstance(exc, errors.PaddockError):
        status = 400 if exc.status == 409 else exc.status
        return envd_error(status, exc.message)
    if isinstance(exc, hostlink.SandboxGoneError):
        return envd_error(502, f"sandbox {exc} was not found")
    return envd_error(503, f"the sandbox's host did not answer: {exc}")


async def download(call: Call, request: Request) -> Response:
    try:
        path = _path(request, None)
        touch(call.services, call.sandbox.id)
        got = commands.audited_download(
            call.services, call.sandbox, path, await call.link.download(call.sandbox.id, path)
        )
    except (errors.PaddockError, hostlink.HostError, hostlink.SandboxGoneError) as exc:
        if isinstance(exc, errors.NotFound):
            return envd_error(404, f"path '{request.query_params.get('path', '')}' does not exist")
        return _failure(exc)
    headers = {
        "Content-Disposition": f'attachment; filename="{posixpath.basename(path)}"',
        "Vary": "Accept-Encoding",
    }
    if gzip_body.accepts_gzip(request.headers.get("accept-encoding", "")):
        headers["Content-Encoding"] = "gzip"
        body = gzip_body.compressed(got.chunks)
        return StreamingResponse(body, media_type="application/octet-stream", headers=headers)
    if got.size is not None:
        headers["Content-Length"] = str(got.size)
    return StreamingResponse(got.chunks, media_type="application/octet-stream", headers=headers)


async def _write(call: Call, path: str, chunks: AsyncIterator[bytes], limit: int) -> dict[str, Any]:
    """The guest's write makes the missing parents itself (mode 0755, as envd does): no ``mkdir -p``
    process first, which cost every upload a process start in the sandbox."""
    size = await commands.write_file(call.services, call.link, call.sandbox.id, path, chunks, limit)
    commands.audit_file(call.services, call.sandbox, path, size, "write")
    return {"name": posixpath.basename(path), "type": "file", "path": path}


async def _file_chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(commands.UPLOAD_PIECE_BYTES):
        yield chunk


def _over(request: Request, chunks: AsyncIterator[bytes]) -> Request:
    """``request`` with ``chunks`` as its body (an inflated gzip upload, read as a plain one)."""
    pieces = aiter(chunks)

    async def receive() -> Message:
        piece = await anext(pieces, None)
        return {"type": "http.request", "body": piece or b"", "more_body": piece is not None}

    return Request(request.scope, receive)


async def upload(call: Call, request: Request) -> Response:
    limit = call.services.settings.max_upload_bytes
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        return envd_error(413, f"upload is over the {limit}-byte limit")
    encoding = request.headers.get("content-encoding", "").split(";", 1)[0].strip().lower()
    if encoding not in ("", "identity", "gzip"):
        return envd_error(400, f"Content-Encoding: {encoding} is not gzip or identity")
    inflated: gzip_body.Inflated | None = None
    try:
        if encoding == "gzip":
            inflated = await gzip_body.inflate_checked(request.stream(), limit)
            request = _over(request, inflated.chunks())
        return await _upload(call, request, limit)
    except errors.PaddockError as exc:
        return _failure(exc)
    finally:
        if inflated is not None:
            inflated.close()


async def _upload(call: Call, request: Request, limit: int) -> Response:
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    written: list[dict[str, Any]] = []
    try:
        if content_type == "multipart/form-data":
            async with request.form(max_files=MAX_FILES, max_fields=MAX_FILES) as form:
                parts = [part for _, part in form.multi_items() if isinstance(part, UploadFile)]
                if not parts:
                    return envd_error(400, "file: no file part in the multipart body")
                given = request.query_params.get("path")
                for part in parts:
                    path = _path(request, given if given and len(parts) == 1 else part.filename)
                    written.append(await _write(call, path, _file_chunks(part), limit))
        elif content_type in ("application/octet-stream", ""):
            path = _path(request, None)
            written.append(await _write(call, path, request.stream(), limit))
        else:
            return envd_error(
                400, f"Content-Type: {content_type} is not multipart/form-data or application/octet-stream"
            )
    except (errors.PaddockError, hostlink.HostError, hostlink.SandboxGoneError) as exc:
        return _failure(exc)
    return JSONResponse(written)
