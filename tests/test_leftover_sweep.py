"""The session-start sweep (tests/sweep.py) removes what dead test runs left, and nothing a live one
holds; and the teardowns of a control plane, a host agent that never came up and the fake internet
leave nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from paddock_hostagent.guest.build import ensure_agent_binary
from tests import sweep
from tests.hostagent.conftest import AgentProcess, leftovers
from tests.live import start_platform
from tests.network.internet import FakeInternet

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[1]
HOURS = 3600


def _mounted(point: Path) -> bool:
    return str(point) in sweep.mounts_under(point)


def _loop_attached(device: str, backing: Path) -> bool:
    """Whether ``device`` still holds ``backing``. Not merely whether it holds a file: a device the sweep
    freed is the lowest free one, and another test running beside this one attaches its own file to it
    at once (``losetup -f``)."""
    try:
        held = Path(f"/sys/block/{Path(device).name}/loop/backing_file").read_text().strip()
    except OSError:
        return False
    return held.removesuffix(" (deleted)") == str(backing.resolve())


def _netns_exists(name: str) -> bool:
    return (sweep.NETNS_DIR / name).exists()


def _nft_table_exists(table: str) -> bool:
    return subprocess.run(["nft", "list", "table", "ip", table], capture_output=True).returncode == 0


@dataclass
class DeadRun:
    """A host agent state dir as a run killed part-way leaves it: its slot's netns, a mount and a loop
    device under it, an nft table its owner recorded."""

    directory: Path
    mount: Path
    netns: str
    loop: str
    backing: Path  # the file the loop device holds
    table: str

    def everything_there(self) -> bool:
        return (
            self.directory.is_dir()
            and _mounted(self.mount)
            and _netns_exists(self.netns)
            and _loop_attached(self.loop, self.backing)
            and _nft_table_exists(self.table)
        )

    def nothing_left(self) -> list[str]:
        left = [f"mount {p}" for p in sweep.mounts_under(self.directory)]
        left += [f"loop {self.loop}"] if _loop_attached(self.loop, self.backing) else []
        left += [f"netns {self.netns}"] if _netns_exists(self.netns) else []
        left += [f"nft table {self.table}"] if _nft_table_exists(self.table) else []
        left += [f"dir {self.directory}"] if self.directory.exists() else []
        return left


def _hold(path: Path, record: dict[str, object] | None = None) -> subprocess.Popen[bytes]:
    """A live process holding ``path``'s lock (with ``record``: an owner lock through ``OwnerLock``,
    else a plain flock as the host agent takes it) until its stdin closes; returns once it holds it."""
    if record is not None:
        take = f"from tests.sweep import OwnerLock; o = OwnerLock(Path({str(path.parent)!r}), {record!r})"
    else:
        take = f"f = open({str(path)!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX)"
    code = f"import fcntl, sys; from pathlib import Path; {take}; print('held', flush=True); sys.stdin.read()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    return holder


def _release(holder: subprocess.Popen[bytes]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=30)


@pytest.fixture
def dead_run(tmp_path: Path) -> Iterator[DeadRun]:
    tag = secrets.token_hex(4)
    directory = tmp_path / f"pdkt-{tag}"
    slot = f"sw{tag}"
    table = f"pdksweep{tag}"
    mount = directory / "slots" / slot / "rootfs"
    mount.mkdir(parents=True)
    (directory / "agent.lock").touch()
    # The owner recorded its tables, then died (a process that exits drops its lock).
    _release(_hold(directory / sweep.OWNER_LOCK, {"nft_tables": [table]}))
    assert json.loads((directory / sweep.OWNER_LOCK).read_text())["nft_tables"] == [table]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "pdksweep", str(mount)], check=True)
    subprocess.run(["ip", "netns", "add", f"pdk-{slot}"], check=True)
    backing = directory / "disks.xfs"
    backing.write_bytes(b"\0" * (1 << 20))
    loop = subprocess.run(
        ["losetup", "-f", "--show", str(backing)], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["nft", "add", "table", "ip", table], check=True)
    run = DeadRun(directory, mount, f"pdk-{slot}", loop, backing, table)
    try:
        assert run.everything_there()
        yield run
    finally:  # whatever the test did, this run leaves nothing either
        if directory.exists():
            sweep.remove_state(directory, [table])
        subprocess.run(["ip", "netns", "delete", run.netns], capture_output=True)
        subprocess.run(["nft", "delete", "table", "ip", table], capture_output=True)
        if _loop_attached(loop, backing):
            subprocess.run(["losetup", "-d", loop], capture_output=True)


def test_a_dead_runs_state_dir_is_taken_down_with_its_mounts_loops_netns_and_tables(
    dead_run: DeadRun, tmp_path: Path
) -> None:
    swept = sweep.sweep(tmp_path)
    assert dead_run.nothing_left() == []
    assert f"netns {dead_run.netns}" in swept and f"nft table {dead_run.table}" in swept, swept
    assert f"mount {dead_run.mount}" in swept and f"dir {dead_run.directory}" in swept, swept


def test_a_dead_agents_sandboxes_still_running_in_its_cgroup_are_killed_and_the_cgroup_removed(
    tmp_path: Path,
) -> None:
    # An agent killed on a stop that hung left its parked sandboxes running in its cgroup; their
    # mount namespaces held their disks' loop devices, and nothing took them down.
    directory = tmp_path / f"pdkt-{secrets.token_hex(4)}"
    directory.mkdir()
    top = Path("/sys/fs/cgroup/pids") / f"paddock-{sweep.agent_tag(directory)}"
    group = top / "parked-sweep"
    group.mkdir(parents=True)
    sandbox = subprocess.Popen(["sleep", "600"])
    try:
        (group / "cgroup.procs").write_text(str(sandbox.pid))
        swept = sweep.remove_state(directory, [])
        assert f"process {sandbox.pid}" in swept, swept
        assert sandbox.wait(timeout=10) == -9
        assert not top.exists() and not directory.exists(), swept
    finally:
        sandbox.kill()
        sandbox.wait()
        for path in (group, top):
            with contextlib.suppress(OSError):
                path.rmdir()


def test_a_dead_vm_agents_qemu_its_slots_namespace_and_sockets_go(tmp_path: Path) -> None:
    # A VM agent's QEMU runs in no cgroup of the agent's: killed mid-run, CI's machine kept one
    # running, in its slot's namespace, after the sweep had removed the state dir its disk was in.
    directory = tmp_path / f"pdkt-{secrets.token_hex(4)}"
    slot = secrets.token_hex(4)
    slot_dir = directory / "vm" / "slots" / slot
    slot_dir.mkdir(parents=True)
    runtime_root = tmp_path / "run"
    (runtime_root / "vm" / slot).mkdir(parents=True)
    netns = f"pdk-{slot}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    # What QEMU's command line names: its overlay and pidfile in the slot (``-drive file=…``).
    qemu = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", f"file={slot_dir}/overlay.qcow2"]
    )
    try:
        # Popen returns once the child's exec is past its point of no return (vfork), which is before
        # the kernel has set up its new command line: under load, /proc/<pid>/cmdline was still empty
        # and the sweep found no process (run 53). A QEMU the sweep meets has long been running.
        cmdline = Path(f"/proc/{qemu.pid}/cmdline")
        deadline = time.monotonic() + 10
        while str(slot_dir).encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert str(slot_dir).encode() in cmdline.read_bytes()
        swept = sweep.remove_state(directory, [], runtime_root)
        assert f"process {qemu.pid}" in swept and f"netns {netns}" in swept, swept
        assert qemu.wait(timeout=10) == -9
        assert not _netns_exists(netns) and not (runtime_root / "vm" / slot).exists()
        assert not directory.exists(), swept
    finally:
        qemu.kill()
        qemu.wait()
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)


@pytest.mark.parametrize("lock", [sweep.OWNER_LOCK, "agent.lock"])
def test_a_held_lock_keeps_the_dir_until_its_holder_dies(
    dead_run: DeadRun, tmp_path: Path, lock: str
) -> None:
    """The test process that owns the dir (even while its agent is down), or a running agent."""
    owner = lock == sweep.OWNER_LOCK
    holder = _hold(dead_run.directory / lock, {"nft_tables": [dead_run.table]} if owner else None)
    try:
        assert sweep.sweep(tmp_path) == []
        assert dead_run.everything_there()
    finally:
        _release(holder)
    assert f"dir {dead_run.directory}" in sweep.sweep(tmp_path)
    assert dead_run.nothing_left() == []


def test_a_dir_marked_kept_stays(dead_run: DeadRun, tmp_path: Path) -> None:
    (dead_run.directory / sweep.KEEP_MARKER).touch()
    assert sweep.sweep(tmp_path) == []
    assert dead_run.everything_there()


def _age(directory: Path, seconds: float) -> None:
    when = time.time() - seconds
    for path in [directory, *directory.iterdir()]:
        os.utime(path, (when, when), follow_symlinks=False)


def test_a_dir_without_an_owner_lock_goes_only_when_quiet_for_hours_and_named_by_no_process(
    tmp_path: Path,
) -> None:
    """Made before owner locks existed: a running CI of that code restarts agents in such dirs."""
    directory = tmp_path / f"pdkcp-{secrets.token_hex(3)}"
    directory.mkdir()
    (directory / "controlplane.log").write_text("{}\n")
    assert sweep.sweep(tmp_path) == []  # just written
    _age(directory, sweep.LEGACY_QUIET_S - HOURS)
    assert sweep.sweep(tmp_path) == []  # quiet, but not for long enough
    _age(directory, sweep.LEGACY_QUIET_S + HOURS)
    env = dict(os.environ, PADDOCK_CP_DATA_DIR=str(directory))
    control_plane = subprocess.Popen(["sleep", "600"], env=env)
    try:
        environ = Path(f"/proc/{control_plane.pid}/environ")
        deadline = time.monotonic() + 10
        while str(directory).encode() not in environ.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)  # a loaded box may show the child before its exec has set its environment
        assert str(directory).encode() in environ.read_bytes(), "the stand-in control plane never ran"
        swept = sweep.sweep(tmp_path)
        assert control_plane.poll() is None, "the stand-in control plane ended during the sweep"
        assert swept == []  # a process runs with it as its data dir
    finally:
        control_plane.kill()
        control_plane.wait()
    assert sweep.sweep(tmp_path) == [f"dir {directory}"]
    assert not directory.exists()


def test_a_fake_internet_goes_once_its_maker_is_dead_and_not_before(tmp_path: Path) -> None:
    """A run killed while a fake internet served left its namespace, its server in it, its veth pair
    and its log (CI's machine held one after a session ended mid-run). The log's lock says whether its
    maker lives."""
    live, dead = (f"{sweep.FAKE_INTERNET_PREFIX}{secrets.token_hex(3)}" for _ in range(2))
    holder = _hold(tmp_path / f"{live}.log")
    (tmp_path / f"{dead}.log").write_text("serving\n")
    host_link = f"pin{dead.removeprefix(sweep.FAKE_INTERNET_PREFIX)}"
    server = None
    try:
        for name in (live, dead):
            subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(
            ["ip", "link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns", dead],
            check=True,
        )
        server = subprocess.Popen(["nsenter", f"--net=/run/netns/{dead}", "--", "sleep", "600"])
        deadline = time.monotonic() + 5
        while str(server.pid) not in _netns_pids(dead) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str(server.pid) in _netns_pids(dead)

        swept = sweep.sweep(tmp_path)

        assert swept == [f"process {server.pid}", f"netns {dead}", f"log {tmp_path / dead}.log"], swept
        assert server.wait(timeout=10) == -9
        assert not _netns_exists(dead)
        assert subprocess.run(["ip", "link", "show", host_link], capture_output=True).returncode != 0
        assert _netns_exists(live) and (tmp_path / f"{live}.log").exists()
    finally:
        _release(holder)
        if server is not None:
            server.kill()
            server.wait()
        for name in (live, dead):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def _netns_pids(name: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()


def test_a_fake_internet_whose_test_process_was_killed_is_swept() -> None:
    """The real one: made by a process then killed, as a session ended mid-run kills its tests."""
    code = (
        "import sys; from tests.network.internet import FakeInternet; f = FakeInternet().start(); "
        "print(f.netns, f.process.pid, flush=True); sys.stdin.read()"
    )
    maker = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert maker.stdout is not None
    netns, server = maker.stdout.readline().split()
    log = Path(f"/tmp/{netns}.log")
    try:
        sweep.sweep()
        assert _netns_exists(netns) and log.exists(), "a live one stays"
        maker.kill()
        maker.wait()
        assert _netns_exists(netns) and server in _netns_pids(netns), "its server outlives it"
        swept = sweep.sweep()
        assert f"netns {netns}" in swept and f"log {log}" in swept, swept
        assert not _netns_exists(netns) and not log.exists()
        assert (
            not Path(f"/proc/{server}/cmdline").exists() or not Path(f"/proc/{server}/cmdline").read_bytes()
        )
    finally:
        maker.kill()
        maker.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(server), 9)
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
        log.unlink(missing_ok=True)


def test_the_fake_internet_removes_its_log_and_namespace_when_stopped() -> None:
    with FakeInternet() as internet:
        assert internet.log_path.exists() and _netns_exists(internet.netns)
    assert not internet.log_path.exists()
    assert not _netns_exists(internet.netns)


def test_an_agent_that_never_answers_leaves_nothing(tmp_path: Path) -> None:
    """A fixture that calls ``start()`` before its ``try`` never reaches teardown_agent: an agent that
    does not come up in time is stopped by ``start()`` itself, and what it made (its pool's slots, with
    their netns, disk mounts and loop devices, and its nft tables) removed."""
    ensure_agent_binary(tmp_path)
    agent = AgentProcess(  # it listens on 127.0.0.2; start() waits for it on 127.0.0.1
        state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"),
        guest_dir=tmp_path,
        pool_size=1,
        extra_env={"PADDOCK_HOST_HOST": "127.0.0.2"},
    )
    made: dict[str, set[str]] = {"slots": set(), "tables": set()}
    done = threading.Event()

    def watch() -> None:  # what the agent makes while start() waits for it
        while not done.is_set():
            made["slots"] |= {p.parent.name for p in (agent.state_dir / "slots").glob("*/slot.json")}
            made["tables"] |= {t for t in agent.nft_tables if _nft_table_exists(t)}
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(RuntimeError, match="host agent did not start"):
            agent.start(timeout_s=45)
    finally:
        done.set()
        watcher.join()
    assert made["slots"] and agent.nft_table in made["tables"], made
    assert agent.process is not None and agent.process.poll() is not None
    assert leftovers(agent.state_dir) == []
    assert not agent.state_dir.exists()
    assert not [f"netns pdk-{slot}" for slot in made["slots"] if _netns_exists(f"pdk-{slot}")]
    assert not [table for table in agent.nft_tables if _nft_table_exists(table)]


@pytest.mark.parametrize("keep", [False, True])
def test_a_stopped_platform_removes_its_control_plane_state_unless_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    if keep:
        monkeypatch.setenv("PADDOCK_TEST_KEEP", "1")
    platform = start_platform(tmp_path, agents=0)
    state_dir = platform.controlplane.state_dir
    try:
        assert (state_dir / "controlplane.db").exists()
        assert sweep.claim_if_dead(state_dir) is None  # the sweep leaves a live platform's dir alone
        platform.controlplane.stop()
        assert sweep.claim_if_dead(state_dir) is None  # also while its control plane is down
    finally:
        platform.stop()
    try:
        assert state_dir.exists() == keep
        if keep:
            assert (state_dir / sweep.KEEP_MARKER).exists() and (state_dir / "controlplane.log").exists()
            assert sweep.claim_if_dead(state_dir) is None  # nor does a later session remove it
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def _crun_create(runtime_root: Path, bundle: Path, container: str) -> None:
    """A container as an agent's slot holds one: created by crun in ``bundle`` (an empty root: its init
    waits to be started, and never is), its record in ``runtime_root``."""
    (bundle / "rootfs" / "bin").mkdir(parents=True)
    shutil.copy("/bin/true", bundle / "rootfs" / "bin" / "true")  # crun looks for it at create
    subprocess.run(["crun", "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": "rootfs"}
    config["process"]["args"] = ["/bin/true"]
    config["process"]["terminal"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    root = str(runtime_root / "crun")
    subprocess.run(["crun", "--root", root, "create", "--bundle", str(bundle), container], check=True)


def _crun_ids(runtime_root: Path) -> set[str]:
    listed = subprocess.run(
        ["crun", "--root", str(runtime_root / "crun"), "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {entry["id"] for entry in json.loads(listed.stdout or "[]") or []}


def test_a_container_whose_test_state_dir_is_gone_leaves_the_runtimes_list(tmp_path: Path) -> None:
    # A test agent killed with a sandbox created: its teardown removed the state dir, and crun kept the
    # container's record (a full run left one in /run/paddock/crun that `crun list` showed for hours).
    runtime_root = tmp_path / "run"
    tag = secrets.token_hex(4)
    gone, live = f"pdksweep-gone-{tag}", f"pdksweep-live-{tag}"
    gone_dir, live_dir = tmp_path / f"pdkt-{tag}", tmp_path / f"pdkt-live-{tag}"
    try:
        _crun_create(runtime_root, gone_dir / "slots" / "s1", gone)
        _crun_create(runtime_root, live_dir / "slots" / "s1", live)
        assert _crun_ids(runtime_root) == {gone, live}
        shutil.rmtree(gone_dir)
        holder = _hold(live_dir / "agent.lock")  # the live run's agent is up
        try:
            swept = sweep.sweep(tmp_path, runtime_root)
        finally:
            _release(holder)
        assert f"container {gone}" in swept, swept
        assert _crun_ids(runtime_root) == {live}, "a live run's container was deleted, or a dead one kept"
        # Once that run's agent dies, taking its state dir down deletes its containers too.
        assert f"container {live}" in sweep.remove_state(live_dir, [], runtime_root)
        assert _crun_ids(runtime_root) == set()
    finally:
        for container in (gone, live):
            subprocess.run(
                ["crun", "--root", str(runtime_root / "crun"), "delete", "--force", container],
                capture_output=True,
            )
