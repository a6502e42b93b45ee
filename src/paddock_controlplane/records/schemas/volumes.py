"""Volume bodies (issue #34, docs/volumes.md): create, resize, and a sandbox's attachment."""

from __future__ import annotations

from pydantic import StrictBool, StrictStr

from paddock_controlplane.records.schemas.base import Body, Int32

#: Volumes one create may name: each is a mount in the sandbox and a row to check.
MAX_VOLUMES_PER_SANDBOX = 16


class VolumeCreateRequest(Body):
    name: StrictStr | None = None
    size_mib: Int32 | None = None
    #: Optional: the host to keep it on (else the active container-tier host with the most room).
    host_id: StrictStr | None = None


class VolumeResizeRequest(Body):
    size_mib: Int32 | None = None


class VolumeAttachment(Body):
    volume_id: StrictStr
    mount_path: StrictStr
    read_only: StrictBool | None = None
