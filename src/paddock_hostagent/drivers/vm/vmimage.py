"""What a Paddock VM boots from: a Debian kernel, an initramfs of ours and the catalog image as ext4.

    kernel      Debian's cloud kernel, unpacked by scripts/setup-host.sh under /var/lib/paddock/vm-kernel
    initramfs   busybox (static), the kernel's virtio modules, the guest agent, paddock-vminit and an
                /init script: load virtio modules, mount /dev/vda, configure eth0 from the kernel command
                line, copy the agent into a tmpfs /run/paddock of the new root, switch_root to vminit
    base disk   the image's rootfs directory as an ext4 file of the sandbox's disk size (mkfs.ext4 -d),
                made once per (image, size) and shared read-only; each VM writes a qcow2 overlay on it

Everything is cached under ``<state_dir>/vm`` by a digest of its inputs, so a second create builds
nothing. The initramfs is written as a newc cpio by this module (no cpio binary needed).
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from paddock_hostagent.drivers.base import DriverError

KERNEL_ROOT = Path("/var/lib/paddock/vm-kernel/current")
VMINIT_SOURCE = Path(__file__).parent.parent.parent / "guest" / "vm" / "vminit.c"
BUSYBOX = Path("/bin/busybox")
# Load order matters: each after what it depends on (modinfo -F depends; the package has no modules.dep).
VIRTIO_MODULES = (
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci",
    "drivers/block/virtio_blk",
    "net/core/failover",
    "drivers/net/net_failover",
    "drivers/net/virtio_net",
    "drivers/char/virtio_console",
)
#: Loaded only when the VM is given local volumes (XFS): most boots have none.
VOLUME_MODULES = ("lib/libcrc32c", "fs/xfs/xfs")
PROBE_MARKER = "PADDOCK-VM-PROBE-OK"

INIT_SCRIPT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.list); do insmod /modules/$m.ko 2>/dev/null; done
for word in $(cat /proc/cmdline); do
  case "$word" in
    paddock.ip=*) ip_addr="${{word#*=}}" ;;
    paddock.gw=*) gateway="${{word#*=}}" ;;
    paddock.host=*) host_name="${{word#*=}}" ;;
    paddock.probe=1) echo {PROBE_MARKER} > /dev/ttyS0; poweroff -f ;;
    paddock.vol=*) volumes="$volumes ${{word#*=}}" ;;
  esac
done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
mkdir -p /newroot
mount -t ext4 -o rw /dev/vda /newroot || {{ echo "paddock: cannot mount /dev/vda"; poweroff -f; }}
ip link set lo up
ip addr add "$ip_addr/32" dev eth0
ip link set eth0 up
ip route add "$gateway/32" dev eth0
ip route add default via "$gateway" dev eth0
hostname "$host_name"
mkdir -p /newroot/run /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/etc
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run
mkdir -p /newroot/run/paddock
cp /paddock/* /newroot/run/paddock/
if [ -n "$volumes" ]; then
  for m in $(cat /volume-modules.list); do insmod /modules/$m.ko 2>/dev/null; done
  # serial, ro|rw, mount path: paddock-vminit mounts each inside the new root
  for v in $volumes; do
    rest="${{v#*,}}"
    echo "${{v%%,*}} ${{rest%%,*}} $(echo "${{rest#*,}}" | base64 -d)" >> /newroot/run/paddock/volumes
  done
fi
echo "$host_name" > /newroot/etc/hostname
rm -f /newroot/etc/resolv.conf
echo "nameserver $gateway" > /newroot/etc/resolv.conf
echo "options timeout:2 attempts:2" >> /newroot/etc/resolv.conf
printf '127.0.0.1 localhost\\n%s %s\\n' "$ip_addr" "$host_name" > /newroot/etc/hosts
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /newroot/dev/pts
mount -t tmpfs -o nosuid,nodev tmpfs /newroot/dev/shm
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /newroot/sys/fs/cgroup
rm -f /newroot/dev/vda  # as a container's: no node for the disk (paddock-vminit makes /proc/sys read-only)
exec switch_root /newroot /run/paddock/paddock-vminit
"""


class VmImageError(DriverError):
    """The kernel, initramfs or base disk of the VM tier cannot be made."""


@dataclass(frozen=True)
class Kernel:
    version: str
    vmlinuz: Path
    modules_dir: Path

    @classmethod
    def find(cls, root: Path = KERNEL_ROOT) -> Kernel:
        boot = root / "boot"
        images = sorted(boot.glob("vmlinuz-*")) if boot.is_dir() else []
        if not images:
            raise VmImageError(f"no kernel under {root}: run scripts/setup-host.sh")
        version = images[-1].name.removeprefix("vmlinuz-")
        return cls(version, images[-1], root / "lib" / "modules" / version / "kernel")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _digest(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def build_vminit(out_dir: Path, *, compiler: str = "gcc") -> Path:
    """Compiles paddock-vminit (static), once per source version."""
    source = VMINIT_SOURCE.read_bytes()
    binary = out_dir / f"paddock-vminit-{_digest(source)}"
    if binary.is_file():
        return binary
    with _locked(binary):
        if binary.is_file():
            return binary
        tmp = binary.with_name(binary.name + ".tmp")
        result = subprocess.run(
            [compiler, "-O2", "-static", "-Wall", "-s", "-o", str(tmp), str(VMINIT_SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise VmImageError(f"compiling paddock-vminit failed:\n{result.stderr.strip()}")
        os.replace(tmp, binary)
    return binary


class _Cpio:
    """A newc ("070701") archive, enough for an initramfs: directories, files, symlinks."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.inode = 1

    def _entry(self, name: str, mode: int, data: bytes) -> None:
        fields = [self.inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        header = b"070701" + b"".join(f"{value:08x}".encode() for value in fields)
        self.inode += 1
        blob = header + name.encode() + b"\0"
        blob += b"\0" * (-len(blob) % 4)
        blob += data + b"\0" * (-len(data) % 4)
        self.parts.append(blob)

    def directory(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755, b"")

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def bytes(self) -> bytes:
        self._entry("TRAILER!!!", 0, b"")
        return b"".join(self.parts)


def build_initramfs(out_dir: Path, kernel: Kernel, guest_binary: Path, vminit: Path) -> Path:
    """The gzip'd initramfs for ``kernel`` carrying this guest agent; cached by digest."""
    if not BUSYBOX.is_file():
        raise VmImageError(f"{BUSYBOX} missing: install busybox-static (scripts/setup-host.sh)")
    agent = guest_binary.read_bytes()
    init_bin = vminit.read_bytes()
    key = _digest(kernel.version, INIT_SOURCE_TAG, hashlib.sha256(agent).hexdigest(), init_bin)
    target = out_dir / f"initramfs-{key}.cpio.gz"
    if target.is_file():
        return target
    with _locked(target):
        if target.is_file():
            return target
        archive = _Cpio()
        for directory in ("bin", "dev", "proc", "sys", "newroot", "modules", "paddock"):
            archive.directory(directory)
        archive.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
        archive.file("init", INIT_SCRIPT.encode(), 0o755)
        names = []
        for module in VIRTIO_MODULES:
            path = kernel.modules_dir / f"{module}.ko"
            if not path.is_file():
                raise VmImageError(f"kernel module {path} missing")
            name = Path(module).name
            archive.file(f"modules/{name}.ko", path.read_bytes())
            names.append(name)
        archive.file("modules.list", ("\n".join(names) + "\n").encode())
        volume_names = []
        for module in VOLUME_MODULES:
            path = kernel.modules_dir / f"{module}.ko"
            if not path.is_file():
                raise VmImageError(f"kernel module {path} missing")
            name = Path(module).name
            archive.file(f"modules/{name}.ko", path.read_bytes())
            volume_names.append(name)
        archive.file("volume-modules.list", ("\n".join(volume_names) + "\n").encode())
        archive.file("paddock/paddock-guest", agent, 0o755)
        archive.file("paddock/paddock-vminit", init_bin, 0o755)
        archive.file("paddock/busybox", BUSYBOX.read_bytes(), 0o755)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(gzip.compress(archive.bytes(), compresslevel=1))
        os.replace(tmp, target)
    return target


INIT_SOURCE_TAG = _digest(INIT_SCRIPT, *VIRTIO_MODULES, *VOLUME_MODULES)


def build_base_disk(out_dir: Path, rootfs: Path, disk_mib: int) -> Path:
    """The image's rootfs as a sparse ext4 file of ``disk_mib``, made once per (rootfs, size).

    The rootfs directory's path and mtime name the cache entry: catalog images are replaced by a new
    directory (rename), never edited in place."""
    try:
        mtime = rootfs.stat().st_mtime_ns
    except FileNotFoundError as exc:
        raise VmImageError(f"image rootfs {rootfs} missing") from exc
    target = out_dir / f"base-{_digest(str(rootfs.resolve()), str(mtime))}-{disk_mib}m.ext4"
    if target.is_file():
        return target
    with _locked(target):
        if target.is_file():
            return target
        tmp = target.with_name(target.name + ".tmp")
        tmp.unlink(missing_ok=True)
        with open(tmp, "wb") as handle:
            handle.truncate(disk_mib << 20)
        result = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-L", "root", "-E", "lazy_itable_init=1", "-d", str(rootfs), str(tmp)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise VmImageError(f"mkfs.ext4 -d {rootfs} failed: {result.stderr.strip()[-500:]}")
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
    return target


def qemu_binary() -> str:
    path = shutil.which("qemu-system-x86_64")
    if path is None:
        raise VmImageError("qemu-system-x86_64 missing: install qemu-system-x86 (scripts/setup-host.sh)")
    return path
