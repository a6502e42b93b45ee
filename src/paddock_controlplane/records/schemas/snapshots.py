"""The snapshot body (issue #34): ``POST /v1/sandboxes/{id}/snapshots``."""

from __future__ import annotations

from pydantic import StrictStr

from paddock_controlplane.records.schemas.base import Body


class SnapshotCreateRequest(Body):
    #: Optional: a name ``rootfs`` may use instead of the id, unique among the caller's snapshots.
    name: StrictStr | None = None
