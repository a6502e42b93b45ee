"""The OCI runtime configuration (``config.json``) of a sandbox and the files it rewrites in /etc."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock_hostagent.drivers.base import Shape
from paddock_hostagent.drivers.runtime.seccomp import default_profile
from paddock_hostagent.drivers.storage.safepaths import Tree

GUEST_AGENT_PATH = "/run/paddock-guest"
GUEST_LISTEN_FD = 3
# gVisor: the guest binds its socket in this directory, bound from the host (drivers/runtime/oci.py).
GUEST_SOCKET_DIR = "/run/paddock-host"
GUEST_SOCKET_NAME = "guest.sock"
CPU_PERIOD_US = 100_000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Docker's default capability set without CAP_NET_RAW: raw and packet sockets would let a sandbox forge
# source addresses and frames; ping uses ICMP datagram sockets (network.py sets ping_group_range).
DEFAULT_CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

MASKED_PATHS = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


@dataclass(frozen=True)
class IoLimits:
    """Per-sandbox blkio throttle on its loop device (bytes and operations per second; 0 is none).

    Under cgroup v1 the kernel throttles the I/O a sandbox's tasks submit themselves: reads, O_DIRECT
    writes and the writeback an fsync forces (measured with crun and runc at 20 MiB/s: 21.6, 18.9 and
    21.3 MB/s). Plain buffered writes are written back later by the kernel's flusher, which v1 does not
    attribute to any cgroup, so those are not throttled (340-470 MB/s into the page cache)."""

    read_bps: int = 0
    write_bps: int = 0
    read_iops: int = 0
    write_iops: int = 0


@dataclass(frozen=True)
class BundleSpec:
    hostname: str
    shape: Shape
    cgroups_path: str
    netns_path: Path
    guest_binary: Path
    # Set for runsc: the host directory the guest binds its socket in (runsc hands over no fds).
    guest_socket_dir: Path | None = None
    # Set for runsc: a directory on the sandbox's disk bound at /tmp. Without a /tmp in the spec runsc
    # mounts a tmpfs inside its sentry there, which a fork or a restart loses (drivers/runtime/oci.py).
    tmp_dir: Path | None = None
    # S3 disks bound at the start (gVisor): (host directory s3fs serves, path in the sandbox).
    disk_binds: tuple[tuple[Path, str], ...] = ()
    pids_limit: int = 4096
    # The sandbox's own disk (its loop device) and the I/O it may do on it; 0 is unthrottled.
    disk_device: tuple[int, int] | None = None
    io: IoLimits = field(default_factory=IoLimits)


def cpu_quota_us(shape: Shape) -> int:
    """``cpu_quota_pct`` is a percent of one CPU; without it the sandbox gets ``vcpu`` whole CPUs."""
    if shape.cpu_quota_pct:
        return CPU_PERIOD_US * shape.cpu_quota_pct // 100
    return CPU_PERIOD_US * max(shape.vcpu, 1)


def block_io(spec: BundleSpec) -> dict[str, Any]:
    """``linux.resources.blockIO`` throttles for the sandbox's disk, when it has one and limits are set."""
    if spec.disk_device is None:
        return {}
    major, minor = spec.disk_device
    throttles = {
        "throttleReadBpsDevice": spec.io.read_bps,
        "throttleWriteBpsDevice": spec.io.write_bps,
        "throttleReadIOPSDevice": spec.io.read_iops,
        "throttleWriteIOPSDevice": spec.io.write_iops,
    }
    block = {
        key: [{"major": major, "minor": minor, "rate": rate}] for key, rate in throttles.items() if rate > 0
    }
    return {"blockIO": block} if block else {}


def guest_listen_args(spec: BundleSpec) -> list[str]:
    if spec.guest_socket_dir is None:
        return ["--fd", str(GUEST_LISTEN_FD)]
    return ["--listen", f"{GUEST_SOCKET_DIR}/{GUEST_SOCKET_NAME}"]


def guest_socket_mounts(spec: BundleSpec) -> list[dict[str, Any]]:
    if spec.guest_socket_dir is None:
        return []
    options = ["bind", "rw", "nosuid", "nodev", "noexec"]
    return [
        {
            "destination": GUEST_SOCKET_DIR,
            "type": "bind",
            "source": str(spec.guest_socket_dir),
            "options": options,
        }
    ]


def tmp_mounts(spec: BundleSpec) -> list[dict[str, Any]]:
    if spec.tmp_dir is None:
        return []
    options = ["bind", "rw", "nosuid", "nodev"]
    return [{"destination": "/tmp", "type": "bind", "source": str(spec.tmp_dir), "options": options}]


def disk_mounts(spec: BundleSpec) -> list[dict[str, Any]]:
    """The S3 disks' host directories, bound where the sandbox asked (runsc's gofer serves them)."""
    options = ["rbind", "rw", "nosuid", "nodev"]
    return [
        {"destination": destination, "type": "bind", "source": str(source), "options": options}
        for source, destination in spec.disk_binds
    ]


def runtime_config(spec: BundleSpec) -> dict[str, Any]:
    memory_bytes = spec.shape.mem_mib << 20
    capabilities = list(DEFAULT_CAPABILITIES)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": [GUEST_AGENT_PATH, *guest_listen_args(spec)],
            "env": [f"PATH={DEFAULT_PATH}", "HOME=/root", "container=paddock"],
            "cwd": "/",
            "capabilities": {
                "bounding": capabilities,
                "effective": capabilities,
                "permitted": capabilities,
            },
            "noNewPrivileges": False,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": spec.hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
            },
            {
                "destination": "/dev/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=262144k"],
            },
            {
                "destination": "/dev/mqueue",
                "type": "mqueue",
                "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"],
            },
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
            {
                "destination": GUEST_AGENT_PATH,
                "type": "bind",
                "source": str(spec.guest_binary),
                "options": ["bind", "ro", "nosuid", "nodev"],
            },
            *guest_socket_mounts(spec),
            *tmp_mounts(spec),
            *disk_mounts(spec),
        ],
        "linux": {
            "cgroupsPath": spec.cgroups_path,
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": memory_bytes, "swap": memory_bytes},
                "cpu": {"quota": cpu_quota_us(spec.shape), "period": CPU_PERIOD_US},
                "pids": {"limit": spec.pids_limit},
                **block_io(spec),
            },
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                # /proc/self/cgroup then shows "/" instead of the host's cgroup tree.
                {"type": "cgroup"},
                {"type": "network", "path": str(spec.netns_path)},
            ],
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
            "seccomp": default_profile(),
        },
    }


def write_identity_files(root: Path, *, hostname: str, ip: str, resolv_conf: str) -> None:
    """Writes /etc/hostname, /etc/hosts and /etc/resolv.conf under ``root``: the overlay's upper layer
    while the overlay is not mounted, else its mounted root (writing into the upper layer of a mounted
    overlay is undefined). The sandbox may edit them afterwards like any other file.

    The tenant controls /etc there (a fork's disk holds whatever its source made of it): the paths are
    resolved inside ``root`` (drivers/storage/safepaths.py), so a symlinked /etc leads where it leads inside the
    sandbox's tree, never to the host's files, and a symlink in a file's place is replaced, not followed.
    An /etc that leads nowhere inside ``root`` refuses the boot (``TenantPathError``, naming it).
    """
    hosts = (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "ff02::1\tip6-allnodes\n"
        "ff02::2\tip6-allrouters\n"
        f"{ip}\t{hostname}\n"
    )
    with Tree.open(root) as tree:
        tree.makedirs("etc", 0o755)
        for name, content in (("hostname", hostname + "\n"), ("hosts", hosts), ("resolv.conf", resolv_conf)):
            tree.write_file(f"etc/{name}", content.encode(), 0o644)
