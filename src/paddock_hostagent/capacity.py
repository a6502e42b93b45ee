"""Admission: what this host can still promise a new sandbox, in memory and in disk.

A sandbox's ``mem_mib`` and ``disk_mib`` are limits it may grow into at any time, not what it uses
now. With an overcommit ratio ``r`` (``PADDOCK_HOST_MEMORY_OVERCOMMIT``, 1 by default) the host
expects its sandboxes together to use at most ``1/r`` of what was promised to them, so memory free for
a new sandbox (in limit MiB) is the smaller of

- the agent's own budget: ``r × total_mib`` (the machine's total less ``reserved_mib``, or as
  configured) less every limit already promised, and
- the machine now: ``r ×`` (``MemAvailable`` less ``reserved_mib`` less what the sandboxes are still
  expected to grow into: ``promised / r`` less what they use now); this catches memory taken by
  anything else on the machine.

At ``r = 1`` both are exactly "every sandbox can use its whole limit at once". Above 1 they may not, and
the agent caps all its sandboxes together at ``total_mib`` (``SandboxRuntime.cap_memory``): under
pressure the kernel reclaims, then kills inside the sandboxes, never the agent or the host
(docs/performance.md).

Disk free is what the disk store can really still take (``diskwatch.Room``: the smaller of the host
filesystem's and the store's own free space, less the dirty data on its way to them) less
``disk_reserved_mib`` less what the sandboxes' sparse disks are still expected to grow into, with the
same model for ``PADDOCK_HOST_DISK_OVERCOMMIT``. Disks are thin-provisioned by default (ratio 20: a
default 10 GiB disk counts as 512 MiB of real room, where an idle sandbox's disk holds a few MiB), so
a host with ~70 GiB free holds some 130 default sandboxes instead of 7. What backs the promise is the
watermark (``diskwatch.py``): when real free space falls below the low watermark the agent freezes
the sandboxes that are growing their disks until it is back above the high one, and while it holds
any, no create, fork or disk growth is admitted. A sandbox that fills its own disk gets ENOSPC inside
it, its own filesystem being the size it was promised.

The overcommit applies to the sum of the promises only: one disk is never admitted larger than the
host could hold of it now, real free space less ``disk_reserved_mib`` (plus what that disk already
holds, for a resize), whatever the ratio: its sandbox could never fill it, only be held at the
watermark trying.

A refusal is ``InsufficientCapacity`` (507) whose message starts ``"<N> MiB requested, <M> MiB free"``
and says which of these ran out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from paddock_hostagent import errors

MIB = 1 << 20


@dataclass(frozen=True)
class Promise:
    """One sandbox's limit and what it uses of it now."""

    limit_mib: int
    used_bytes: int

    @property
    def unused_mib(self) -> int:
        return max(self.limit_mib - self.used_bytes // MIB, 0)


@dataclass(frozen=True)
class Promised:
    """Many promises summed: all admission needs of them. A host agent keeps its sandboxes' sums and
    makes them again only when one of them changed (``registry.Registry.promised``), so a create beside
    1,000 sandboxes does not walk the 1,000 (issue #36)."""

    count: int = 0
    limit_mib: int = 0
    #: The sum of each limit less its use (what the sandboxes may still grow into at ratio 1).
    unused_mib: int = 0
    #: The sum of each use, at most its limit.
    used_mib: int = 0

    @classmethod
    def of(cls, promises: Iterable[Promise]) -> Promised:
        return cls.adding((promise.limit_mib, promise.used_bytes) for promise in promises)

    @classmethod
    def adding(cls, limits_and_uses: Iterable[tuple[int, int]]) -> Promised:
        """The sum of ``(limit_mib, used_bytes)`` pairs, in one pass."""
        count = limit = unused = used = 0
        for limit_mib, used_bytes in limits_and_uses:
            use = min(used_bytes // MIB, limit_mib)
            count += 1
            limit += limit_mib
            unused += limit_mib - use
            used += use
        return cls(count, limit, unused, used)

    def __add__(self, other: Promised) -> Promised:
        return Promised(
            self.count + other.count,
            self.limit_mib + other.limit_mib,
            self.unused_mib + other.unused_mib,
            self.used_mib + other.used_mib,
        )

    def unused_at(self, overcommit: float) -> int:
        """What the sandboxes are still expected to grow into: at ratio 1 every limit less its use;
        above, the share ``promised / r`` less what they use now."""
        if overcommit == 1.0:
            return self.unused_mib
        return max(int(self.limit_mib / overcommit) - self.used_mib, 0)


def total_memory_mib() -> int:
    """``MemTotal``: the machine's memory."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


def pool_budget_bytes(percent: float, total_mib: int | None = None) -> int:
    """What the parked sandboxes of the per-image pools may hold: ``percent`` of the machine's memory
    (``PADDOCK_HOST_POOL_MEMORY_PCT``). Not promised to anyone: a parked sandbox is no sandbox's and
    no tenant's, and the admission above sees what it holds only through ``MemAvailable``."""
    return int((total_memory_mib() if total_mib is None else total_mib) * MIB * percent / 100)


def available_memory_mib() -> int:
    """``MemAvailable``: what the kernel can hand out without swapping (free plus reclaimable cache)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


@dataclass(frozen=True)
class MemoryView:
    total_mib: int
    reserved_mib: int
    available_mib: int
    promised: Promised
    overcommit: float = 1.0

    @property
    def promised_mib(self) -> int:
        return self.promised.limit_mib

    @property
    def schedulable_mib(self) -> int:
        """What the host offers the scheduler: its budget times the overcommit ratio."""
        return int(self.total_mib * self.overcommit)

    @property
    def unused_mib(self) -> int:
        return self.promised.unused_at(self.overcommit)

    @property
    def budget_free_mib(self) -> int:
        return self.schedulable_mib - self.promised_mib

    @property
    def machine_free_mib(self) -> int:
        return int((self.available_mib - self.reserved_mib - self.unused_mib) * self.overcommit)

    @property
    def free_mib(self) -> int:
        return max(min(self.budget_free_mib, self.machine_free_mib), 0)

    def admit(self, requested_mib: int) -> None:
        if requested_mib <= self.free_mib:
            return
        count = self.promised.count
        if self.machine_free_mib < self.budget_free_mib:
            why = (
                f"memory: the machine has {self.available_mib} MiB available, {self.unused_mib} MiB of it "
                f"promised to {count} sandboxes and {self.reserved_mib} MiB kept for the host"
            )
        else:
            why = (
                f"memory: {self.promised_mib} of this host's {self.schedulable_mib} MiB promised to {count} "
                "sandboxes"
            )
        if self.overcommit != 1.0:
            why += f", overcommitted {self.overcommit:g}×"
        raise errors.InsufficientCapacity(f"{requested_mib} MiB requested, {self.free_mib} MiB free ({why})")


@dataclass(frozen=True)
class DiskView:
    fs_free_mib: int
    reserved_mib: int
    promised: Promised
    overcommit: float = 1.0
    # Sandboxes the low watermark holds now (``diskwatch.py``) and the free space that releases them.
    held: int = 0
    release_mib: int = 0

    @property
    def unused_mib(self) -> int:
        """What the sparse disks are still expected to grow into (as for memory: at ratio 1 every size
        less what its image holds; above, the share ``promised / r`` less what they hold)."""
        return self.promised.unused_at(self.overcommit)

    @property
    def free_mib(self) -> int:
        return max(int((self.fs_free_mib - self.reserved_mib - self.unused_mib) * self.overcommit), 0)

    def largest_disk_mib(self, holds_mib: int = 0) -> int:
        """The largest one disk may be, whatever the overcommit: what the host could hold of it now (real
        free space less the reserve) plus ``holds_mib``, what that disk already holds on the host."""
        return max(self.fs_free_mib - self.reserved_mib + holds_mib, 0)

    def admit(self, requested_mib: int, *, disk_mib: int | None = None, holds_mib: int = 0) -> None:
        """Admits ``requested_mib`` more promised disk: a new disk's size, or a resize's growth with
        ``disk_mib`` the disk's size after it and ``holds_mib`` what the disk already holds."""
        if self.held:
            raise errors.InsufficientCapacity(
                f"{requested_mib} MiB requested, 0 MiB free (disk: the host's disk store is low, "
                f"{self.fs_free_mib} MiB free; the writes of {self.held} sandboxes are held until it has "
                f"{self.release_mib} MiB free)"
            )
        size_mib = requested_mib if disk_mib is None else disk_mib
        largest_mib = self.largest_disk_mib(holds_mib)
        if requested_mib > self.free_mib:
            why = (
                f"disk: the host's filesystem has {self.fs_free_mib} MiB free, {self.unused_mib} MiB of it "
                f"promised to {self.promised.count} sandbox disks and {self.reserved_mib} MiB kept for the host"
            )
            if self.overcommit != 1.0:
                why += f", overcommitted {self.overcommit:g}×"
            raise errors.InsufficientCapacity(
                f"{requested_mib} MiB requested, {self.free_mib} MiB free ({why})"
            )
        if size_mib > largest_mib:
            # The overcommit is on the sum of the promises; one disk the host could never hold is refused.
            free_mib = max(min(self.free_mib, largest_mib - (size_mib - requested_mib)), 0)
            holds = f" besides the {holds_mib} MiB this disk holds" if holds_mib else ""
            why = (
                f"disk: one disk may be at most {largest_mib} MiB whatever the overcommit: the host's "
                f"filesystem has {self.fs_free_mib} MiB free{holds}, {self.reserved_mib} MiB of it kept for "
                "the host"
            )
            raise errors.InsufficientCapacity(f"{requested_mib} MiB requested, {free_mib} MiB free ({why})")
