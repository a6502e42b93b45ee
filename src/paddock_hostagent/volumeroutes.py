"""The internal API's volume routes (``/internal/v1``, issue #34): parse, call one manager method, return
a schema. Volumes themselves (``/volumes``) and their mounts in a sandbox (``/sandboxes/{id}/volumes``)."""

from __future__ import annotations

from fastapi import APIRouter

from paddock_hostagent.routes import Manager
from paddock_hostagent.schemas import (
    DetachResult,
    VolumeCloneBody,
    VolumeCreateBody,
    VolumeDeleted,
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


@router.post("/sandboxes/{sandbox_id}/volumes")
async def attach_volume(sandbox_id: str, body: VolumeMountBody, manager: Manager) -> VolumeMountView:
    return await manager.volumes.attach(sandbox_id, body)


@router.delete("/sandboxes/{sandbox_id}/volumes/{volume_id}")
async def detach_volume(sandbox_id: str, volume_id: str, manager: Manager) -> DetachResult:
    await manager.volumes.detach(sandbox_id, volume_id)
    return DetachResult()
