"""Disk bodies (§10.13, §11.10, §11.11): create, rotate credentials, and a sandbox's attachment."""

from __future__ import annotations

from pydantic import StrictBool, StrictStr

from paddock_controlplane.records.schemas.base import Body


class DiskAttachment(Body):
    disk_id: StrictStr
    mount_path: StrictStr
    sub_path: StrictStr | None = None


class DiskConfigBody(Body):
    bucket: StrictStr | None = None
    endpoint: StrictStr | None = None
    region: StrictStr | None = None
    use_path_style: StrictBool | None = None


class DiskCredentialsBody(Body):
    access_key: StrictStr | None = None
    secret_key: StrictStr | None = None


class DiskCreateRequest(Body):
    name: StrictStr | None = None
    kind: StrictStr | None = None
    config: DiskConfigBody | None = None
    credentials: DiskCredentialsBody | None = None


class DiskPatchRequest(Body):
    credentials: DiskCredentialsBody | None = None
