"""Admission: what this host can still promise a new sandbox, in memory and in disk.

A sandbox's ``mem_mib`` and ``disk_mib`` are limits it may grow into at any time, not what it uses
now, so a promise is kept only if the machine can still give every sandbox the rest of its limit.
Memory free for a new sandbox is the smaller of

- the agent's own budget: ``total_mib`` (the machine's total less ``reserved_mib``, or as configured)
  less every limit already promised, and
- the machine now: ``MemAvailable`` less ``reserved_mib`` less what the sandboxes may still take
  (each one's limit less its current use); this catches memory taken by anything else on the machine.

Disk free is the host filesystem's free space less ``disk_reserved_mib`` less what the sandboxes'
sparse disks may still take (each one's size less the blocks its image holds now).

A refusal is ``InsufficientCapacity`` (507) whose message starts ``"<N> MiB requested, <M> MiB free"``
and says which of these ran out.
"""

from __future__ import annotations

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
    promises: list[Promise]

    @property
    def promised_mib(self) -> int:
        return sum(promise.limit_mib for promise in self.promises)

    @property
    def unused_mib(self) -> int:
        return sum(promise.unused_mib for promise in self.promises)

    @property
    def budget_free_mib(self) -> int:
        return self.total_mib - self.promised_mib

    @property
    def machine_free_mib(self) -> int:
        return self.available_mib - self.reserved_mib - self.unused_mib

    @property
    def free_mib(self) -> int:
        return max(min(self.budget_free_mib, self.machine_free_mib), 0)

    def admit(self, requested_mib: int) -> None:
        if requested_mib <= self.free_mib:
            return
        count = len(self.promises)
        if self.machine_free_mib < self.budget_free_mib:
            why = (
                f"memory: the machine has {self.available_mib} MiB available, {self.unused_mib} MiB of it "
                f"promised to {count} sandboxes and {self.reserved_mib} MiB kept for the host"
            )
        else:
            why = f"memory: {self.promised_mib} of this host's {self.total_mib} MiB promised to {count} sandboxes"
        raise errors.InsufficientCapacity(f"{requested_mib} MiB requested, {self.free_mib} MiB free ({why})")


@dataclass(frozen=True)
class DiskView:
    fs_free_mib: int
    reserved_mib: int
    promises: list[Promise]

    @property
    def unused_mib(self) -> int:
        return sum(promise.unused_mib for promise in self.promises)

    @property
    def free_mib(self) -> int:
        return max(self.fs_free_mib - self.reserved_mib - self.unused_mib, 0)

    def admit(self, requested_mib: int) -> None:
        if requested_mib <= self.free_mib:
            return
        why = (
            f"disk: the host's filesystem has {self.fs_free_mib} MiB free, {self.unused_mib} MiB of it "
            f"promised to {len(self.promises)} sandbox disks and {self.reserved_mib} MiB kept for the host"
        )
        raise errors.InsufficientCapacity(f"{requested_mib} MiB requested, {self.free_mib} MiB free ({why})")
