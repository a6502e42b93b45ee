"""Sandbox request bodies (§10.6, §11.3, §11.7, §11.9): create, fork, timeout, patch, resize, SSH keys,
egress, recharge."""

from __future__ import annotations

from pydantic import Field, StrictBool, StrictInt, StrictStr

from paddock_controlplane.records.schemas.base import MAX_RECHARGE_BYTES, Body, Int32, Int64
from paddock_controlplane.records.schemas.disks import DiskAttachment
from paddock_controlplane.records.schemas.networks import NetworkRef
from paddock_controlplane.records.schemas.volumes import MAX_VOLUMES_PER_SANDBOX, VolumeAttachment


class CreateSandboxRequest(Body):
    shape: StrictStr
    rootfs: StrictStr | None = None
    name: StrictStr | None = None
    networks: list[NetworkRef] | None = None
    disk_mib: Int32 | None = None
    egress: list[StrictStr] | None = None
    envs: dict[str, StrictStr] | None = None
    ssh_pubkeys: list[StrictStr] | None = None
    host_id: StrictStr | None = None
    node_selector: dict[str, StrictStr] | None = None
    ingress_enabled: StrictBool | None = None
    #: The ``Host`` the ingress sends its apps (``${PORT}``: the port's number), and the ports whose app
    #: serves HTTPS itself (records/app_ports.py, docs/ingress.md).
    ingress_host_header: StrictStr | None = None
    ingress_https_ports: list[StrictInt] | None = None
    disks: list[DiskAttachment] | None = None
    region: StrictStr | None = None
    auto_pause_after_seconds: Int32 | None = None
    start_paused: StrictBool | None = None
    bandwidth_quota_bytes: Int64 | None = None
    timeout_s: Int32 | None = None
    #: ``destroy`` (the default), ``pause`` (frozen) or ``hibernate`` (docs/hibernation.md).
    on_timeout: StrictStr | None = None
    #: What the idle auto-pause does: ``pause`` (frozen, the default) or ``hibernate``.
    on_idle: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None
    #: Local volumes to mount once it runs (issue #34): it is placed on their host.
    volumes: list[VolumeAttachment] | None = Field(default=None, max_length=MAX_VOLUMES_PER_SANDBOX)


class ForkSandboxRequest(Body):
    start_paused: StrictBool | None = None
    ssh_pubkeys: list[StrictStr] | None = None
    egress: list[StrictStr] | None = None
    ingress_enabled: StrictBool | None = None
    envs: dict[str, StrictStr] | None = None
    bandwidth_quota_bytes: Int64 | None = None
    timeout_s: Int32 | None = None
    on_timeout: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None
    #: The child gets its own copy of each local volume the source holds (issue #34, docs/volumes.md).
    include_volumes: StrictBool | None = None


class PauseSandboxRequest(Body):
    """``POST /v1/sandboxes/{id}/pause`` (optional body, issue #34): ``keep_memory: false`` hibernates
    (the host keeps only the disk); ``hibernate_after_seconds`` with a frozen pause hibernates it once
    it has stayed paused that long (docs/hibernation.md)."""

    keep_memory: StrictBool | None = None
    hibernate_after_seconds: Int32 | None = None


class TimeoutRequest(Body):
    """``POST /v1/sandboxes/{id}/timeout``: the lifetime from now (0 or ``null``: none)."""

    timeout_s: Int32 | None = None
    on_timeout: StrictStr | None = None


class PatchSandboxRequest(Body):
    ingress_enabled: StrictBool | None = None
    #: ``""`` and ``[]`` clear them; left out, they stay.
    ingress_host_header: StrictStr | None = None
    ingress_https_ports: list[StrictInt] | None = None
    auto_pause_after_seconds: Int32 | None = None
    disable_auto_pause: StrictBool | None = None
    on_idle: StrictStr | None = None


class ResizeRequest(Body):
    disk_mib: Int32


class SshKeysRequest(Body):
    keys: list[StrictStr] | None = None


class EgressRequest(Body):
    egress: list[StrictStr] | None = None


class RechargeRequest(Body):
    add_bytes: StrictInt = Field(gt=0, le=MAX_RECHARGE_BYTES)
