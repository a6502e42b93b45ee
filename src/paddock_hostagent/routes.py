"""The internal API's routes (``/internal/v1``): parse, call one manager method, return a schema."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from paddock_core import fastlane
from paddock_core.bodylimit import BodyRoute
from paddock_hostagent import errors, image_transfer, logs, stats, watches
from paddock_hostagent.builds import BuildManager
from paddock_hostagent.guest.protocol import MAX_CONTROL_PAYLOAD_BYTES, exec_payload_bytes
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.schemas import (
    MAX_LOG_TAIL_LINES,
    VOLUME_FILE_BYTES,
    BandwidthBody,
    BandwidthResult,
    BuildBody,
    BuildView,
    CreateSandboxBody,
    CreateSandboxResult,
    DestroyResult,
    DetachResult,
    DiskMountBody,
    DiskMountView,
    EgressAttempt,
    EgressAttempts,
    EgressBody,
    EgressResult,
    ExecBody,
    ExecResult,
    FileWritten,
    ForkBody,
    HostInfo,
    HostStats,
    ImageFetchBody,
    ImageFetched,
    NetworkAttachBody,
    NetworkAttachment,
    ResizeBody,
    ResizeResult,
    SandboxLog,
    SandboxView,
    SnapshotBody,
    SnapshotDeleted,
    SnapshotView,
    StatusResult,
)

router = APIRouter(prefix="/internal/v1")


async def get_manager(request: Request) -> SandboxManager:
    manager: SandboxManager = request.app.state.manager
    return manager


Manager = Annotated[SandboxManager, Depends(get_manager)]
PathQuery = Annotated[str, Query(alias="path")]


@router.get("/info")
async def info(manager: Manager) -> HostInfo:
    return manager.info()


@router.get("/stats")
async def host_stats(request: Request, manager: Manager) -> HostStats:
    """Every live sandbox's CPU, memory, disk and network use in one answer (stats.py)."""
    sampler: stats.StatsSampler | None = getattr(request.app.state, "stats", None)
    if sampler is None or sampler.runtime is not manager.runtime:
        sampler = request.app.state.stats = stats.for_manager(manager)
    return await asyncio.to_thread(sampler.sample)


@router.post("/sandboxes")
async def create_sandbox(body: CreateSandboxBody, manager: Manager) -> CreateSandboxResult:
    return await manager.create(body)


@router.get("/sandboxes")
async def list_sandboxes(manager: Manager) -> list[SandboxView]:
    return manager.views()


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, manager: Manager) -> SandboxView:
    return manager.get(sandbox_id)


@router.post("/sandboxes/{sandbox_id}/exec", response_model=None)
async def exec_command(
    sandbox_id: str, body: ExecBody, request: Request, manager: Manager
) -> Response | ExecResult:
    check_exec_size(body)
    if not body.stream:
        return await _buffered(manager, sandbox_id, body, request.receive)
    stream = await manager.open_exec(sandbox_id, body)

    async def ndjson() -> AsyncIterator[bytes]:
        try:
            async for frame in stream.frames():
                yield json.dumps(frame, ensure_ascii=False).encode() + b"\n"
        finally:
            await stream.close()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    # The background close also covers a client that leaves before the body starts (then the
    # generator above never runs, and its `finally` with it).
    return StreamingResponse(
        ndjson(), media_type="application/x-ndjson", headers=headers, background=BackgroundTask(stream.close)
    )


@router.put("/sandboxes/{sandbox_id}/files")
async def upload_file(sandbox_id: str, path: PathQuery, request: Request, manager: Manager) -> FileWritten:
    size = await manager.write_file(sandbox_id, path, request.stream())
    return FileWritten(path=path, size=size)


@router.get("/sandboxes/{sandbox_id}/files", response_model=None)
async def download_file(sandbox_id: str, path: PathQuery, manager: Manager) -> Response:
    stack = contextlib.AsyncExitStack()
    size, chunks = await stack.enter_async_context(manager.read_file(sandbox_id, path))

    async def body() -> AsyncIterator[bytes]:
        async with stack:
            async for chunk in chunks:
                yield chunk

    headers = {"Content-Length": str(size)} if size is not None else {}
    return StreamingResponse(
        body(),
        media_type="application/octet-stream",
        headers=headers,
        background=BackgroundTask(stack.aclose),
    )


@router.get("/sandboxes/{sandbox_id}/files/watch", response_model=None)
async def watch_files(
    sandbox_id: str, path: PathQuery, manager: Manager, recursive: Annotated[bool, Query()] = False
) -> Response:
    """NDJSON: the directory's inotify events from the guest, until the client leaves (watches.py)."""
    watch = await watches.open_watch(manager, sandbox_id, path, recursive)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        watch.lines(),
        media_type="application/x-ndjson",
        headers=headers,
        background=BackgroundTask(watch.close),
    )


@router.post("/sandboxes/{sandbox_id}/pause")
async def pause_sandbox(sandbox_id: str, manager: Manager) -> StatusResult:
    return StatusResult(status=await manager.pause(sandbox_id))  # type: ignore[arg-type]


@router.post("/sandboxes/{sandbox_id}/resume")
async def resume_sandbox(sandbox_id: str, manager: Manager) -> StatusResult:
    return StatusResult(status=await manager.resume(sandbox_id))  # type: ignore[arg-type]


@router.post("/sandboxes/{sandbox_id}/hibernate")
async def hibernate_sandbox(sandbox_id: str, manager: Manager) -> StatusResult:
    """Stops the sandbox and frees its slot, keeping its disk (docs/hibernation.md)."""
    return StatusResult(status=await manager.hibernate(sandbox_id))  # type: ignore[arg-type]


@router.post("/sandboxes/{sandbox_id}/wake")
async def wake_sandbox(sandbox_id: str, manager: Manager) -> CreateSandboxResult:
    """Boots a hibernated sandbox from its kept disk (a new address, perhaps)."""
    return await manager.wake(sandbox_id)


@router.post("/sandboxes/{sandbox_id}/fork")
async def fork_sandbox(sandbox_id: str, body: ForkBody, manager: Manager) -> CreateSandboxResult:
    return await manager.fork(sandbox_id, body)


@router.post("/sandboxes/{sandbox_id}/snapshots")
async def snapshot_sandbox(sandbox_id: str, body: SnapshotBody, manager: Manager) -> SnapshotView:
    return await manager.snapshot(sandbox_id, body)


@router.get("/snapshots/{snapshot_id}")
async def get_snapshot(snapshot_id: str, manager: Manager) -> SnapshotView:
    return manager.get_snapshot(snapshot_id)


@router.delete("/snapshots/{snapshot_id}")
async def delete_snapshot(snapshot_id: str, manager: Manager) -> SnapshotDeleted:
    return await manager.delete_snapshot(snapshot_id)


@router.post("/sandboxes/{sandbox_id}/resize")
async def resize_sandbox(sandbox_id: str, body: ResizeBody, manager: Manager) -> ResizeResult:
    return ResizeResult(disk_mib=await manager.resize(sandbox_id, body.disk_mib))


@router.post("/sandboxes/{sandbox_id}/networks")
async def attach_network(sandbox_id: str, body: NetworkAttachBody, manager: Manager) -> NetworkAttachment:
    return await manager.attach_network(sandbox_id, body)


@router.delete("/sandboxes/{sandbox_id}/networks/{network_id}")
async def detach_network(sandbox_id: str, network_id: str, manager: Manager) -> DetachResult:
    await manager.detach_network(sandbox_id, network_id)
    return DetachResult()


@router.post("/sandboxes/{sandbox_id}/disks")
async def attach_disk(sandbox_id: str, body: DiskMountBody, manager: Manager) -> DiskMountView:
    return await manager.attach_disk(sandbox_id, body)


@router.delete("/sandboxes/{sandbox_id}/disks")
async def detach_disk(sandbox_id: str, mount_path: Annotated[str, Query()], manager: Manager) -> DetachResult:
    await manager.detach_disk(sandbox_id, mount_path)
    return DetachResult()


@router.put("/sandboxes/{sandbox_id}/egress")
async def set_egress(sandbox_id: str, body: EgressBody, manager: Manager) -> EgressResult:
    return EgressResult(id=sandbox_id, egress=await manager.set_egress(sandbox_id, body.egress))


@router.get("/egress/attempts")
async def egress_attempts(
    manager: Manager,
    epoch: Annotated[str, Query(max_length=40)] = "",
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> EgressAttempts:
    """The sandboxes' connection attempts for the audit trail (egress.py), from ``after`` on."""
    service = manager.egress
    if service is None:
        return EgressAttempts(epoch="", next=0, lost=0, attempts=[])
    records, last, lost = await service.attempts(epoch, after, limit)
    return EgressAttempts(
        epoch=service.epoch,
        next=last,
        lost=lost,
        attempts=[EgressAttempt.model_validate(record, from_attributes=True) for record in records],
    )


@router.get("/sandboxes/{sandbox_id}/bandwidth")
async def get_bandwidth(sandbox_id: str, manager: Manager) -> BandwidthResult:
    return await manager.bandwidth(sandbox_id)


@router.get("/sandboxes/{sandbox_id}/logs")
async def get_logs(
    sandbox_id: str,
    manager: Manager,
    source: Annotated[Literal["boot", "guest"], Query()] = "boot",
    tail: Annotated[int, Query(ge=1, le=MAX_LOG_TAIL_LINES)] = 100,
) -> SandboxLog:
    """The last ``tail`` lines of the sandbox's boot log or guest console (logs.py)."""
    return await logs.read(manager, sandbox_id, source, tail)


@router.put("/sandboxes/{sandbox_id}/bandwidth")
async def set_bandwidth(sandbox_id: str, body: BandwidthBody, manager: Manager) -> BandwidthResult:
    return await manager.set_bandwidth(sandbox_id, body.quota_bytes)


@router.delete("/sandboxes/{sandbox_id}")
async def destroy_sandbox(sandbox_id: str, manager: Manager) -> DestroyResult:
    await manager.destroy(sandbox_id)
    return DestroyResult()


async def buffered_exec(manager: SandboxManager, sandbox_id: str, body: ExecBody) -> ExecResult:
    """Runs a command to its end; cancelling the call kills the command (the guest kills the process
    group of an exchange that closes early). Served by the HTTP routes and the kept channel alike."""
    stream = await manager.open_exec(sandbox_id, body)
    try:
        return ExecResult(**await stream.collect())
    finally:
        await stream.close()


async def _buffered(
    manager: SandboxManager, sandbox_id: str, body: ExecBody, receive: fastlane.Receive
) -> Response:
    result = await fastlane.unless_disconnected(receive, buffered_exec(manager, sandbox_id, body))
    if result is None:
        return Response(status_code=499)  # nobody is listening any more
    return JSONResponse(result.model_dump(exclude_none=True))


# Room for what the manager adds to the environment (PATH, HOME, HOSTNAME, LANG) and the cwd.
_EXEC_HEADROOM_BYTES = 8192


#: Request bodies, refused as they are read past their cap (``paddock_core.bodylimit``), so no caller
#: makes the agent buffer more: an exec's stdin (the control plane holds it to 8 MiB, JSON's escapes
#: may make that 6 times bigger), a build's base64 context (``BuildBody``), anything else. An upload
#: streams to the guest and is bounded by the control plane.
MAX_EXEC_STDIN_BYTES = 8 << 20
MAX_BODY_BYTES = 8 << 20
BODY_ROUTES = (
    BodyRoute("PUT", r"/internal/v1/sandboxes/[^/]+/files", None),
    BodyRoute("POST", r"/internal/v1/sandboxes/[^/]+/exec", 6 * MAX_EXEC_STDIN_BYTES + (4 << 20), "stdin"),
    BodyRoute("POST", r"/internal/v1/builds", 64 << 20),
    BodyRoute("PUT", r"/internal/v1/volumes/[^/]+/content/file", VOLUME_FILE_BYTES),
)


def body_too_large(limit_bytes: int, field: str) -> errors.HostAgentServerError:
    return errors.PayloadTooLarge(f"{field}: the request body is over the {limit_bytes}-byte limit")


def render_refusal(exc: Exception) -> Response:
    assert isinstance(exc, errors.HostAgentServerError)
    return error_response(exc.status, exc.code, exc.message)


def check_exec_size(body: ExecBody) -> None:
    """413 for a command the guest would refuse (it hangs up on an oversized EXEC frame), and for a
    stdin over ``MAX_EXEC_STDIN_BYTES``."""
    if body.stdin is not None and len(body.stdin) > MAX_EXEC_STDIN_BYTES // 4:
        stdin_bytes = len(body.stdin.encode("utf-8", "surrogatepass"))
        if stdin_bytes > MAX_EXEC_STDIN_BYTES:
            raise errors.PayloadTooLarge(
                f"stdin: {stdin_bytes} bytes, over the {MAX_EXEC_STDIN_BYTES}-byte limit"
            )
    size = exec_payload_bytes(body.cmd, body.args, body.env, body.cwd or "") + len((body.user or "").encode())
    if size > MAX_CONTROL_PAYLOAD_BYTES - _EXEC_HEADROOM_BYTES:
        raise errors.PayloadTooLarge(
            f"cmd, args and env are {size} bytes; the limit is "
            f"{MAX_CONTROL_PAYLOAD_BYTES - _EXEC_HEADROOM_BYTES} (send bulk input as stdin or a file)"
        )


# -- template builds (builds.py) -------------------------------------------------------------------


def builds_of(manager: SandboxManager) -> BuildManager:
    if manager.builds is None:
        raise errors.BadRequest("template builds are not enabled on this host (buildah is missing)")
    return manager.builds


@router.post("/builds")
async def start_build(body: BuildBody, manager: Manager) -> BuildView:
    return builds_of(manager).start(body)


@router.get("/builds/{build_id}")
async def get_build(build_id: str, manager: Manager, after: Annotated[int, Query(ge=0)] = 0) -> BuildView:
    return builds_of(manager).view(build_id, after)


@router.delete("/builds/{build_id}")
async def delete_build(build_id: str, manager: Manager) -> DestroyResult:
    """Cancels a running attempt and removes the template's image once no sandbox boots from it (the
    mark is kept on disk across restarts; a host without builds that fetched the image drops it too)."""
    manager.images.mark_deleted(build_id, manager.settings.id)
    if manager.builds is not None:
        await manager.builds.delete(build_id)
    await manager.drop_deleted_images()
    return DestroyResult()


# -- template images between hosts (image_transfer.py) ---------------------------------------------


@router.get("/images/{image}")
async def get_image(image: str, manager: Manager) -> StreamingResponse:
    """A template's image as a tar stream, for a host that lacks it; a snapshot's disk, as its extents."""
    if image_transfer.is_snapshot(image):
        info = manager.registry.runtime.snapshot_info(image)
        chunks = await image_transfer.stream_snapshot(info, image)
        return StreamingResponse(chunks, media_type="application/octet-stream")
    return StreamingResponse(
        await image_transfer.stream(manager.images, image), media_type="application/x-tar"
    )


@router.post("/images/{image}/fetch")
async def fetch_image(image: str, body: ImageFetchBody, request: Request, manager: Manager) -> ImageFetched:
    """Pulls a template's image from ``source_url`` (the host that holds it) with this call's own token;
    or a snapshot, into this host's disk store."""
    if image_transfer.is_snapshot(image):
        directory = await image_transfer.snapshots_dir_of(manager.registry.runtime)
        snapshot_fetcher = getattr(request.app.state, "snapshot_fetcher", None)
        if snapshot_fetcher is None:
            snapshot_fetcher = request.app.state.snapshot_fetcher = image_transfer.SnapshotFetcher(
                manager.settings.image_fetch_max_mib << 20
            )
        authorization = request.headers.get("authorization", "")
        await snapshot_fetcher.fetch(image, body.source_url, authorization, directory, body.limit_bytes)
        return ImageFetched(image=image, ext4_size_bytes=0)
    fetcher = getattr(request.app.state, "image_fetcher", None)
    if fetcher is None:
        fetcher = request.app.state.image_fetcher = image_transfer.ImageFetcher(
            manager.images, manager.settings.image_fetch_max_mib << 20
        )
    await fetcher.fetch(image, body.source_url, request.headers.get("authorization", ""), body.limit_bytes)
    return ImageFetched(image=image, ext4_size_bytes=image_transfer.recorded_size(manager.images, image))


def fast_routes(authorized: Callable[[str], bool]) -> list[fastlane.FastRoute]:
    """The buffered exec in the fast lane (``paddock_core.fastlane``): a bad token, a stream or a body
    that does not validate goes on to the route above, which answers it."""

    async def fast_exec(
        scope: fastlane.Scope, params: dict[str, str], raw: bytes, receive: fastlane.Receive
    ) -> Response | None:
        if not authorized(fastlane.header(scope, b"authorization")):
            return None
        try:
            body = ExecBody.model_validate_json(raw)
        except ValueError:
            return None
        if body.stream:
            return None
        manager: SandboxManager = scope["app"].state.manager
        try:
            check_exec_size(body)
            return await _buffered(manager, params["sandbox_id"], body, receive)
        except errors.HostAgentServerError as exc:
            return error_response(exc.status, exc.code, exc.message)

    return [fastlane.FastRoute("POST", r"/internal/v1/sandboxes/(?P<sandbox_id>[^/]+)/exec", fast_exec)]


def error_body(code: str, message: str) -> bytes:
    """The internal API's error body: ``{"error": code, "message": ...}``."""
    return json.dumps({"error": code, "message": message}, ensure_ascii=False, separators=(",", ":")).encode()


def error_response(status: int, code: str, message: str) -> Response:
    """An error answer; an overload (429, 503) says when to try again (``Retry-After``)."""
    headers = {"Retry-After": str(errors.Busy.retry_after_s)} if status in (429, 503) else None
    return Response(
        error_body(code, message), status_code=status, media_type="application/json", headers=headers
    )


def validation_reasons(problems: Sequence[Any]) -> str:
    """One line naming each invalid field, for a 400 ``bad_request`` (pydantic's ``errors()``)."""
    reasons = "; ".join(f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in problems)
    return reasons or "invalid request"
