"""Request bodies, named exactly as the wire (§10). Pydantic checks types; ``validation`` checks rules.

``None`` is accepted wherever a client could send ``null`` for "unset".
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NetworkRef(Body):
    id: StrictStr


class DiskAttachment(Body):
    disk_id: StrictStr
    mount_path: StrictStr
    sub_path: StrictStr | None = None


class CreateSandboxRequest(Body):
    shape: StrictStr
    rootfs: StrictStr | None = None
    name: StrictStr | None = None
    networks: list[NetworkRef] | None = None
    disk_mib: StrictInt | None = None
    egress: list[StrictStr] | None = None
    envs: dict[str, StrictStr] | None = None
    ssh_pubkeys: list[StrictStr] | None = None
    host_id: StrictStr | None = None
    node_selector: dict[str, StrictStr] | None = None
    ingress_enabled: StrictBool | None = None
    disks: list[DiskAttachment] | None = None
    region: StrictStr | None = None
    auto_pause_after_seconds: StrictInt | None = None
    start_paused: StrictBool | None = None
    bandwidth_quota_bytes: StrictInt | None = None


class ForkSandboxRequest(Body):
    start_paused: StrictBool | None = None
    ssh_pubkeys: list[StrictStr] | None = None
    egress: list[StrictStr] | None = None
    ingress_enabled: StrictBool | None = None
    envs: dict[str, StrictStr] | None = None
    bandwidth_quota_bytes: StrictInt | None = None


class PatchSandboxRequest(Body):
    ingress_enabled: StrictBool | None = None
    auto_pause_after_seconds: StrictInt | None = None
    disable_auto_pause: StrictBool | None = None


class ResizeRequest(Body):
    disk_mib: StrictInt


class SshKeysRequest(Body):
    keys: list[StrictStr] | None = None


class EgressRequest(Body):
    egress: list[StrictStr] | None = None


class RechargeRequest(Body):
    add_bytes: StrictInt


class ExecRequest(Body):
    cmd: StrictStr
    args: list[StrictStr] | None = None
    stream: StrictBool | None = None
    env: dict[str, StrictStr] | None = None
    stdin: StrictStr | None = None


class NetworkCreateRequest(Body):
    name: StrictStr | None = None


class NetworkAttachRequest(Body):
    id: StrictStr | None = None
