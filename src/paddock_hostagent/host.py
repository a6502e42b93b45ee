"""Host set-up the agent does at start-up (idempotent), and the choice of OCI runtime.

The same steps as a shell snippet, for an operator preparing a machine by hand::

    mkdir -p /sys/fs/cgroup/hugetlb
    mountpoint -q /sys/fs/cgroup/hugetlb || mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
    sysctl -w net.ipv4.ip_forward=1
    sysctl -w fs.inotify.max_user_instances=8192 fs.inotify.max_user_watches=1048576  # floors
    mount -o remount,favordynmods /sys/fs/cgroup/unified  # each cgroup2 mount (as systemd does)
    sysctl -w fs.xfs.xfssyncd_centisecs=100  # a ceiling: XFS's log worker each second
    grep -qw overlay /proc/filesystems || modprobe overlay
    test -e /dev/loop-control || modprobe loop
    mkdir -p /run/netns
    nft add table ip paddock        # the agent then writes its chains into it
    nft add table ip paddock_egress # allowlists and bandwidth counters (drivers/net/egress_rules.py)

Packages: runc and/or crun (and runsc for the gVisor tier), nftables, iproute2, util-linux (losetup), e2fsprogs, xfsprogs, gcc and
libc6-dev (to build the guest agent), mmdebstrap (to build images).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.net.egress_rules import EgressFirewall
from paddock_hostagent.drivers.net.network import NetworkManager
from paddock_hostagent.drivers.storage.mounts import is_mountpoint
from paddock_hostagent.drivers.storage.nsmount import unescape
from paddock_hostagent.drivers.system.commands import run_sync
from paddock_hostagent.settings import HostAgentSettings

log = get_logger(__name__)

HUGETLB_DIR = Path("/sys/fs/cgroup/hugetlb")

#: The isolation tier each sandbox runtime gives, advertised as ``paddock.io/isolation`` (next to
#: ``paddock.io/runtime``) so ``node_selector`` can place by it. A new driver adds its runtime here.
ISOLATION = {"crun": "container", "runc": "container", "runsc": "gvisor", "qemu": "vm"}
ISOLATION_LABEL = "paddock.io/isolation"
RUNTIME_LABEL = "paddock.io/runtime"
KVM_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class HostFacts:
    runtime: str  # "crun", "runc", "runsc" or "qemu"
    hugetlb_mounted: bool
    # gVisor's platform ("ptrace" or "kvm"); empty for other runtimes.
    runsc_platform: str = ""

    @property
    def build_runtime(self) -> str:
        """The OCI runtime template builds (buildah) run their steps under: never runsc."""
        if self.runtime in ("crun", "runc"):
            return self.runtime
        return "crun" if shutil.which("crun") and mount_hugetlb() else "runc"


def tier_labels(runtime: str) -> dict[str, str]:
    """The labels a host advertises for its runtime (docs/isolation.md)."""
    return {ISOLATION_LABEL: ISOLATION.get(runtime, runtime), RUNTIME_LABEL: runtime}


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
    """``auto``: crun when installed and usable here (it starts and deletes faster), else runc.
    ``runsc`` (gVisor) and ``qemu`` (VMs) are only ever chosen explicitly."""
    if preference == "qemu":
        if shutil.which("qemu-system-x86_64") is None:
            raise DriverError("qemu-system-x86_64 is not installed (scripts/setup-host.sh)")
        return preference
    if preference in ("crun", "runc", "runsc"):
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


def kvm_usable() -> bool:
    """Whether gVisor's kvm platform runs a sandbox here: /dev/kvm opens and a ``runsc do true`` on it
    exits within a few seconds (on some nested VMs /dev/kvm exists but a guest hangs at its start)."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
    except OSError:
        return False
    with tempfile.TemporaryDirectory(prefix="paddock-kvm-probe-") as root:
        argv = ["runsc", "--root", root, "--platform=kvm", "--network=none", "--ignore-cgroups"]
        process = subprocess.Popen(
            [*argv, "do", "/bin/true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # `runsc do` writes its bundle to $TMPDIR/runsc-do*, and a probe killed on a hang never
            # removes it: one directory in /tmp per agent start. In the probe's root it goes with it.
            env={**os.environ, "TMPDIR": root},
            start_new_session=True,
        )
        try:
            return process.wait(KVM_PROBE_TIMEOUT_S) == 0
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return False


def choose_runsc_platform(preference: str) -> str:
    """``auto``: kvm where it works (much cheaper syscalls and faults), else ptrace, which works on any
    x86 Linux (the 2022 Debian build has no systrap)."""
    if preference in ("ptrace", "kvm"):
        return preference
    platform = "kvm" if kvm_usable() else "ptrace"
    log.info("runsc_platform_chosen", platform=platform)
    return platform


def _load_kernel_support() -> None:
    if "overlay" not in Path("/proc/filesystems").read_text():
        run_sync(["modprobe", "overlay"], check=False)
    if not Path("/dev/loop-control").exists():
        run_sync(["modprobe", "loop"], check=False)


def prepare_machine(
    runtime_preference: str, network: NetworkManager | None = None, runsc_platform: str = "auto"
) -> HostFacts:
    """Kernel support, the OCI runtime's needs, /run/netns, forwarding and (with ``network``) the
    nftables table; idempotent."""
    _load_kernel_support()
    runtime = choose_runtime(runtime_preference)
    platform = choose_runsc_platform(runsc_platform) if runtime == "runsc" else ""
    Path("/run/netns").mkdir(parents=True, exist_ok=True)
    _raise_inotify_limits()
    favour_cgroup_changes()
    hurry_xfs_log_worker()
    if network is not None:
        network.setup_host()
    else:
        with contextlib.suppress(OSError):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    return HostFacts(runtime=runtime, hugetlb_mounted=is_mountpoint(HUGETLB_DIR), runsc_platform=platform)


#: Floors for the kernel's inotify limits (``/proc/sys/fs/inotify/…``); a higher value is kept.
INOTIFY_FLOORS = {"max_user_instances": 8192, "max_user_watches": 1048576}


def _raise_inotify_limits(directory: Path = Path("/proc/sys/fs/inotify")) -> None:
    """The container tiers run without a user namespace, so a tenant's root shares the host root's
    inotify instances and watches (Debian's default: 128 instances). Every directory watch (the guest's
    WATCH), a tenant's own file watchers and the host's services draw on them; the floors give the
    host room well past what the sandboxes' descriptors would use in practice (docs/security.md says
    what is left: a per-tenant bound needs user namespaces, which gVisor and the VM tier have)."""
    for name, floor in INOTIFY_FLOORS.items():
        path = directory / name
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) < floor:
                path.write_text(f"{floor}\n")


#: The longest the agent lets XFS's log worker sleep, in centiseconds (``fs.xfs.xfssyncd_centisecs``,
#: whose kernel default is 3000 and least value 100): a shorter interval on the host is kept.
XFS_LOG_WORKER_CENTISECS = 100
#: Where the kernel keeps that interval (present once XFS is loaded).
XFS_LOG_WORKER_SETTING = Path("/proc/sys/fs/xfs/xfssyncd_centisecs")


def hurry_xfs_log_worker(setting: Path = XFS_LOG_WORKER_SETTING) -> None:
    """Has every XFS filesystem's log worker run each second instead of every 30 s.

    The worker forces the log and writes what it holds home, which moves the log's tail up. A fork
    clones its source's disk as it is: a source that logged many metadata changes since its tail
    (a package install, 20,000 new files) is frozen for the clone so that the clone has nothing to
    replay (``rootdisks.QUIESCE_REPLAY_BB``), and a disk grown on claim is frozen until its grown
    superblock is home. With the worker every 30 s, every fork within 30 s of such work paid that
    freeze (45-90 ms); now only one within about a second does. The cost is the metadata written
    home sooner and so more often for a tenant that rewrites the same inodes, into the disk store's
    page cache (docs/performance.md has both measured). The setting is the host's: it is left as it
    is when the agent stops. Best effort: a host without XFS support has no such file."""
    try:
        if int(setting.read_text()) > XFS_LOG_WORKER_CENTISECS:
            setting.write_text(f"{XFS_LOG_WORKER_CENTISECS}\n")
    except (OSError, ValueError) as exc:
        log.warning("xfs_log_worker_not_hurried", setting=str(setting), error=str(exc))


#: The cgroup2 mount option that keeps the kernel's lock on moving tasks between cgroups
#: (``cgroup_threadgroup_rwsem``, one for every hierarchy, v1 too) ready for writers.
FAVORDYNMODS = "favordynmods"


def cgroup2_mounts_to_favour(mounts_text: str) -> list[str]:
    """The mount points of ``mounts_text`` (``/proc/self/mounts``) that are cgroup2 without
    ``favordynmods``; their octal escapes (``\\040`` for a space) decoded."""
    points = []
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "cgroup2" or FAVORDYNMODS in fields[3].split(","):
            continue
        points.append(unescape(fields[1]))
    return points


def favour_cgroup_changes(mounts: Path = Path("/proc/self/mounts")) -> None:
    """Mounts every cgroup2 hierarchy with ``favordynmods``, as systemd does where it mounts them.

    Every sandbox's start moves its first process into its cgroups, and each move takes the kernel's
    ``cgroup_threadgroup_rwsem`` for writing. Unfavoured, that lock's readers (every fork and exit on
    the host) take it per CPU, and a writer first waits out an RCU grace period: ~10 ms of every
    create and fork here (docs/performance.md).
    Favoured, readers share one counter instead: forks and exits pay an atomic operation, moves pay
    nothing. The lock is global, so the cgroup2 mount of a hybrid host (``/sys/fs/cgroup/unified``)
    favours moves in the v1 hierarchies too. Only a mount without the option is remounted: the option
    is left on when the agent stops, as it is for the life of a systemd host. Best effort: a kernel
    before 6.0 has no such option, and moves then wait as before."""
    try:
        points = cgroup2_mounts_to_favour(mounts.read_text())
    except OSError:
        return
    for point in points:
        try:
            run_sync(["mount", "-o", f"remount,{FAVORDYNMODS}", point])
        except (OSError, DriverError) as exc:
            log.warning("cgroup_favordynmods_failed", mount_point=point, error=str(exc))


def network_manager(settings: HostAgentSettings) -> NetworkManager:
    """The agent's network manager, as its settings describe it (prepare_host and the app share it)."""
    return NetworkManager(
        settings.subnet,
        settings.state_dir / "network",
        settings.nft_table,
        settings.dns_servers,
        settings.egress_gso_max_segs,
        settings.egress_deny_cidrs,
    )


def prepare_host(settings: HostAgentSettings | None = None) -> HostFacts:
    """Everything the host agent needs from the machine before it starts sandboxes (see the module
    docstring for the same steps as shell commands); idempotent. Settings default to the environment."""
    settings = settings or HostAgentSettings()
    network = network_manager(settings)
    facts = prepare_machine(settings.runtime, network, settings.runsc_platform)
    EgressFirewall(settings.nft_table, settings.subnet, network.gateway).setup_host()
    return facts
