"""Request bodies, named exactly as the wire (§10). Pydantic checks types; ``validation`` checks rules.

``None`` is accepted wherever a client could send ``null`` for "unset".

Integers carry bounds (in the OpenAPI document too): far beyond any legitimate value, but inside what
the databases store, so 2^63 is a 400 naming the field and never an overflow in SQL.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# One recharge adds at most 1 PiB, and a budget never exceeds 1 EiB: sums stay far below 2^63.
MAX_RECHARGE_BYTES = 1 << 50
MAX_BANDWIDTH_QUOTA_BYTES = 1 << 60

Int32 = Annotated[StrictInt, Field(ge=-INT32_MAX, le=INT32_MAX)]
Int64 = Annotated[StrictInt, Field(ge=-INT64_MAX, le=INT64_MAX)]


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
    disk_mib: Int32 | None = None
    egress: list[StrictStr] | None = None
    envs: dict[str, StrictStr] | None = None
    ssh_pubkeys: list[StrictStr] | None = None
    host_id: StrictStr | None = None
    node_selector: dict[str, StrictStr] | None = None
    ingress_enabled: StrictBool | None = None
    disks: list[DiskAttachment] | None = None
    region: StrictStr | None = None
    auto_pause_after_seconds: Int32 | None = None
    start_paused: StrictBool | None = None
    bandwidth_quota_bytes: Int64 | None = None
    timeout_s: Int32 | None = None
    on_timeout: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None


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


class TimeoutRequest(Body):
    """``POST /v1/sandboxes/{id}/timeout``: the lifetime from now (0 or ``null``: none)."""

    timeout_s: Int32 | None = None
    on_timeout: StrictStr | None = None


class PatchSandboxRequest(Body):
    ingress_enabled: StrictBool | None = None
    auto_pause_after_seconds: Int32 | None = None
    disable_auto_pause: StrictBool | None = None


class ResizeRequest(Body):
    disk_mib: Int32


class SshKeysRequest(Body):
    keys: list[StrictStr] | None = None


class EgressRequest(Body):
    egress: list[StrictStr] | None = None


class RechargeRequest(Body):
    add_bytes: StrictInt = Field(gt=0, le=MAX_RECHARGE_BYTES)


class ExecRequest(Body):
    cmd: StrictStr
    args: list[StrictStr] | None = None
    stream: StrictBool | None = None
    env: dict[str, StrictStr] | None = None
    stdin: StrictStr | None = None
    cwd: StrictStr | None = None
    user: StrictStr | StrictInt | None = None  # commands.check_user: a user name or a uid


class NetworkCreateRequest(Body):
    name: StrictStr | None = None


class NetworkAttachRequest(Body):
    id: StrictStr | None = None


class AccessTokenRequest(Body):
    """Create and rotate take no body (§2.2); ``expires_in_seconds`` is this server's extension."""

    expires_in_seconds: StrictInt | None = Field(default=None, ge=1, le=365 * 24 * 3600)
