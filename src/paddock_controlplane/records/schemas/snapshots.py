"""The snapshot body (issue #34): ``POST /v1/sandboxes/{id}/snapshots``."""

from __future__ import annotations

from pydantic import StrictBool, StrictStr

from paddock_controlplane.records.schemas.base import Body


class SnapshotCreateRequest(Body):
    #: Optional: a name ``rootfs`` may use instead of the id, unique among the caller's snapshots.
    name: StrictStr | None = None
    #: The snapshot keeps its own copy of each local volume the sandbox holds, and each sandbox booted
    #: from it gets a new volume copied from each (docs/volumes.md); container tier.
    include_volumes: StrictBool | None = None
