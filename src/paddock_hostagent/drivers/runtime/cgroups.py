"""Sandbox cgroups on a cgroup-v1 (hybrid) host: placement under the agent's own group, freezing,
OOM accounting and removal.

The OCI runtimes take one ``cgroupsPath`` for every hierarchy. A relative path lands at each
hierarchy's root under crun (runc nests it under its own group), which would take sandboxes out of the
agent's memory accounting. So the driver gives both runtimes an absolute path built from the agent's
own group, preferring the memory hierarchy's (the one that accounts for the machine's RAM):
``<agent's memory cgroup>/paddock-<tag>/<sandbox id>``, where the tag is unique to the agent's state
directory, so that agents sharing a cgroup never remove each other's groups.

In a hierarchy where the agent sits at the root (here: every one but memory), the runtime creates that
path's ancestors too. ``prune`` removes what is left empty: the agent's own level after a destroy, and
at shutdown also those fabricated ancestors, so nothing stays behind below the agent's memory cgroup (an
empty child would keep its owner from removing it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from paddock_hostagent.drivers.system.host_processes import read_small

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PREFERRED_PARENTS = ("memory", "pids", "cpu")


@dataclass(frozen=True)
class CgroupLayout:
    """The agent's place in each hierarchy (``/proc/self/cgroup``) and where sandboxes go."""

    own_paths: dict[str, str]
    root: Path = CGROUP_ROOT
    tag: str = ""

    @classmethod
    def discover(
        cls, proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT, tag: str = ""
    ) -> CgroupLayout:
        own: dict[str, str] = {}
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else ["unified"]:
                own[controller.removeprefix("name=")] = path
        return cls(own, root, tag)

    @property
    def group(self) -> str:
        return f"paddock-{self.tag}" if self.tag else "paddock"

    @property
    def parent(self) -> str:
        for controller in _PREFERRED_PARENTS:
            path = self.own_paths.get(controller, "/")
            if path not in ("", "/"):
                return path.rstrip("/")
        return ""

    def sandbox_path(self, sandbox_id: str) -> str:
        return f"{self.parent}/{self.group}/{sandbox_id}"

    @property
    def agent_group(self) -> str:
        """The group every sandbox of this agent sits in (``<parent>/paddock-<tag>``)."""
        return f"{self.parent}/{self.group}"

    def limit_pids(self, budget: int) -> None:
        """Caps the tasks of all this agent's sandboxes together: the pids controller charges every
        ancestor of a forking task, so a fork fails with EAGAIN once the agent's group reaches
        ``budget``, whatever each sandbox's own ``pids.max`` allows. Created here (before the runtime
        would create it without a limit) and re-applied on every boot, since ``prune`` removes it
        when the last sandbox goes."""
        if not (self.root / "pids").is_dir():
            return  # no pids controller on this host: each sandbox's own pids.max is all there is
        group = self.root / "pids" / self.agent_group.lstrip("/")
        group.mkdir(parents=True, exist_ok=True)
        (group / "pids.max").write_text(str(budget))

    def limit_memory(self, limit_bytes: int) -> None:
        """Caps the memory of all this agent's sandboxes together (cgroup v1 is hierarchical): past it
        the kernel reclaims their page cache, then kills a process of theirs — the one with the most
        memory among all sandboxes — and counts the kill in that sandbox's own ``oom_control``. The
        agent, the control plane and the host sit outside the group. Re-applied on every boot, like
        ``limit_pids``."""
        if limit_bytes <= 0 or not (self.root / "memory").is_dir():
            return
        group = self.root / "memory" / self.agent_group.lstrip("/")
        group.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # EBUSY: already above a lower new limit; kept as it was
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))

    def pids_in_use(self) -> int:
        """Tasks in all this agent's sandboxes (the pids controller's count for the agent's group)."""
        try:
            return int(read_small(self.root / "pids" / self.agent_group.lstrip("/") / "pids.current"))
        except (FileNotFoundError, ValueError):
            return 0

    def prune(self, *, ancestors: bool = False) -> None:
        """Removes the agent's group where it is empty; with ``ancestors``, also the empty directories
        above it that exist only because a runtime created them (those strictly below the agent's own
        group in that hierarchy). Never removes a non-empty group (rmdir refuses)."""
        for hierarchy in _hierarchies(self.root):
            own = self.own_paths.get(hierarchy, "/").rstrip("/")
            chain = [self.agent_group]
            if ancestors:
                parent = self.parent
                while parent and parent != own and parent.startswith(own + "/"):
                    chain.append(parent)
                    parent = parent.rsplit("/", 1)[0]
            for path in chain:
                try:
                    os.rmdir(self.root / hierarchy / path.lstrip("/"))
                except OSError:
                    break  # missing, or still in use: the levels above are too


def kernel_task_limit() -> int:
    """How many tasks the kernel will create at all: ``pid_max`` or ``threads-max``, the smaller."""
    limits = []
    for name in ("/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"):
        with contextlib.suppress(OSError, ValueError):
            limits.append(int(read_small(name)))
    return min(limits) if limits else 32768


def pids_budget(configured: int, reserve_fraction: float = 0.25) -> int:
    """Tasks all sandboxes of this host may hold together: ``configured`` when set, else the kernel's
    limit less a quarter kept for the host (its daemons, the agent, the runtimes, ssh for an operator)."""
    kernel = kernel_task_limit()
    if configured > 0:
        return min(configured, kernel)
    return max(int(kernel * (1 - reserve_fraction)), 1)


def _hierarchies(root: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in root.iterdir() if entry.is_dir())
    except FileNotFoundError:
        return []


class SandboxCgroup:
    """One sandbox's groups, addressed by the absolute ``cgroupsPath`` the runtime was given.

    The readers answer "nothing" for a group that is gone *or going*: while a destroy removes it, a
    file of the group can still be found and fail to open with ENODEV (kernfs has deactivated it), and
    a listing of sandboxes that reads it then must not fail."""

    def __init__(self, path: str, root: Path = CGROUP_ROOT) -> None:
        self.path = path
        self.root = root

    def dir(self, hierarchy: str) -> Path:
        return self.root / hierarchy / self.path.lstrip("/")

    # -- freezer --------------------------------------------------------------------------------

    async def freeze(self, timeout_s: float = 10.0) -> None:
        """Freezes every task of the group (v1 freezer, well under a millisecond for a quiet one)."""
        state = self.dir("freezer") / "freezer.state"
        state.write_text("FROZEN")
        deadline = time.monotonic() + timeout_s
        while state.read_text().strip() != "FROZEN":
            if time.monotonic() > deadline:
                self.thaw()
                raise TimeoutError(f"cgroup {self.path} did not freeze within {timeout_s:.0f}s")
            await asyncio.sleep(0.0002)
            state.write_text("FROZEN")

    def thaw(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir("freezer") / "freezer.state").write_text("THAWED")

    def is_frozen(self) -> bool:
        try:
            state = read_small(self.dir("freezer") / "freezer.state")
        except OSError:
            return False
        return state.strip() in ("FROZEN", "FREEZING")

    # -- limits ---------------------------------------------------------------------------------

    def set_limits(self, memory_bytes: int, cpu_quota_us: int) -> None:
        """Gives a running group the memory (and memory+swap, as the runtime does) and CPU quota a
        sandbox's shape asks for: what a parked sandbox gets when a create claims it."""
        memory = self.dir("memory")
        limit, memsw = memory / "memory.limit_in_bytes", memory / "memory.memsw.limit_in_bytes"
        # memory+swap may never be below memory: raise it first, lower it last.
        current = int(read_small(limit))
        order = [memsw, limit] if memory_bytes > current else [limit, memsw]
        for path in order:
            if path is limit or path.exists():
                path.write_text(str(memory_bytes))
        (self.dir("cpu") / "cpu.cfs_quota_us").write_text(str(cpu_quota_us))

    # -- accounting -----------------------------------------------------------------------------

    def oom_kills(self) -> int:
        """Processes killed by this group's memory limit (``oom_kill`` in memory.oom_control)."""
        try:
            text = (self.dir("memory") / "memory.oom_control").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def memory_usage_bytes(self) -> int:
        try:
            return int((self.dir("memory") / "memory.usage_in_bytes").read_text())
        except (OSError, ValueError):
            return 0

    def cpu_usage_ns(self) -> int | None:
        """CPU time all the group's tasks have used, in nanoseconds (``cpuacct.usage``); None: gone."""
        try:
            return int(read_small(self.dir("cpuacct") / "cpuacct.usage"))
        except (OSError, ValueError):
            return None

    def memory_in_use(self) -> tuple[int, int] | None:
        """(bytes in use, limit) as ``docker stats`` counts them: ``memory.usage_in_bytes`` less the
        inactive file cache (``total_inactive_file``, which the kernel reclaims first), and
        ``memory.limit_in_bytes``; None when the group is gone."""
        memory = self.dir("memory")
        try:
            usage = int(read_small(memory / "memory.usage_in_bytes"))
            limit = int(read_small(memory / "memory.limit_in_bytes"))
            fd = os.open(memory / "memory.stat", os.O_RDONLY | os.O_CLOEXEC)
            try:
                stat = os.read(fd, 16384).decode()
            finally:
                os.close(fd)
        except (OSError, ValueError):
            return None
        inactive = 0
        for line in stat.splitlines():
            key, _, value = line.partition(" ")
            if key == "total_inactive_file":
                inactive = int(value)
                break
        return max(usage - inactive, 0), limit

    def pids(self) -> list[int]:
        try:
            text = (self.dir("pids") / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def exists(self) -> bool:
        return self.dir("memory").is_dir() or self.dir("pids").is_dir()

    # -- removal --------------------------------------------------------------------------------

    def remove(self) -> None:
        """Removes the group from every hierarchy (it must be empty); missing groups are fine."""
        for hierarchy in _hierarchies(self.root):
            directory = self.dir(hierarchy)
            for attempt in range(50):
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt == 49:
                        raise
                    time.sleep(0.01)
