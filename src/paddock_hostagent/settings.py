"""Host agent settings (env prefix ``PADDOCK_HOST_``), built once in ``main()`` and passed down."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from paddock_core.settings import DEFAULT_DATA_DIR, ServiceSettings

#: Where sandboxes may never open connections unless the operator says otherwise: the address space a
#: host's own network, its peers and the operator's services live in (RFC 1918, CGNAT), and what is
#: never a destination (0/8, multicast and reserved).
DEFAULT_EGRESS_DENY = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/3",
)

# The sandbox runtime of this agent: an OCI runtime (drivers/runtime/oci.py). ``auto`` picks crun, else runc
# (the container tier); ``runsc`` is gVisor (docs/isolation.md). host.choose_runtime resolves it and
# host.ISOLATION maps it to the tier advertised as the ``paddock.io/isolation`` label.
# ``qemu`` runs each sandbox as a virtual machine (the vm tier, drivers/vm/qemu.py, docs/isolation-vm.md).
RuntimeName = Literal["auto", "crun", "runc", "runsc", "qemu"]


def _default_host_id() -> str:
    return f"host-{socket.gethostname()}"


class HostAgentSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="PADDOCK_HOST_", extra="ignore", populate_by_name=True)

    id: str = Field(default_factory=_default_host_id)
    host: str = "127.0.0.1"
    port: int = 8081
    # The URL the control plane should use to reach this agent; empty means http://{host}:{port}.
    public_url: str = ""
    token: SecretStr = SecretStr("")
    controlplane_url: str = ""
    heartbeat_interval_s: float = 2.0

    state_dir: Path = DEFAULT_DATA_DIR / "host"
    image_dir: Path = DEFAULT_DATA_DIR / "images"
    # The most a template image fetched from another host may bring (image_transfer.py); a fetch is
    # also bounded by the template's recorded size with a margin when the control plane sends it.
    image_fetch_max_mib: int = Field(default=32768, ge=1)
    # Image name -> mirror URL, for images that are only buildable with one (ubuntu:26.04, alpine:3.20,
    # desktop:1); also overrides the Debian mirror for debian:13 and devbox:1.
    image_mirrors: dict[str, str] = Field(default_factory=dict)

    runtime: RuntimeName = "auto"
    # gVisor's platform: ``auto`` uses kvm when a short probe sandbox runs on it, else ptrace.
    runsc_platform: Literal["auto", "ptrace", "kvm"] = "auto"
    # The vm tier: KVM where a probe boot works (``auto``), else TCG; TCG boots take seconds.
    vm_accel: Literal["auto", "kvm", "tcg"] = "auto"
    vm_boot_timeout_s: float = 60.0
    labels: dict[str, str] = Field(default_factory=dict)
    subnet: str = "10.88.0.0/16"
    nft_table: str = "paddock"
    # The control plane's private-network pool: routed traffic into it is dropped (members use bridges).
    private_network_pool: str = "10.96.0.0/11"
    # Where no sandbox may open a connection, whatever its allowlist: comma-separated IPv4 CIDRs; empty
    # allows all. The default is private address space (RFC 1918, CGNAT), where the hosts, the control
    # planes and the operator's other services are (drivers/net/network.py, docs/egress.md).
    egress_deny: str = ",".join(DEFAULT_EGRESS_DENY)
    dns_servers: list[str] = Field(default_factory=list)
    # Where the sandboxes' resolver forwards allowed queries: comma-separated ``ip`` or ``ip:port``;
    # empty means DNS_SERVERS, else the host's /etc/resolv.conf.
    dns_upstream: str = ""
    # Segments per packet a sandbox's eth0 may hand the host (GSO). 1 makes the bandwidth quota stop
    # within one wire packet of the budget; it costs throughput (measured on a loaded 2-core VM, one
    # TCP flow: ~35 MB/s at 1, ~140 at 8, ~240 at 65535, where a packet may be up to 64 KiB).
    egress_gso_max_segs: int = Field(default=1, ge=1, le=65535)
    pool_size: int = 2
    # How long a volume mounted on the host for a file call without a sandbox (the volume files API,
    # E2B's volume content API) stays mounted after it: a burst of calls pays one mount and unmount
    # (~40 ms) and not one each. 0 unmounts after each call. Any other change of the volume (a
    # sandbox's attach, a VM's drive, a resize, a delete) unmounts it first.
    volume_linger_s: float = Field(default=5.0, ge=0.0, le=300.0)
    # The image the warm pool boots sandboxes of, ahead of the creates that claim them (crun and runc;
    # drivers/runtime/pool.py). Empty: the pool holds plain slots only. Parked only once the image is on the host.
    pool_image: str = "debian:13"
    # Disk size the warm pool formats slots at; a create asking for more grows a pooled slot.
    pool_disk_mib: int = 10240
    # Per-image pools (drivers/runtime/pool.py, ``ImagePools``): sandboxes of what the default pool does
    # not park (another image such as devbox:1 or a template, another disk size), parked as recent demand
    # says: an exponentially decayed create rate per image and disk size, one parked once it is asked
    # for, more as its creates/s grow, at most POOL_KIND_MAX each, none once it has not been asked for in
    # minutes. All parked sandboxes together (the default pool's too) hold at most POOL_MEMORY_PCT percent
    # of the machine's memory (MemTotal), measured in their cgroups; 0 parks only the default pool. A
    # create of a size with none parked claims the image's largest smaller disk, grown online (XFS).
    pool_memory_pct: float = Field(default=5.0, ge=0.0, le=50.0)
    pool_kind_max: int = Field(default=4, ge=0, le=64)
    # Filesystem of sandbox disks: ext4 needs CAP_SYS_RESOURCE to grow online, XFS does not.
    disk_fs: Literal["auto", "ext4", "xfs"] = "auto"
    runtime_root: Path = Path("/run/paddock")
    # Memory offered to the scheduler; 0 means the machine's total minus ``reserved_mib``.
    total_mib: int = 0
    # Memory kept for the host: out of the scheduler's total, and out of what is available right now.
    reserved_mib: int = 1024
    # Memory overcommit for placement: limits may add up to this many times the budget above (an idle
    # sandbox uses a few MiB of its limit). All sandboxes together stay capped at the budget, so under
    # pressure the kernel kills inside a sandbox (reported as its OOM kill), never the agent or the host
    # (capacity.py, docs/performance.md).
    memory_overcommit: float = Field(default=1.0, ge=1.0, le=64.0)
    # Host disk (under state_dir) kept free: sandboxes' sparse disks are admitted only within the rest.
    disk_reserved_mib: int = Field(default=4096, ge=0)
    # Disk overcommit for admission: sparse disk sizes may add up to this many times the room above
    # (an idle sandbox's disk holds a few MiB). 20: a default 10 GiB disk counts as 512 MiB of real
    # room, so ~70 GiB free holds some 130 default sandboxes (capacity.py, docs/capacity.md).
    disk_overcommit: float = Field(default=20.0, ge=1.0, le=256.0)
    # The watermarks behind it (diskwatch.py): below LOW MiB of real free space in the disk store
    # (less dirty data on its way there) the sandboxes growing their disks are frozen until it is back
    # above HIGH; meanwhile creates, forks and disk growth answer 507. Checked every interval.
    disk_low_watermark_mib: int = Field(default=2048, ge=0)
    disk_high_watermark_mib: int = Field(default=3072, ge=0)
    disk_watch_interval_s: float = Field(default=0.25, gt=0, le=60)
    # Tasks one sandbox may hold (its pids.max), and all this agent's sandboxes together; 0 means the
    # kernel's limit (pid_max or threads-max) less a quarter kept for the host.
    sandbox_pids_max: int = Field(default=4096, ge=16)
    pids_budget: int = Field(default=0, ge=0)
    # Per-sandbox blkio throttle on its own disk (its loop device); 0 is none. Under cgroup v1 it holds
    # reads, O_DIRECT writes and writes the sandbox syncs itself (fsync, O_SYNC); plain buffered writes
    # are flushed by the kernel outside any cgroup and are bounded only by the disk's size and the
    # sandbox's memory (ARCHITECTURE.md, "Disk I/O").
    disk_read_bps: int = Field(default=256 << 20, ge=0)
    disk_write_bps: int = Field(default=256 << 20, ge=0)
    disk_read_iops: int = Field(default=5000, ge=0)
    disk_write_iops: int = Field(default=5000, ge=0)
    boot_timeout_s: float = 10.0
    # How often running sandboxes' guest agents are asked for self-signals (pause/delete requests).
    guest_poll_interval_s: float = 1.0
    default_cwd: str = "/root"

    @model_validator(mode="after")
    def _watermarks_in_order(self) -> HostAgentSettings:
        if self.disk_high_watermark_mib <= self.disk_low_watermark_mib:
            raise ValueError("disk_high_watermark_mib must be above disk_low_watermark_mib")
        return self

    @field_validator("subnet")
    @classmethod
    def _valid_subnet(cls, value: str) -> str:
        network = ipaddress.IPv4Network(value, strict=True)
        if network.prefixlen > 29:
            raise ValueError("subnet must leave room for sandboxes (/29 or larger)")
        return str(network)

    @field_validator("egress_deny")
    @classmethod
    def _valid_deny(cls, value: str) -> str:
        networks = [
            ipaddress.IPv4Network(part.strip(), strict=False) for part in value.split(",") if part.strip()
        ]
        return ",".join(str(network) for network in ipaddress.collapse_addresses(networks))

    @property
    def egress_deny_cidrs(self) -> tuple[str, ...]:
        return tuple(part for part in self.egress_deny.split(",") if part)

    @field_validator("nft_table")
    @classmethod
    def _valid_table(cls, value: str) -> str:
        if not value.replace("_", "").isalnum():
            raise ValueError("nft_table must be alphanumeric")
        return value

    def require_token(self) -> SecretStr:
        return self.reject_placeholder(self.token, "PADDOCK_HOST_TOKEN")

    @property
    def advertised_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"
