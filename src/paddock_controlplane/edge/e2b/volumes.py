"""E2B's volumes on Paddock's local volumes (docs/volumes.md): ``GET``/``POST /volumes``,
``GET``/``DELETE /volumes/{volumeID}`` and a create's ``volumeMounts``, each calling
``resources.volumes`` as ``/v1/volumes`` does.

What differs from E2B (docs/e2b.md): an E2B volume has no size, so one is made at
:data:`DEFAULT_SIZE_MIB` (or the plan's largest disk, when that is less); it is sparse, so only what is
written takes space. E2B's volume content API (``/volumecontent/…``) is served by ``volume_content``,
with the ``token`` a volume carries (``identity.volume_token``). A volume is mounted read-write into one
sandbox at a time (Paddock's rule: one writer), so a second sandbox naming it while the first still
runs is a 409 naming the holder; E2B mounts one volume into many sandboxes at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.edge.api.routes.bodies import optional_body
from paddock_controlplane.edge.e2b import callers, identity
from paddock_controlplane.edge.e2b.schemas import NewVolume, VolumeMount
from paddock_controlplane.records.schemas.volumes import VolumeAttachment, VolumeCreateRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.volumes import Volume
from paddock_controlplane.records.volumes import VolumeAttachment as AttachmentRow
from paddock_controlplane.resources import accounts, volumes
from paddock_core import errors

router = APIRouter()

#: The size an E2B volume is made with (E2B's have none): 10 GiB, sparse, or the plan's largest disk.
DEFAULT_SIZE_MIB = 10240
#: Volumes one list shows (every plan keeps fewer: docs/volumes.md, plan caps).
MAX_LISTED = 1000


def _view(volume: dict[str, Any]) -> dict[str, Any]:
    return {"volumeID": volume["id"], "name": volume["name"]}


def _with_token(services: Services, volume: dict[str, Any]) -> dict[str, Any]:
    """E2B's ``VolumeAndToken``: with the token the volume content API takes (``volume_content``)."""
    return {**_view(volume), "token": identity.volume_token(services.settings, volume["id"])}


@router.post("/volumes", status_code=201)
async def create(request: Request) -> dict[str, Any]:
    services, principal = await callers.caller(request.scope, None)
    body = await optional_body(request, NewVolume)
    async with services.sessions() as session:
        plan = await accounts.cached_plan(session, principal.plan_id)
    size_mib = min(DEFAULT_SIZE_MIB, plan.max_disk_mib)
    made = await volumes.create(
        services, principal.user_id, VolumeCreateRequest(name=body.name, size_mib=size_mib)
    )
    return _with_token(services, made)


@router.get("/volumes")
async def list_volumes(request: Request) -> list[dict[str, Any]]:
    services, principal = await callers.caller(request.scope, None)
    async with services.sessions() as session:
        items, _ = await volumes.page(session, principal.user_id, limit=MAX_LISTED, offset=0)
    return [_view(item) for item in items]


@router.get("/volumes/{volume_id}")
async def get(volume_id: str, request: Request) -> dict[str, Any]:
    services, principal = await callers.caller(request.scope, None)
    async with services.sessions() as session:
        return _with_token(services, await volumes.detail(session, principal.user_id, volume_id))


@router.delete("/volumes/{volume_id}", status_code=204)
async def delete(volume_id: str, request: Request) -> Response:
    services, principal = await callers.caller(request.scope, None)
    await volumes.delete_volume(services, principal.user_id, volume_id)
    return Response(status_code=204)


# --- a create's volumeMounts ---------------------------------------------------------------------


def attachments(mounts: Sequence[VolumeMount] | None) -> list[VolumeAttachment] | None:
    """``volumeMounts: [{name, path}]`` as the native create's ``volumes`` (read-write, by name)."""
    if not mounts:
        return None
    return [VolumeAttachment(volume_id=mount.name, mount_path=mount.path) for mount in mounts]


_NATIVE_TO_E2B = (("volumes[", "volumeMounts["), ("].volume_id", "].name"), ("].mount_path", "].path"))


def renamed(exc: errors.PaddockError) -> errors.PaddockError:
    """A create's error about its volumes, naming E2B's fields (``volumeMounts[i].name``/``.path``)."""
    for native, e2b in _NATIVE_TO_E2B:
        exc.message = exc.message.replace(native, e2b)
        exc.fields = {key.replace(native, e2b): value for key, value in exc.fields.items()}
    if exc.message.startswith("volumes:"):
        exc.message = "volumeMounts:" + exc.message.removeprefix("volumes:")
    return exc


async def mounts_of(session: AsyncSession, sandbox_id: str) -> list[dict[str, str]]:
    """E2B's ``volumeMounts`` of a sandbox (``SandboxDetail``): each volume's name and path."""
    rows = (
        await session.execute(
            select(Volume.name, AttachmentRow.mount_path)
            .join(AttachmentRow, AttachmentRow.volume_id == Volume.id)
            .where(AttachmentRow.sandbox_id == sandbox_id)
            .order_by(AttachmentRow.mount_path)
        )
    ).all()
    return [{"name": str(name), "path": str(path)} for name, path in rows]
