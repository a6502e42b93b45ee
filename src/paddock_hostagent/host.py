"""Host set-up the agent does at start-up (idempotent), and the choice of OCI runtime.

The same steps as a shell snippet, for an operator preparing a machine by hand::

    mkdir -p /sys/fs/cgroup/hugetlb
    mountpoint -q /sys/fs/cgroup/hugetlb || mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
    sysctl -w net.ipv4.ip_forward=1
    grep -qw overlay /proc/filesystems || modprobe overlay
    test -e /dev/loop-control || modprobe loop
    mkdir -p /run/netns
    nft add table ip paddock        # the agent then writes its chains into it
    nft add table ip paddock_egress # allowlists and bandwidth counters (drivers/egress.py)

Packages: runc and/or crun, nftables, iproute2, util-linux (losetup), e2fsprogs, xfsprogs, gcc and
libc6-dev (to build the guest agent), mmdebstrap (to build images).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.commands import run_sync
from paddock_hostagent.drivers.egress import EgressFirewall
from paddock_hostagent.drivers.mounts import is_mountpoint
from paddock_hostagent.drivers.network import NetworkManager
from paddock_hostagent.settings import HostAgentSettings

log = get_logger(__name__)

HUGETLB_DIR = Path("/sys/fs/cgroup/hugetlb")


@dataclass(frozen=True)
class HostFacts:
    runtime: str  # "crun" or "runc"
    hugetlb_mounted: bool


def mount_hugetlb() -> bool:
    """crun refuses this hybrid cgroup layout unless the v1 hugetlb hierarchy is mounted."""
    if is_mountpoint(HUGETLB_DIR):
        return True
    try:
        HUGETLB_DIR.mkdir(parents=True, exist_ok=True)
        run_sync(["mount", "-t", "cgroup", "-o", "hugetlb", "cgroup", str(HUGETLB_DIR)])
    except (OSError, DriverError) as exc:
        log.warning("hugetlb_mount_failed", error=str(exc))
        return False
    return True


def choose_runtime(preference: str) -> str:
    """``auto``: crun when installed and usable here (it starts and deletes faster), else runc."""
    if preference in ("crun", "runc"):
        if shutil.which(preference) is None:
            raise DriverError(f"{preference} is not installed")
        if preference == "crun" and not mount_hugetlb():
            raise DriverError("crun needs the cgroup v1 hugetlb hierarchy, which could not be mounted")
        return preference
    if shutil.which("crun") and mount_hugetlb():
        return "crun"
    if shutil.which("runc"):
        return "runc"
    raise DriverError("neither crun nor runc is installed")


def _load_kernel_support() -> None:
    if "overlay" not in Path("/proc/filesystems").read_text():
        run_sync(["modprobe", "overlay"], check=False)
    if not Path("/dev/loop-control").exists():
        run_sync(["modprobe", "loop"], check=False)


def prepare_machine(runtime_preference: str, network: NetworkManager | None = None) -> HostFacts:
    """Kernel support, the OCI runtime's needs, /run/netns, forwarding and (with ``network``) the
    nftables table; idempotent."""
    _load_kernel_support()
    runtime = choose_runtime(runtime_preference)
    Path("/run/netns").mkdir(parents=True, exist_ok=True)
    if network is not None:
        network.setup_host()
    else:
        with contextlib.suppress(OSError):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    return HostFacts(runtime=runtime, hugetlb_mounted=is_mountpoint(HUGETLB_DIR))


def prepare_host(settings: HostAgentSettings | None = None) -> HostFacts:
    """Everything the host agent needs from the machine before it starts sandboxes (see the module
    docstring for the same steps as shell commands); idempotent. Settings default to the environment."""
    settings = settings or HostAgentSettings()
    network = NetworkManager(
        settings.subnet,
        settings.state_dir / "network",
        settings.nft_table,
        settings.dns_servers,
        settings.egress_gso_max_segs,
    )
    facts = prepare_machine(settings.runtime, network)
    EgressFirewall(settings.nft_table, settings.subnet, network.gateway).setup_host()
    return facts
