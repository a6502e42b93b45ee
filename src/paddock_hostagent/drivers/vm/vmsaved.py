"""Saved VM states: a guest booted once, its agent up, its memory and disk kept, so a create restores it.

    key = SavedKey(base_disk, kernel, initramfs, mem_mib, vcpu, qemu, machine, accel, kernel_args)
    saved = store.load(key)          # a complete, verified state, or None (missing, stale or corrupt)
    store.commit(key, building_dir)  # a state written by the driver becomes the one creates use

A state lives in ``<state_dir>/vm/saved/<digest of the key>/``:

    memory.state   QEMU's migration stream of the booted guest (``migrate "exec:cat > …"``)
    disk.qcow2     the guest's overlay at that instant (backed by the image's ext4, read-only)
    meta.json      the key, the MAC QEMU gave the guest, each file's size and SHA-256; written last

The driver writes a state into ``<digest>.building-<random>`` and ``commit`` renames the directory
into place once ``meta.json`` is written and synced, so a state with a name is complete. ``load`` checks
the key and each file's size on every call, and its SHA-256 once per file version (inode, size, mtime)
in this process; anything that does not match is removed and the caller boots cold. A create copies
``disk.qcow2`` (it holds only what the boot wrote) and QEMU reads ``memory.state`` into the VM's own
anonymous memory: nothing of a state is shared between the sandboxes restored from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from paddock_core.logging import get_logger

log = get_logger(__name__)

FILES = ("memory.state", "disk.qcow2")
META = "meta.json"
#: meta.json is ours, but bound what is read back all the same.
_META_MAX_BYTES = 64 * 1024


#: The key's fields that are the host's (the rest are an image's and a shape's).
HOST_FIELDS = ("kernel", "initramfs", "qemu", "machine", "accel", "kernel_args")


@dataclass(frozen=True)
class SavedKey:
    """Everything a restore must match: the disk the guest mounted, what it booted, the machine."""

    base_disk: str
    kernel: str
    initramfs: str
    mem_mib: int
    vcpu: int
    qemu: str
    machine: str
    accel: str
    kernel_args: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class SavedState:
    dir: Path
    key: SavedKey
    mac: str  # the MAC on the QEMU command line of the boot that was saved (the device state's)

    @property
    def memory(self) -> Path:
        return self.dir / "memory.state"

    @property
    def disk(self) -> Path:
        return self.dir / "disk.qcow2"


class SavedStates:
    def __init__(self, root: Path) -> None:
        self.root = root
        # (path, inode, size, mtime_ns) of files whose SHA-256 matched their meta.json in this process
        self._verified: set[tuple[str, int, int, int]] = set()

    def path(self, key: SavedKey) -> Path:
        return self.root / key.digest

    def building_dir(self, key: SavedKey) -> Path:
        """A fresh directory to write a state into (``commit`` names it)."""
        self.root.mkdir(parents=True, exist_ok=True)
        directory = self.root / f"{key.digest}.building-{os.urandom(4).hex()}"
        directory.mkdir()
        return directory

    def load(self, key: SavedKey) -> SavedState | None:
        """The saved state for ``key`` if it is whole; a state that is not is removed."""
        directory = self.path(key)
        if not directory.is_dir():
            return None
        why = self._check(directory, key)
        if why is None:
            meta = read_meta(directory)
            return SavedState(directory, key, str(meta["mac"]))
        log.warning("vm_saved_state_discarded", dir=str(directory), reason=why)
        self.discard(key)
        return None

    def discard(self, key: SavedKey) -> None:
        """Removes a state (renamed away first, so no create finds it half removed)."""
        directory = self.path(key)
        doomed = directory.with_name(f"{directory.name}.discarded-{os.urandom(4).hex()}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(directory, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def commit(self, key: SavedKey, building: Path, mac: str) -> SavedState:
        """Seals a state the driver wrote into ``building``: sizes and digests into meta.json, synced,
        then the directory renamed to its key's name (replacing a stale one)."""
        files: dict[str, dict[str, Any]] = {}
        for name in FILES:
            path = building / name
            files[name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
            fsync_path(path)
        write_meta(building, {"key": asdict(key), "mac": mac, "files": files})
        target = self.path(key)
        if target.exists():
            self.discard(key)
        os.rename(building, target)
        fsync_path(self.root)
        state = SavedState(target, key, mac)
        for name in FILES:
            self._remember(target / name)
        return state

    def sweep(self, current: dict[str, str], images: Path) -> None:
        """Removes what a host agent that stopped mid-build or mid-discard left, and every state no
        create can match any more: its key names another value of ``current`` (kernel, initramfs,
        QEMU, machine, accelerator, kernel arguments) or an image disk no longer in ``images``."""
        for entry in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            if ".building-" in entry.name or ".discarded-" in entry.name:
                shutil.rmtree(entry, ignore_errors=True)
                continue
            try:
                key = read_meta(entry).get("key", {})
            except (OSError, ValueError):
                key = {}
            stale = [name for name, value in current.items() if key.get(name) != value]
            if stale or not (images / str(key.get("base_disk", ""))).is_file():
                log.info("vm_saved_state_stale", dir=str(entry), changed=stale or ["base_disk"])
                doomed = entry.with_name(f"{entry.name}.discarded-{os.urandom(4).hex()}")
                with contextlib.suppress(FileNotFoundError):
                    os.rename(entry, doomed)
                    shutil.rmtree(doomed, ignore_errors=True)

    def _check(self, directory: Path, key: SavedKey) -> str | None:
        try:
            meta = read_meta(directory)
        except (OSError, ValueError) as exc:
            return f"meta.json unreadable: {exc}"
        if meta.get("key") != asdict(key):
            return "its key does not match"
        if not isinstance(meta.get("mac"), str):
            return "meta.json names no MAC"
        for name in FILES:
            expected = meta.get("files", {}).get(name, {})
            path = directory / name
            try:
                status = path.stat()
            except OSError:
                return f"{name} is missing"
            if status.st_size != expected.get("size"):
                return f"{name} holds {status.st_size} bytes, not {expected.get('size')}"
            version = (str(path), status.st_ino, status.st_size, status.st_mtime_ns)
            if version in self._verified:
                continue
            if _sha256(path) != expected.get("sha256"):
                return f"{name} does not match its SHA-256"
            self._verified.add(version)
        return None

    def _remember(self, path: Path) -> None:
        status = path.stat()
        self._verified.add((str(path), status.st_ino, status.st_size, status.st_mtime_ns))


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    """``meta.json`` written and synced with its directory: the step that makes a saved state (or a VM
    snapshot, ``vmsnapshots.py``) whole, before the directory is renamed into place."""
    path = directory / META
    path.write_text(json.dumps(meta, indent=1))
    fsync_path(path)
    fsync_path(directory)


def read_meta(directory: Path) -> dict[str, Any]:
    with open(directory / META, "rb") as file:
        data = file.read(_META_MAX_BYTES + 1)
    if len(data) > _META_MAX_BYTES:
        raise ValueError("meta.json is too large")
    meta = json.loads(data)
    if not isinstance(meta, dict):
        raise ValueError("meta.json is not an object")
    return meta


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@cache
def qemu_version(binary: str) -> str:
    """``qemu-system-x86_64 --version``'s first line (part of a saved state's key)."""
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.splitlines()[0].strip() if result.stdout else "unknown"
