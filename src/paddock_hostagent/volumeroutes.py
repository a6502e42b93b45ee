"""The internal API's volume routes (``/internal/v1``, issue #34): parse, call one manager method, return
a schema. Volumes themselves (``/volumes``), their files (``/volumes/{id}/content/…``, E2B's volume
content API: ``sandboxes/volume_content.py``) and their mounts in a sandbox (``/sandboxes/{id}/volumes``)."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Query, Request, Response

from paddock_hostagent.routes import Manager
from paddock_hostagent.sandboxes import volume_content
from paddock_hostagent.schemas import (
    DetachResult,
    VolumeCloneBody,
    VolumeCreateBody,
    VolumeDeleted,
    VolumeDirBody,
    VolumeEntry,
    VolumeEntryMetadata,
    VolumeListing,
    VolumeMetadataBody,
    VolumeMountBody,
    VolumeMountView,
    VolumeResizeBody,
    VolumeView,
)

router = APIRouter(prefix="/internal/v1")


@router.post("/volumes")
async def create_volume(body: VolumeCreateBody, manager: Manager) -> VolumeView:
    return await manager.volumes.create(body)


@router.get("/volumes/{volume_id}")
async def get_volume(volume_id: str, manager: Manager) -> VolumeView:
    return manager.volumes.get(volume_id)


@router.post("/volumes/{volume_id}/clone")
async def clone_volume(volume_id: str, body: VolumeCloneBody, manager: Manager) -> VolumeView:
    return await manager.volumes.clone(volume_id, body)


@router.patch("/volumes/{volume_id}")
async def resize_volume(volume_id: str, body: VolumeResizeBody, manager: Manager) -> VolumeView:
    return await manager.volumes.resize(volume_id, body.size_mib)


@router.delete("/volumes/{volume_id}")
async def delete_volume(volume_id: str, manager: Manager) -> VolumeDeleted:
    return await manager.volumes.delete(volume_id)


# -- a volume's files ---------------------------------------------------------------------------

_PATH = Query(max_length=4096)
_ID = Query(default=None, ge=0, le=2**32 - 2)


@router.get("/volumes/{volume_id}/content/path")
async def stat_volume_path(volume_id: str, manager: Manager, path: str = _PATH) -> VolumeEntry:
    return await volume_content.run(manager.volumes, volume_id, partial(volume_content.stat_path, path=path))


@router.get("/volumes/{volume_id}/content/dir")
async def list_volume_dir(
    volume_id: str, manager: Manager, path: str = _PATH, depth: int = Query(default=1)
) -> VolumeListing:
    listed = await volume_content.run(
        manager.volumes, volume_id, partial(volume_content.list_dir, path=path, depth=depth)
    )
    return VolumeListing(entries=listed)


@router.post("/volumes/{volume_id}/content/dir")
async def make_volume_dir(volume_id: str, body: VolumeDirBody, manager: Manager) -> VolumeEntry:
    work = partial(
        volume_content.make_dir,
        path=body.path,
        uid=body.uid,
        gid=body.gid,
        mode=body.mode,
        parents=body.parents,
    )
    return await volume_content.run(manager.volumes, volume_id, work)


@router.get("/volumes/{volume_id}/content/file")
async def read_volume_file(volume_id: str, manager: Manager, path: str = _PATH) -> Response:
    data = await volume_content.run(manager.volumes, volume_id, partial(volume_content.read_file, path=path))
    return Response(data, media_type="application/octet-stream")


@router.put("/volumes/{volume_id}/content/file")
async def write_volume_file(
    volume_id: str,
    request: Request,
    manager: Manager,
    path: str = _PATH,
    uid: int | None = _ID,
    gid: int | None = _ID,
    mode: int | None = Query(default=None, ge=0, le=0o7777),
) -> VolumeEntry:
    data = await request.body()  # refused past VOLUME_FILE_BYTES as it arrives (routes.BODY_ROUTES)
    work = partial(volume_content.write_file, path=path, data=data, uid=uid, gid=gid, mode=mode)
    return await volume_content.run(manager.volumes, volume_id, work)


@router.patch("/volumes/{volume_id}/content/path")
async def update_volume_path(volume_id: str, body: VolumeMetadataBody, manager: Manager) -> VolumeEntry:
    work = partial(volume_content.update, path=body.path, uid=body.uid, gid=body.gid, mode=body.mode)
    return await volume_content.run(manager.volumes, volume_id, work)


@router.delete("/volumes/{volume_id}/content/path")
async def remove_volume_path(volume_id: str, manager: Manager, path: str = _PATH) -> VolumeEntryMetadata:
    await volume_content.run(manager.volumes, volume_id, partial(volume_content.remove, path=path))
    return VolumeEntryMetadata()


@router.post("/sandboxes/{sandbox_id}/volumes")
async def attach_volume(sandbox_id: str, body: VolumeMountBody, manager: Manager) -> VolumeMountView:
    return await manager.volumes.attach(sandbox_id, body)


@router.delete("/sandboxes/{sandbox_id}/volumes/{volume_id}")
async def detach_volume(sandbox_id: str, volume_id: str, manager: Manager) -> DetachResult:
    await manager.volumes.detach(sandbox_id, volume_id)
    return DetachResult()
