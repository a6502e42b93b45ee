"""What earlier, dead test runs left in /tmp, and how a session removes it (tests/conftest.py).

A run that is killed part-way (a CI job cancelled, a developer's Ctrl-C twice, a session ended while
its tests ran) never reaches its teardowns: a host agent's state dir ``/tmp/pdkt-<tag>`` keeps its disk
store (xfs on a loop device), its slots' mounts, loop devices and network namespaces, and its
containers' records in the OCI runtime's state directory (``/run/paddock/<runtime>``, shared by every
agent on the machine), and a VM agent's QEMU processes go on running in its slots' namespaces; a
control plane's ``/tmp/pdkcp-<tag>`` keeps its database and log; a fake internet
(tests/network/internet.py) keeps its namespace, its server and its log. The next session removes
those, and only those: other runs on the same machine (a CI run, other developers'
tests) are going on at the same time, so a directory is swept only when its owners are provably gone.

**Who owns a directory.** The test process that made it holds ``test-owner.lock`` in it (``OwnerLock``,
an ``flock`` the kernel drops when that process dies, however it dies) for as long as it owns it, across
restarts of the agent or control plane it runs; a host agent also holds its own ``agent.lock``; a
fake internet's maker holds its log's lock the same way (``held_file``). The sweep takes each lock without blocking: if it gets every one, nobody holds them, and it keeps them
while it removes the directory (an agent started there meanwhile would fail to lock its state dir).
A directory made before owner locks existed (none in it) is swept only when no process on the machine
names it (in its environment, command line or working directory) and nothing in it changed for
``LEGACY_QUIET_S``: no test keeps an agent or control plane stopped that long (pytest's timeout is
300 s a test). A directory with a ``KEPT`` marker (``PADDOCK_TEST_KEEP=1``) is never swept.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

OWNER_LOCK = "test-owner.lock"
KEEP_MARKER = "KEPT"
#: How long a directory without an owner lock must have been untouched (and unnamed by any process).
LEGACY_QUIET_S = 6 * 3600
#: State dirs of host agents (``pdkt2-``: a second agent's, tests/templates) and of control planes.
PATTERNS = ("pdkt-*", "pdkt2-*", "pdkcp-*")
NETNS_DIR = Path("/run/netns")
#: A fake internet's namespace (tests/network/internet.py), and its log ``/tmp/<netns>.log``, which its
#: maker holds locked (``held_file``) while it runs.
FAKE_INTERNET_PREFIX = "pdkinet-"
#: The host agents' OCI runtime state (``runtime_root``, one directory per runtime), shared by every
#: agent on the machine.
RUNTIME_ROOT = Path("/run/paddock")
RUNTIMES = ("crun", "runc", "runsc")


class OwnerLock:
    """The test process's claim on ``directory``: an exclusive ``flock`` on ``test-owner.lock`` (whose
    content records what the sweep cannot find in the directory itself: the agent's nft tables).

    The lock file is made and locked under a temporary name, then renamed into place, so no other
    process can ever see it unlocked while its owner lives."""

    def __init__(self, directory: Path, record: dict[str, Any]) -> None:
        if not lock_free(directory / OWNER_LOCK):
            raise RuntimeError(f"{directory} is owned by another live test process")
        self._handle: IO[str] | None = held_file(
            directory / OWNER_LOCK, json.dumps({"pid": os.getpid(), **record})
        )

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def held_file(path: Path, content: str) -> IO[str]:
    """``path`` with ``content``, locked (``flock``) by this process for as long as the returned handle
    stays open: made and locked under a temporary name, then renamed into place, so no other process
    ever sees it unlocked while its maker lives."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}")
    handle = open(staging, "w")  # noqa: SIM115 - the caller holds it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else has it
        handle.write(content)
        handle.flush()
        staging.replace(path)
    except BaseException:
        handle.close()
        staging.unlink(missing_ok=True)
        raise
    return handle


def _lock_free(path: Path, taken: list[int]) -> bool:
    """Whether nobody holds ``path``'s flock (a missing file: nobody); a lock it gets joins ``taken``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    taken.append(fd)
    return True


def lock_free(path: Path) -> bool:
    """Whether nobody holds ``path``'s flock right now (a missing file: nobody)."""
    taken: list[int] = []
    try:
        return _lock_free(path, taken)
    finally:
        for fd in taken:
            os.close(fd)


def _newest_change(directory: Path) -> float:
    newest = 0.0
    for path in [directory, *directory.iterdir()]:
        with contextlib.suppress(OSError):
            stat = path.lstat()
            newest = max(newest, stat.st_mtime)
    return newest


def _processes_naming(directory: Path, *, anywhere: bool) -> list[int]:
    """The processes but this one whose command line names ``directory`` or a path under it; with
    ``anywhere``, also their environment and working directory."""
    name = os.fsencode(str(directory))
    endings = (name + b"\0", name + b"/")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        blobs = []
        for part in ("cmdline", "environ") if anywhere else ("cmdline",):
            with contextlib.suppress(OSError):
                blobs.append((proc / part).read_bytes() + b"\0")
        if anywhere:
            with contextlib.suppress(OSError):
                blobs.append(os.fsencode(os.readlink(proc / "cwd")) + b"\0")
        if any(ending in blob for blob in blobs for ending in endings):
            found.append(int(proc.name))
    return found


def _named_by_a_process(directory: Path) -> bool:
    """Whether any process's environment, command line or working directory names ``directory``."""
    return bool(_processes_naming(directory, anywhere=True))


def claim_if_dead(directory: Path, now: float | None = None) -> list[int] | None:
    """The locks proving ``directory``'s owners dead, taken (the caller closes them once it has swept
    it), or None when an owner may be alive, or the directory is kept."""
    taken: list[int] = []
    try:
        owned = (directory / OWNER_LOCK).exists()
        if (directory / KEEP_MARKER).exists():
            return None
        if not (_lock_free(directory / OWNER_LOCK, taken) and _lock_free(directory / "agent.lock", taken)):
            return None
        if not owned:  # made before owner locks: quiet for hours, and no process names it
            quiet = (now or time.time()) - _newest_change(directory)
            if quiet < LEGACY_QUIET_S or _named_by_a_process(directory):
                return None
        claimed, taken = taken, []
        return claimed
    except OSError:
        return None
    finally:
        for fd in taken:
            os.close(fd)


# -- taking a state dir down ----------------------------------------------------------------------


def _unescape(field: str) -> str:
    """A mountinfo path (spaces and the like are written as octal escapes)."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape")


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or under ``directory``, deepest first."""
    prefix = str(directory).rstrip("/")
    with open("/proc/self/mountinfo") as mountinfo:
        points = [_unescape(line.split()[4]) for line in mountinfo]
    under = {p for p in points if p == prefix or p.startswith(prefix + "/")}
    return sorted(under, key=lambda p: (p.count("/"), len(p)), reverse=True)


def loops_under(directory: Path) -> list[str]:
    """Loop devices whose backing file is under ``directory``."""
    prefix = str(directory).rstrip("/") + "/"
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip().removesuffix(" (deleted)").startswith(prefix):
                found.append(f"/dev/{backing.parent.parent.name}")
    return sorted(found)


def _run(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def _recorded(directory: Path) -> dict[str, Any]:
    try:
        record = json.loads((directory / OWNER_LOCK).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _runtime_containers(runtime_root: Path) -> list[tuple[str, Path, str, Path]]:
    """Every container the agents' OCI runtimes know: (runtime binary, its ``--root``, id, bundle)."""
    found: list[tuple[str, Path, str, Path]] = []
    for runtime in RUNTIMES:
        root = runtime_root / runtime
        binary = shutil.which(runtime)
        if binary is None or not root.is_dir():
            continue
        listed = subprocess.run(
            [binary, "--root", str(root), "list", "--format", "json"], capture_output=True, text=True
        )
        try:
            entries = json.loads(listed.stdout or "null") or []
        except ValueError:
            continue
        for entry in entries:
            if isinstance(entry, dict) and entry.get("id") and entry.get("bundle"):
                found.append((binary, root, str(entry["id"]), Path(entry["bundle"])))
    return found


def remove_containers(runtime_root: Path, doomed: Callable[[Path], bool]) -> list[str]:
    """Deletes the runtime's record of each container whose bundle ``doomed`` names. A killed agent's
    container stays in the runtime's state directory after its bundle (the agent's slot) is removed: it
    can never run again, and ``crun list`` shows it until someone deletes it."""
    done: list[str] = []
    for binary, root, container, bundle in _runtime_containers(runtime_root):
        if doomed(bundle) and _run(binary, "--root", str(root), "delete", "--force", container):
            done.append(f"container {container}")
    return done


def remove_state(
    directory: Path, nft_tables: list[str] | None = None, runtime_root: Path = RUNTIME_ROOT
) -> list[str]:
    """Takes down what a dead host agent or control plane left in ``directory``: its containers' runtime
    records, the netns of its slots, its mounts (deepest first; lazily when busy), the loop devices
    behind them, its nft tables (``nft_tables``, else those its owner recorded), its empty cgroups, then
    the directory itself. Returns what it removed, and what it could not (``left ...``)."""
    done: list[str] = []
    tables = _recorded(directory).get("nft_tables", []) if nft_tables is None else nft_tables
    tag = agent_tag(directory)
    # Its sandboxes' processes first: a killed agent's parked sandboxes go on running in its cgroup,
    # and their mount namespaces keep the loop devices of their disks attached. A VM agent's QEMU
    # processes are in no cgroup of its own: they name their slot's files on their command line.
    done += _kill_cgroup(tag)
    done += _kill_naming(directory)
    done += remove_containers(runtime_root, lambda bundle: bundle.is_relative_to(directory))
    # The container tier's slots, then the VM tier's, each in its namespace ``pdk-<slot>``; a VM slot
    # also has its sockets' directory in the runtime root.
    for slots, run_dir in ((directory / "slots", None), (directory / "vm" / "slots", runtime_root / "vm")):
        for slot in sorted(slots.iterdir()) if slots.is_dir() else []:
            netns = f"pdk-{slot.name}"
            if (NETNS_DIR / netns).exists() and _run("ip", "netns", "delete", netns):
                done.append(f"netns {netns}")
            if run_dir is not None and (run_dir / slot.name).is_dir():
                shutil.rmtree(run_dir / slot.name, ignore_errors=True)
                done.append(f"dir {run_dir / slot.name}")
    # Slots' mounts first (their loop devices back onto files in the disk store), then the loops, then
    # whatever was busy (the store), lazily if it still is, then the loops that backed it.
    for lazily in (False, False, True):  # a point with mounts stacked on it needs one pass for each
        for point in mounts_under(directory):
            if _run("umount", point) or (lazily and _run("umount", "-l", point)):
                done.append(f"mount {point}")
        for device in loops_under(directory):
            if _run("losetup", "-d", device):
                done.append(f"loop {device}")
        if not mounts_under(directory):
            break
    for table in tables:
        if isinstance(table, str) and _run("nft", "delete", "table", "ip", table):
            done.append(f"nft table {table}")
    cgroup_root = Path("/sys/fs/cgroup")
    if cgroup_root.is_dir():
        for hierarchy in cgroup_root.iterdir():
            with contextlib.suppress(OSError):
                for group in hierarchy.glob(f"**/paddock-{tag}"):
                    for sub in sorted(group.glob("**/"), key=lambda p: len(str(p)), reverse=True):
                        with contextlib.suppress(OSError):
                            sub.rmdir()
    still = mounts_under(directory)
    if still:  # never recurse into a mounted filesystem: rmtree would empty it
        return [*done, *(f"left mount {point}" for point in still)]
    shutil.rmtree(directory, ignore_errors=True)
    done.append(f"dir {directory}")
    return done


def agent_tag(directory: Path) -> str:
    """The tag of the agent whose state dir is ``directory``: its cgroup is ``paddock-<tag>``, as
    ``OciRuntime`` and ``QemuRuntime`` name it."""
    return hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:8]


def _kill_until_gone(alive: Callable[[], list[int]]) -> list[str]:
    """SIGKILLs the processes ``alive()`` names until it names none, for up to 5 s; returns what it
    killed."""
    killed: list[str] = []
    deadline = time.monotonic() + 5
    while (pids := alive()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
                if f"process {pid}" not in killed:
                    killed.append(f"process {pid}")
        time.sleep(0.1)
    return killed


def _kill_naming(directory: Path) -> list[str]:
    """Kills the processes whose command line names a path under ``directory`` (a dead VM agent's QEMU:
    its disk, pidfile and initramfs are there). The directory's owners are gone, so whatever still
    names it is theirs."""
    return _kill_until_gone(lambda: _processes_naming(directory, anywhere=False))


def _kill_cgroup(tag: str) -> list[str]:
    """Kills every process in the agent's cgroups (``paddock-<tag>`` in the pids hierarchy, its
    sandboxes' groups below it)."""
    pids_root = Path("/sys/fs/cgroup/pids")
    groups: list[Path] = []
    for _ in range(10):  # other tests' cgroups come and go while the tree is walked
        try:
            groups = [g for top in pids_root.glob(f"**/paddock-{tag}") for g in [top, *top.glob("**/")]]
            break
        except OSError:
            time.sleep(0.05)

    def alive() -> list[int]:
        pids: list[int] = []
        for group in groups:
            with contextlib.suppress(OSError):
                pids += [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        return pids

    return _kill_until_gone(alive)


def sweep(root: Path = Path("/tmp"), runtime_root: Path = RUNTIME_ROOT) -> list[str]:
    """Removes the state dirs under ``root`` whose owners are dead, the runtime records of containers
    whose bundle was in a test's state dir that is gone, and the fake internets whose makers are dead
    (their logs' locks are free: tests/network/internet.py); returns what it removed."""
    done: list[str] = []

    def left_by_a_test(bundle: Path) -> bool:
        """A bundle that was in a test's state dir under ``root``, now gone."""
        owner = bundle.relative_to(root).parts[0] if bundle.is_relative_to(root) else ""
        return not bundle.exists() and any(fnmatch.fnmatch(owner, pattern) for pattern in PATTERNS)

    done += remove_containers(runtime_root, left_by_a_test)
    candidates = sorted({path for pattern in PATTERNS for path in root.glob(pattern)})
    for directory in candidates:
        if directory.is_symlink() or not directory.is_dir():
            continue
        claimed = claim_if_dead(directory)
        if claimed is None:
            continue
        try:
            done += remove_state(directory)
        finally:
            for fd in claimed:
                os.close(fd)
    for log in root.glob(f"{FAKE_INTERNET_PREFIX}*.log"):
        taken: list[int] = []
        try:
            if _lock_free(log, taken):  # its maker is gone: nothing stops its fake internet now
                done += _remove_fake_internet(log.name.removesuffix(".log"))
                with contextlib.suppress(OSError):
                    log.unlink()
                    done.append(f"log {log}")
        finally:
            for fd in taken:
                os.close(fd)
    return done


def _remove_fake_internet(netns: str) -> list[str]:
    """A dead run's fake internet: its server, still serving in ``netns`` when its test process was
    killed, then the namespace, which takes the veth pair with it."""
    if not (NETNS_DIR / netns).exists():
        return []

    def inside() -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
        return [int(pid) for pid in listed.split()]

    done = _kill_until_gone(inside)
    if _run("ip", "netns", "delete", netns):
        done.append(f"netns {netns}")
    return done
