"""What the contract shows of a sandbox (``schemas.py``'s views), made from its record."""

from __future__ import annotations

from typing import Any

from paddock_hostagent.drivers.base import SandboxRecord
from paddock_hostagent.drivers.net.egress_rules import Usage
from paddock_hostagent.drivers.storage.s3mounts import S3Mount
from paddock_hostagent.schemas import BandwidthResult, DiskMountView, NetworkAttachment, SandboxView


def view_of(
    record: SandboxRecord,
    *,
    status: str,
    last_activity_at: float,
    oom_kills: int,
    status_reason: str | None = None,
    self_request: dict[str, Any] | None = None,
) -> SandboxView:
    """The view of ``record``: what it holds, with what its state now says (``Registry.view``,
    ``Registry.stopped_view``)."""
    return SandboxView(
        id=record.id,
        name=record.name,
        rootfs=record.image,
        status=status,  # type: ignore[arg-type]
        status_reason=status_reason,
        ip=record.ip,
        vcpu=record.vcpu,
        mem_mib=record.mem_mib,
        cpu_quota_pct=record.cpu_quota_pct,
        disk_mib=record.disk_mib,
        created_at=record.created_at,
        last_activity_at=last_activity_at,
        oom_kills=oom_kills,
        forked_from=record.forked_from,
        self_request=self_request,
        networks=[NetworkAttachment(**public(m)) for m in record.networks],
        disks=[disk_view(S3Mount.from_json(d)) for d in record.disks],
    )


def disk_view(mount: S3Mount) -> DiskMountView:
    return DiskMountView(
        disk_id=mount.disk_id,
        mount_path=mount.mount_path,
        sub_path=mount.sub_path,
        status=mount.status,  # type: ignore[arg-type]
        error=mount.error,
    )


def public(member: dict[str, Any]) -> dict[str, Any]:
    """What the contract shows of a network membership (the record also keeps its bridge)."""
    return {key: member[key] for key in ("network_id", "ip", "prefixlen", "ifname")}


def bandwidth_result(sandbox_id: str, quota_bytes: int, usage: Usage) -> BandwidthResult:
    return BandwidthResult(
        id=sandbox_id,
        quota_bytes=quota_bytes,
        egress_bytes=usage.egress_bytes,
        ingress_bytes=usage.ingress_bytes,
        capped=usage.capped and quota_bytes >= 0,
    )
