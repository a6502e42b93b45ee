"""Private network bodies (§10.14, §11.10, §11.12): a sandbox's network reference, create and attach."""

from __future__ import annotations

from pydantic import StrictStr

from paddock_controlplane.records.schemas.base import Body


class NetworkRef(Body):
    id: StrictStr


class NetworkCreateRequest(Body):
    name: StrictStr | None = None


class NetworkAttachRequest(Body):
    id: StrictStr | None = None
