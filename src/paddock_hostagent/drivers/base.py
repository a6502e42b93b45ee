"""The runtime interface every sandbox driver implements, its records and its error tree.

A driver turns a ``SandboxSpec`` into something running on this machine and back. Everything a caller
does *inside* a sandbox (exec, file transfer, activity) goes through the guest agent channel that the
driver hands out with ``guest()``: a unix socket for the OCI driver, a vsock-backed unix socket for a
future microVM driver. Drivers persist nothing themselves; they return a ``SandboxRecord`` whose
``driver_state`` holds what they need to find the sandbox again after a host agent restart, and the
caller stores it.

    DriverError
    ├── CommandFailedError       a host tool (runtime, mount, losetup, nft …) failed
    ├── CapacityError            out of addresses or disk space on this host
    ├── BootError                the sandbox started but its guest agent never answered
    ├── NotRunningError          the operation needs a live sandbox and this one has stopped
    └── UnsupportedError         the host cannot do this (for example grow a disk online)
        └── TierUnsupportedError the sandbox's isolation tier does not offer this operation
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from paddock_hostagent.guest import GuestClient


class DriverError(Exception):
    """Root of the errors drivers raise."""


class CommandFailedError(DriverError):
    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"{argv[0]} exited with {returncode}: {stderr.strip()[-500:]}")


class CapacityError(DriverError):
    pass


class BootError(DriverError):
    pass


class NotRunningError(DriverError):
    pass


class UnsupportedError(DriverError):
    pass


#: Operations a tier may not offer (docs/isolation.md's table): ``SandboxRuntime.refuse`` names them.
PRIVATE_NETWORKS = "joining a private network"
S3_DISKS = "mounting an S3 disk"
DISK_RESIZE = "growing a sandbox's disk"
SNAPSHOTS = "snapshotting a sandbox's disk"


class TierUnsupportedError(UnsupportedError):
    """The sandbox's isolation tier does not offer ``operation``: refused before anything changes,
    with a message naming both (the host agent's 409 ``unsupported_on_tier``)."""

    def __init__(self, tier: str, operation: str, why: str) -> None:
        self.tier, self.operation = tier, operation
        super().__init__(f"{operation} is not supported on the {tier} isolation tier: {why}")


@dataclass(frozen=True)
class ResourceSample:
    """What a sandbox uses now, read from the host side (its cgroup or its VM's process, and its
    host-made disk mount): never through a path inside the sandbox's tree."""

    cpu_usage_ns: int  # cumulative CPU time, for a rate over two samples
    mem_used_bytes: int
    mem_limit_bytes: int
    disk_used_bytes: int
    disk_limit_bytes: int


class RuntimeState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Shape:
    vcpu: int
    mem_mib: int
    disk_mib: int
    cpu_quota_pct: int | None = None


@dataclass(frozen=True)
class SandboxSpec:
    id: str
    name: str
    image: str
    rootfs: Path  # the image's read-only root filesystem
    shape: Shape


@dataclass
class SandboxRecord:
    """What the host agent keeps about one sandbox; saved as JSON, reloaded on restart."""

    id: str
    name: str
    image: str
    vcpu: int
    mem_mib: int
    disk_mib: int
    cpu_quota_pct: int | None
    ip: str
    state: RuntimeState
    driver: str
    driver_state: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    last_activity_at: float = field(default_factory=time.time)
    forked_from: str | None = None
    spawn_ms: float = 0.0
    # Self-signals from inside the sandbox (spec 12.4): the last sequence number seen, and the request
    # waiting for the control plane to act on ({"action": "pause"|"delete", "reason": str, "seq": int}).
    self_seq_seen: int = 0
    self_request: dict[str, Any] | None = None
    # Private network memberships (drivers/net/bridges.py ``Membership.to_json()``), re-programmed on adoption.
    networks: list[dict[str, Any]] = field(default_factory=list)
    # S3 disk attachments (drivers/storage/s3mounts.py ``S3Mount.to_json()``, no credentials), restored on adoption.
    disks: list[dict[str, Any]] = field(default_factory=list)
    # Egress allowlist (normalised rules; empty = open) and total egress budget (-1 = unmetered).
    egress: list[str] = field(default_factory=list)
    bandwidth_quota_bytes: int = -1

    @classmethod
    def running(
        cls, spec: SandboxSpec, *, ip: str, driver: str, driver_state: dict[str, Any]
    ) -> SandboxRecord:
        """The record of a sandbox a driver has just started from ``spec``."""
        shape = spec.shape
        return cls(
            id=spec.id,
            name=spec.name,
            image=spec.image,
            vcpu=shape.vcpu,
            mem_mib=shape.mem_mib,
            disk_mib=shape.disk_mib,
            cpu_quota_pct=shape.cpu_quota_pct,
            ip=ip,
            state=RuntimeState.RUNNING,
            driver=driver,
            driver_state=driver_state,
        )

    @property
    def shape(self) -> Shape:
        return Shape(self.vcpu, self.mem_mib, self.disk_mib, self.cpu_quota_pct)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxRecord:
        known = {name for name in cls.__dataclass_fields__}
        values = {key: value for key, value in data.items() if key in known}
        values["state"] = RuntimeState(values["state"])
        return cls(**values)


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot on this host: its disk image (``path``), the image its sandbox's overlay was of (a
    sandbox booted from it has the same lower layer), the disk's filesystem and size, the sandbox it
    was taken of, when (epoch seconds), and the bytes it holds (allocated, shared with its clones)."""

    id: str
    path: Path
    image: str
    fs: str
    disk_mib: int
    source_id: str
    created_at: float
    size_bytes: int


# What the caller needs done on a new sandbox's network (its egress rules), given the sandbox's record
# once its host interface exists. A driver runs it beside the boot, so that the sandbox is answered for
# no later than the boot and the longer of the two; a hook that fails fails the boot (the driver
# removes what it made; the hook undoes its own part), and the driver lets it end before it removes
# the network it works on.
NetworkHook = Callable[[SandboxRecord], Awaitable[None]]


def _tier(driver: str) -> str:
    return "vm" if driver == "qemu" else driver


class SandboxRuntime(ABC):
    """One way of running sandboxes on this machine (OCI containers today, microVMs later)."""

    name: str

    @abstractmethod
    async def start(self, records: list[SandboxRecord]) -> dict[str, RuntimeState]:
        """Prepares the host, re-adopts ``records`` (sandboxes an earlier agent process started),
        reclaims leftovers that belong to none of them, and starts background work (warm pool).

        Returns each record's live state; a sandbox that did not survive is ``STOPPED``.
        """

    @abstractmethod
    async def close(self) -> None:
        """Stops background work. Sandboxes keep running and are re-adopted by the next agent."""

    @abstractmethod
    async def create(
        self, spec: SandboxSpec, *, start_paused: bool = False, on_network: NetworkHook | None = None
    ) -> SandboxRecord:
        """Boots a sandbox; returns once its guest agent answers (and it is frozen, if asked) and
        ``on_network`` has ended."""

    @abstractmethod
    async def fork(
        self,
        source: SandboxRecord,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        """Boots a new sandbox from a copy of ``source``'s disk; the source keeps its state. Returns
        as ``create`` does."""

    # -- snapshots (crun and runc; other tiers refuse: TierUnsupportedError) ------------------------

    async def snapshot(self, record: SandboxRecord, snapshot_id: str) -> SnapshotInfo:
        """Copies the sandbox's disk into the snapshot ``snapshot_id``, kept on this host until
        ``delete_snapshot``; the sandbox keeps its state (a running one is frozen for the copy)."""
        raise TierUnsupportedError(_tier(self.name), SNAPSHOTS, "not offered on this tier yet")

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo | None:
        """The whole snapshot ``snapshot_id`` on this host, or None (also for one half-written)."""
        return None

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Removes the snapshot (sandboxes booted from it keep their disks); whether it was here."""
        return False

    async def create_from_snapshot(
        self,
        snapshot: SnapshotInfo,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        """Boots a new sandbox from a copy of the snapshot's disk; returns as ``create`` does."""
        raise TierUnsupportedError(_tier(self.name), SNAPSHOTS, "not offered on this tier yet")

    async def retire(self, records: list[SandboxRecord]) -> None:
        """For a host agent that now runs another driver: stops each of ``records`` (this driver's
        sandboxes from before; their disks, networks and records stay until ``destroy``) and removes
        what belongs to none of them (warm slots). The default has nothing to stop."""
        return None

    @abstractmethod
    async def pause(self, record: SandboxRecord) -> None:
        """Freezes every process; memory and disk are kept."""

    @abstractmethod
    async def resume(self, record: SandboxRecord) -> None: ...

    @abstractmethod
    async def resize(self, record: SandboxRecord, disk_mib: int) -> None:
        """Grows the writable disk to ``disk_mib`` while the sandbox runs (grow only)."""

    @abstractmethod
    async def destroy(self, record: SandboxRecord) -> None:
        """Kills and removes everything the sandbox holds; safe to call again or on a half-made one."""

    @abstractmethod
    def probe(self, record: SandboxRecord) -> RuntimeState:
        """The sandbox's live state, cheaply (no guest round trip)."""

    @abstractmethod
    def guest(self, record: SandboxRecord) -> GuestClient:
        """The channel to the sandbox's guest agent (exec, files, activity)."""

    def refuse(self, operation: str, record: SandboxRecord | None = None) -> None:
        """Raises :class:`TierUnsupportedError` when ``operation`` (``PRIVATE_NETWORKS`` …) is not
        offered to ``record`` (or, without one, to a new sandbox) on this driver's tier; the default
        offers everything."""
        return None

    def log_path(self, record: SandboxRecord, source: str) -> Path:
        """The host file holding the sandbox's ``source`` log ("boot": what the runtime and the guest's
        init wrote while it booted; "guest": the guest kernel's console), written by the host agent or
        its runtime in the sandbox's slot, never inside the sandbox's tree."""
        raise UnsupportedError(f"{self.name} sandboxes keep no {source} log")

    async def flush_log(self, record: SandboxRecord, source: str) -> None:
        """Brings ``log_path``'s file up to date before it is read; most runtimes write it directly.
        (A VM's console stays in QEMU's bounded ring until this moves it to the file.)"""
        return None

    def network_namespace(self, record: SandboxRecord) -> str:
        """The name of the sandbox's network namespace (under /run/netns), for extra interfaces."""
        raise UnsupportedError(f"{self.name} sandboxes cannot join private networks")

    def mount_namespace_pid(self, record: SandboxRecord) -> int:
        """A process whose mount namespace is the sandbox's (its init), for mounting disks into it."""
        raise UnsupportedError(f"{self.name} sandboxes cannot mount disks")

    def host_interface(self, record: SandboxRecord) -> str | None:
        """The host-side network interface the sandbox's traffic arrives on (None: no network)."""
        return None

    def warm_slots(self) -> int:
        """Prepared sandbox slots waiting to be used (0 for a driver without a pool)."""
        return 0

    def parked_slots(self) -> int:
        """Of those, the slots with a booted sandbox waiting to be claimed (``drivers/runtime/pool.py``)."""
        return 0

    @abstractmethod
    def oom_kills(self, record: SandboxRecord) -> int:
        """How many processes the sandbox's memory limit has killed so far."""

    def memory_usage_bytes(self, record: SandboxRecord) -> int:
        """Memory the sandbox uses now; admission counts its limit less this as still promised.
        0 (the default) counts the whole limit."""
        return 0

    def cap_memory(self, total_mib: int) -> None:
        """Caps the memory of all this driver's sandboxes together at ``total_mib`` (0: no cap), so
        that when overcommitted sandboxes really use their limits the kernel reclaims and kills inside
        them, never the agent or the host. The default does nothing."""
        return None

    def disk_usage_bytes(self, record: SandboxRecord) -> int:
        """Host disk the sandbox's disk occupies now (its sparse image's allocated blocks)."""
        return 0

    def resource_sample(self, record: SandboxRecord) -> ResourceSample | None:
        """The sandbox's CPU, memory and disk use for the stats route (``stats.py``); None: not
        measured by this driver, or the sandbox is gone."""
        return None

    def disk_free_bytes(self) -> int | None:
        """Free space on the host filesystem holding the sandboxes' disks; None: not checked."""
        return None
