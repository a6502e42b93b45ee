"""A volume's files without a sandbox (docs/volumes.md, "Files without a sandbox"): listed, read, written,
made and removed by the volume's host on the volume's filesystem (``paddock_hostagent/sandboxes/
volume_content.py``: mounted on the host for the call when no sandbox holds it, never through a symlink).

``/v1/volumes/{ref}/files…`` answers with the shapes ``/v1/sandboxes/{id}/files…`` has, so one client
type reads both: an entry is ``{name, path, type: file|dir|symlink|other, size, mode, permissions,
owner, group, modified_at, symlink_target?}``, where a volume's ``owner`` and ``group`` are the numeric
ids (the names live in whichever sandbox's ``/etc/passwd`` mounts it), also given as ``uid`` and ``gid``.
E2B's volume content API (``edge/e2b/volume_content.py``) calls the same host calls with E2B's shapes.
"""

from __future__ import annotations

import stat
from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.volumes import READY
from paddock_controlplane.resources.volumes import get_owned
from paddock_core import errors
from paddock_core.timeutil import rfc3339
from paddock_hostagent.schemas import VolumeDirBody, VolumeEntry, VolumeEntryMetadata

#: How deep one listing goes (the host's bound too: ``volume_content.MAX_DEPTH``).
MAX_DEPTH = 32
_TYPES = {"file": "file", "directory": "dir", "symlink": "symlink"}
_S_IFMT = {"file": stat.S_IFREG, "directory": stat.S_IFDIR, "symlink": stat.S_IFLNK}


def entry_view(entry: VolumeEntry) -> dict[str, Any]:
    """An entry as ``/v1/sandboxes/{id}/files/stat`` shows one (the module says what differs)."""
    shown: dict[str, Any] = {
        "name": entry.name,
        "path": entry.path,
        "type": _TYPES.get(entry.type, "other"),
        "size": entry.size,
        "mode": entry.mode,
        "permissions": stat.filemode(_S_IFMT.get(entry.type, 0) | entry.mode),
        "owner": str(entry.uid),
        "group": str(entry.gid),
        "uid": entry.uid,
        "gid": entry.gid,
        "modified_at": rfc3339(entry.mtime),
    }
    if entry.target is not None:
        shown["symlink_target"] = entry.target
    return shown


async def _host(services: Services, user_id: str, ref: str) -> tuple[hostlink.HostLink, str]:
    """The host of the caller's volume ``ref`` (an id or a name), and its id; 404 for another's."""
    async with services.sessions() as session:
        volume = await get_owned(session, user_id, ref)
    if volume.status != READY:
        raise errors.InvalidState(f"volume {volume.name} is {volume.status}, not ready")
    return await hostlink.for_host(services, volume.host_id), volume.id


async def read(services: Services, user_id: str, ref: str, path: str) -> bytes:
    link, volume_id = await _host(services, user_id, ref)
    return await link.read_volume_file(volume_id, path)


async def write(services: Services, user_id: str, ref: str, path: str, data: bytes) -> dict[str, Any]:
    """Create or replace the file (its missing parents made), whole or not at all. ``data`` is at most
    ``VOLUME_FILE_BYTES``: the route's body limit refuses more as it arrives (``routes/bodies.py``)."""
    link, volume_id = await _host(services, user_id, ref)
    written = await link.write_volume_file(volume_id, path, data, VolumeEntryMetadata())
    return {"path": path, "size": written.size}


async def list_dir(services: Services, user_id: str, ref: str, path: str, depth: int) -> dict[str, Any]:
    if not 1 <= depth <= MAX_DEPTH:
        raise errors.ValidationFailed.field("depth", f"must be 1..{MAX_DEPTH}")
    link, volume_id = await _host(services, user_id, ref)
    entries = await link.list_volume_dir(volume_id, path, depth)
    return {"path": path, "entries": [entry_view(entry) for entry in entries]}


async def stat_path(services: Services, user_id: str, ref: str, path: str) -> dict[str, Any]:
    link, volume_id = await _host(services, user_id, ref)
    return entry_view(await link.stat_volume_path(volume_id, path))


async def make_dir(services: Services, user_id: str, ref: str, path: str) -> dict[str, Any]:
    """The directory and its parents; ``created`` is false when it was already there."""
    link, volume_id = await _host(services, user_id, ref)
    try:
        before = await link.stat_volume_path(volume_id, path)
    except errors.NotFound:
        before = None
    if before is not None and before.type != "directory":
        raise errors.AlreadyExists(f"{path} exists and is not a directory")
    made = await link.make_volume_dir(volume_id, VolumeDirBody(path=path, parents=True))
    return {**entry_view(made), "created": before is None}


async def remove(services: Services, user_id: str, ref: str, path: str) -> None:
    link, volume_id = await _host(services, user_id, ref)
    await link.remove_volume_path(volume_id, path)
