"""E2B's volume content API (``/volumecontent/{volumeID}/…``, e2b-dev/infra ``openapi-volumecontent``):
a volume's files listed, read, written, made, removed and given an owner and mode without a sandbox, as
the SDK's ``Volume`` instance methods do (``list``, ``read_file``, ``write_file``, ``make_dir``,
``remove``, ``get_info``, ``update_metadata``, ``exists``).

The SDK sends ``Authorization: Bearer <token>``, the volume's ``token`` from its create or its
``connect`` (``identity.volume_token``: derived from the volume id, never stored), to the URL in
``E2B_VOLUME_API_URL``; this API answers there, beside the control API. Each call goes to the volume's
host, which works on the volume's filesystem mounted on the host with no symlink followed
(``paddock_hostagent/sandboxes/volume_content.py``); the volume is usable by sandboxes meanwhile.

Where E2B is silent: a missing parent of a written file is made (as envd's own file write does);
``force`` on a write is accepted and changes nothing (a write always replaces the file, as the SDK's
docstring says); ``force`` on ``make_dir`` makes the missing parents. One read or write is at most
``VOLUME_FILE_BYTES`` (64 MiB; 413 beyond), a listing at most 10,000 entries and 32 levels deep.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from paddock_controlplane.edge.api.routes.bodies import optional_body
from paddock_controlplane.edge.e2b import identity
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.volumes import READY, Volume
from paddock_core import errors
from paddock_core.timeutil import rfc3339
from paddock_hostagent.schemas import (
    VolumeDirBody,
    VolumeEntry,
    VolumeEntryMetadata,
    VolumeMetadataBody,
)

router = APIRouter()

#: The deepest listing one call returns (``paddock_hostagent/sandboxes/volume_content.MAX_DEPTH``).
MAX_DEPTH = 32
MAX_PATH_CHARS = 4096

PathParam = Annotated[str, Query(min_length=1, max_length=MAX_PATH_CHARS)]
OwnerParam = Annotated[int | None, Query(ge=0, le=2**32 - 2)]
ModeParam = Annotated[int | None, Query(ge=0, le=0o7777)]


class NewEntry:
    """The query of a write or a ``make_dir``: the new entry's owner and mode, and E2B's ``force``."""

    def __init__(
        self, uid: OwnerParam = None, gid: OwnerParam = None, mode: ModeParam = None, force: bool = False
    ) -> None:
        self.metadata = VolumeEntryMetadata(uid=uid, gid=gid, mode=mode)
        self.force = force


NewEntryQuery = Annotated[NewEntry, Depends()]


class Metadata(BaseModel):
    """``PATCH …/path``'s body (``uid``, ``gid``, ``mode``; each left as it is when absent)."""

    model_config = ConfigDict(extra="ignore")

    uid: StrictInt | None = Field(default=None, ge=0, le=2**32 - 2)
    gid: StrictInt | None = Field(default=None, ge=0, le=2**32 - 2)
    mode: StrictInt | None = Field(default=None, ge=0, le=0o7777)


def _stat(entry: VolumeEntry) -> dict[str, Any]:
    """E2B's ``VolumeEntryStat``."""
    shown: dict[str, Any] = {
        "name": entry.name,
        "type": entry.type,
        "path": entry.path,
        "size": entry.size,
        "mode": entry.mode,
        "uid": entry.uid,
        "gid": entry.gid,
        "atime": rfc3339(entry.atime),
        "mtime": rfc3339(entry.mtime),
        "ctime": rfc3339(entry.ctime),
    }
    if entry.target is not None:
        shown["target"] = entry.target
    return shown


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def _volume(request: Request, volume_id: str) -> tuple[hostlink.HostLink, str]:
    """The host of the volume the bearer token opens: 401 without a token or with another volume's,
    404 for a volume that is not there (or not ready), checked in that order so that an id alone tells
    a caller without its token nothing."""
    services: Services = request.app.state.services
    token = _bearer(request)
    if not token:
        raise errors.Unauthorized("the volume's token is required as Authorization: Bearer <token>")
    if len(volume_id) > 64 or not identity.check_volume_token(services.settings, volume_id, token):
        raise errors.Unauthorized("the token does not open this volume")
    async with services.sessions() as session:
        volume = await session.get(Volume, volume_id)
    if volume is None or volume.status != READY:
        raise errors.NotFound(f"volume {volume_id} not found")
    return await hostlink.for_host(services, volume.host_id), volume.id


@router.get("/volumecontent/{volume_id}/path")
async def get_info(volume_id: str, path: PathParam, request: Request) -> dict[str, Any]:
    link, volume = await _volume(request, volume_id)
    return _stat(await link.stat_volume_path(volume, path))


@router.get("/volumecontent/{volume_id}/dir")
async def list_dir(
    volume_id: str,
    path: PathParam,
    request: Request,
    depth: Annotated[int, Query(ge=1, le=MAX_DEPTH)] = 1,
) -> list[dict[str, Any]]:
    link, volume = await _volume(request, volume_id)
    return [_stat(entry) for entry in await link.list_volume_dir(volume, path, depth)]


@router.post("/volumecontent/{volume_id}/dir", status_code=201)
async def make_dir(volume_id: str, path: PathParam, new: NewEntryQuery, request: Request) -> dict[str, Any]:
    link, volume = await _volume(request, volume_id)
    body = VolumeDirBody(path=path, parents=new.force, **new.metadata.model_dump())
    return _stat(await link.make_volume_dir(volume, body))


@router.get("/volumecontent/{volume_id}/file")
async def read_file(volume_id: str, path: PathParam, request: Request) -> Response:
    link, volume = await _volume(request, volume_id)
    return Response(await link.read_volume_file(volume, path), media_type="application/octet-stream")


@router.put("/volumecontent/{volume_id}/file", status_code=201)
async def write_file(
    volume_id: str,
    path: PathParam,
    request: Request,
    uid: OwnerParam = None,
    gid: OwnerParam = None,
    mode: ModeParam = None,
    force: bool = False,
) -> JSONResponse:
    link, volume = await _volume(request, volume_id)
    data = await request.body()  # bounded by the app's BodyLimit (VOLUME_FILE_BYTES)
    written = await link.write_volume_file(
        volume, path, data, VolumeEntryMetadata(uid=uid, gid=gid, mode=mode)
    )
    return JSONResponse(_stat(written), status_code=201)


@router.patch("/volumecontent/{volume_id}/path")
async def update_metadata(volume_id: str, path: PathParam, request: Request) -> dict[str, Any]:
    link, volume = await _volume(request, volume_id)
    body = await optional_body(request, Metadata)
    asked = VolumeMetadataBody(path=path, uid=body.uid, gid=body.gid, mode=body.mode)
    return _stat(await link.update_volume_path(volume, asked))


@router.delete("/volumecontent/{volume_id}/path", status_code=204)
async def remove(volume_id: str, path: PathParam, request: Request) -> Response:
    link, volume = await _volume(request, volume_id)
    await link.remove_volume_path(volume, path)
    return Response(status_code=204)
