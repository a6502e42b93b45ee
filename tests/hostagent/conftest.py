"""Host agent fixtures: real host agent processes running real sandboxes under crun/runc.

Each agent runs as its own process (``python -m paddock_hostagent.main``) with its own state dir, a
private /24 and its own nftables table, so a test can kill and restart it like an operator would.
Images come from the shared cache ``$PADDOCK_TEST_IMAGE_CACHE`` (default /var/lib/paddock/images) and are
built on first use. Everything a test creates is destroyed afterwards, even when it fails, and the
session ends by checking that no mount, loop device, netns or cgroup was left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_hostagent.client import HostAgentClient
from paddock_hostagent.drivers.net.dns import IP_FREEBIND
from paddock_hostagent.guest.build import ensure_agent_binary
from paddock_hostagent.host import XFS_LOG_WORKER_SETTING
from paddock_hostagent.images import ImageStore
from paddock_hostagent.schemas import CreateSandboxBody
from tests.ports import free_port, worker_index
from tests.sweep import OwnerLock, agent_tag, lock_free, remove_state

TOKEN = "test-host-agent-token-0123456789"
DISK_MIB = 2048
#: How long a test waits for a host agent or control plane it started to answer. Generous on purpose: it
#: costs nothing when the process comes up, and at load 20-30 on the 2-core box (two test workers beside
#: gVisor and QEMU boots) a control plane that had logged "Uvicorn running" was not ready within 60 s.
STARTUP_TIMEOUT_S = 180.0
_subnet_counter = iter(range(10_000))


def image_cache() -> Path:
    return Path(os.environ.get("PADDOCK_TEST_IMAGE_CACHE", "/var/lib/paddock/images"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (namespaces, cgroups, mounts)")
    for item in items:
        if "root" in item.keywords and "hostagent" in str(item.fspath):
            item.add_marker(skip)


def private_subnet() -> str:
    """A /24 no agent on this machine uses yet (another test run's agents included): two agents on one
    /24 each install a guard that drops the other's sandbox replies, and a connection to a sandbox then
    hangs; the second one's resolver cannot even bind its gateway's port 53.

    Each pytest worker picks in a slice of its own (as ``tests/ports.py`` does for ports): CI saw three
    agents of two workers fail to start at once with "address already in use" on that port, the /24
    picked by both before either had routed it. The pid spreads runs one after the other apart; a /24
    already routed, or whose gateway's DNS port is bound (an agent that has not routed it yet), is
    skipped."""
    routes = subprocess.run(["ip", "-4", "-o", "route", "show"], capture_output=True, text=True).stdout
    taken = {int(m) for m in re.findall(r"\b10\.252\.(\d+)\.", routes)}
    for _ in range(len(_subnets)):
        index = _subnets[(os.getpid() * 7 + next(_subnet_counter)) % len(_subnets)]
        if index not in taken and _resolver_port_free(f"10.252.{index}.1"):
            return f"10.252.{index}.0/24"
    raise AssertionError(f"every 10.252.x.0/24 of {_subnets} is in use already: {sorted(taken)}")


def _worker_subnets() -> range:
    """The third octets this pytest worker picks from: 250 split in ``_SUBNET_SLICES``."""
    size = 250 // _SUBNET_SLICES
    start = (worker_index() % _SUBNET_SLICES) * size
    return range(start, start + size)


def _resolver_port_free(gateway: str) -> bool:
    """Whether an agent's resolver could bind ``gateway``:53 now (UDP, as ``drivers/net/dns.py`` binds
    it: ``IP_FREEBIND``, the address need not exist yet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        try:
            probe.bind((gateway, 53))
        except OSError:
            return False
    return True


_SUBNET_SLICES = 5
_subnets = _worker_subnets()


@pytest.fixture
def xfs_log_worker_every_30_s() -> Iterator[None]:
    """XFS's log worker at the kernel's default, every 30 s, for one test, then as it was: for a test of
    what a fork does with a log whose tail the worker has not moved yet (a long log, a grown superblock
    not yet home). With the agent's 1 s, the worker may move it between the test's writes and its fork.
    Such a test is ``serial``: an agent starting beside it would lower the interval again."""
    before = XFS_LOG_WORKER_SETTING.read_text()
    XFS_LOG_WORKER_SETTING.write_text("3000\n")
    # Each mounted filesystem's worker is already queued with the old interval, and reads the new one
    # only when it queues itself again: after its next run, within the old interval (1 s).
    time.sleep(1.5)
    try:
        yield
    finally:
        XFS_LOG_WORKER_SETTING.write_text(before)


@pytest.fixture(scope="session")
def debian_image() -> Path:
    return ImageStore(image_cache()).build("debian:13")


@pytest.fixture(scope="session")
def guest_binary_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("guest")
    ensure_agent_binary(directory)
    return directory


@dataclass
class AgentProcess:
    """A host agent running as a child process."""

    state_dir: Path
    guest_dir: Path
    # PADDOCK_TEST_RUNTIME runs every test agent on one runtime (``runsc``: tests/network on gVisor).
    runtime: str = field(default_factory=lambda: os.environ.get("PADDOCK_TEST_RUNTIME", "auto"))
    pool_size: int = 2
    controlplane_url: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    subnet: str = field(default_factory=private_subnet)
    nft_table: str = field(default_factory=lambda: f"pdktest{secrets.token_hex(3)}")
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    created_ids: list[str] = field(default_factory=list)
    started: bool = False  # it answered /healthz once (a teardown restarts only such an agent)
    # Held from start() until teardown_agent: this test process owns the state dir, even while the
    # agent is down (tests/sweep.py leaves it alone meanwhile, and removes it once this process is gone).
    owner: OwnerLock | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "agent.log"

    @property
    def nft_tables(self) -> list[str]:
        """The tables the agent makes (drivers/net/network.py, drivers/net/egress_rules.py); they outlive it by design."""
        return [self.nft_table, f"{self.nft_table}_egress"]

    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("PADDOCK_")}
        env.update(
            {
                "PADDOCK_HOST_ID": f"test-{self.nft_table}",
                "PADDOCK_HOST_TOKEN": TOKEN,
                "PADDOCK_HOST_HOST": "127.0.0.1",
                "PADDOCK_HOST_PORT": str(self.port),
                "PADDOCK_HOST_STATE_DIR": str(self.state_dir),
                "PADDOCK_HOST_IMAGE_DIR": str(image_cache()),
                "PADDOCK_HOST_SUBNET": self.subnet,
                "PADDOCK_HOST_NFT_TABLE": self.nft_table,
                "PADDOCK_HOST_POOL_SIZE": str(self.pool_size),
                "PADDOCK_HOST_POOL_DISK_MIB": str(DISK_MIB),
                "PADDOCK_HOST_RUNTIME": self.runtime,
                "PADDOCK_HOST_CONTROLPLANE_URL": self.controlplane_url,
                "PADDOCK_HOST_HEARTBEAT_INTERVAL_S": "0.2",
                "PADDOCK_HOST_LOG_JSON": "true",
            }
        )
        env.update(self.extra_env)
        return env

    def argv(self) -> list[str]:
        """The agent's command line (tests/multihost runs it inside a machine's network namespace)."""
        return [sys.executable, "-m", "paddock_hostagent.main"]

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Starts the agent and waits until it answers. When it does not, the process is stopped, and
        on a first start everything it made is removed too (a fixture that calls ``start()`` before its
        ``try`` never reaches ``teardown_agent``)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.owner is None:
            self.owner = OwnerLock(self.state_dir, {"nft_tables": self.nft_tables})
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()  # SIGTERM: the agent takes its warm pool (parked sandboxes too) down itself
            # Not when another agent holds the dir (this one then refused to start, and made nothing).
            if not self.started and lock_free(self.state_dir / "agent.lock"):
                remove_state(self.state_dir, self.nft_tables)
                self.release()
            raise
        self.started = True

    def release(self) -> None:
        """Gives up the state dir (removed by then, or left to the next session's sweep)."""
        if self.owner is not None:
            self.owner.release()
            self.owner = None

    def _start(self, timeout_s: float) -> None:
        guest_dir = self.state_dir / "guest"
        if not guest_dir.exists():  # skip compiling the guest agent again for every agent
            shutil.copytree(self.guest_dir, guest_dir)
        self.port = self.port or free_port()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(self.argv(), env=self.env(), stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"host agent exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"host agent did not start:\n{self.log_tail()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 120.0) -> None:
        """Stops the agent; one that has not stopped within ``timeout_s`` is killed. An agent's stop
        is bounded (10 s for open requests, 30 s for its pools' slots being built, then the parked
        slots' removal), and a loaded CI box has taken over 60 s: a kill leaves its slots behind."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # What it is stuck on, into its log (``paddock_core.stackdump``): every thread's stack, and
            # every asyncio task's if the loop still runs. Shown with the failing test (the leftovers
            # check fails next), before the log goes.
            self.process.send_signal(signal.SIGUSR1)
            self.process.send_signal(signal.SIGUSR2)
            time.sleep(2)
            print(
                f"host agent {self.state_dir.name} did not stop in {timeout_s:.0f} s:\n{self.log_tail(400)}"
            )
            self.process.kill()
            self.process.wait()

    def logged(self, event: str, sandbox_id: str) -> dict[str, Any]:
        """The agent's first log line for ``event`` about ``sandbox_id`` (``create_phases`` …), parsed."""
        for line in self.log_path.read_text(errors="replace").splitlines():
            if f'"{event}"' in line and f'"{sandbox_id}"' in line:
                return dict(json.loads(line))
        raise AssertionError(f"no {event} line for {sandbox_id}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def client(self) -> HostAgentClient:
        return HostAgentClient(self.url, TOKEN)

    def record(self, sandbox_id: str) -> dict[str, Any]:
        return dict(json.loads((self.state_dir / "sandboxes" / f"{sandbox_id}.json").read_text()))


def sandbox_cgroup_dirs(sandbox_ids: list[str]) -> list[Path]:
    """The cgroup directories (any hierarchy) of these sandboxes that still exist."""
    root = Path("/sys/fs/cgroup")
    found: list[Path] = []
    for sandbox_id in sandbox_ids:
        for hierarchy in root.iterdir():
            found += [path for path in _glob(hierarchy, f"**/paddock*/{sandbox_id}") if path.is_dir()]
    return found


def cgroup_dirs(cgroups_path: str) -> list[Path]:
    """The directories of one sandbox's cgroup (its record's ``cgroups_path``) that exist, in any
    hierarchy: a sandbox claimed from the warm pool keeps its slot's cgroup, not one named after it."""
    return [
        path
        for hierarchy in Path("/sys/fs/cgroup").iterdir()
        if (path := hierarchy / cgroups_path.lstrip("/")).is_dir()
    ]


def _glob(directory: Path, pattern: str) -> list[Path]:
    """``directory.glob`` that tolerates other tests' cgroups vanishing while it walks the tree."""
    for _ in range(10):
        try:
            return list(directory.glob(pattern))
        except FileNotFoundError:
            time.sleep(0.05)
    return list(directory.glob(pattern))


def leftovers(state_dir: Path, sandbox_ids: list[str] = ()) -> list[str]:  # type: ignore[assignment]
    """Mounts, loop devices, slots, netns and cgroups that still belong to an agent's state dir."""
    found: list[str] = [f"cgroup {path}" for path in sandbox_cgroup_dirs(list(sandbox_ids))]
    tag = agent_tag(state_dir)
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        found += [f"cgroup {path}" for path in _glob(hierarchy, f"**/paddock-{tag}")]
    slots_dir = state_dir / "slots"
    if slots_dir.is_dir():
        for slot in slots_dir.iterdir():
            found.append(f"slot {slot.name}")
            if Path(f"/run/netns/pdk-{slot.name}").exists():
                found.append(f"netns pdk-{slot.name}")
    addresses = state_dir / "network" / "addresses.json"
    if addresses.exists() and json.loads(addresses.read_text() or "{}"):
        found.append(f"addresses {addresses.read_text()}")
    prefix = str(state_dir)
    with open("/proc/self/mountinfo") as mountinfo:
        found += [f"mount {line.split()[4]}" for line in mountinfo if line.split()[4].startswith(prefix)]
    loops = subprocess.run(["losetup", "-n", "-O", "NAME,BACK-FILE"], capture_output=True, text=True).stdout
    found += [f"loop {line}" for line in loops.splitlines() if prefix in line]
    return found


def report_agent_errors(agent: AgentProcess) -> None:
    """Prints the agent's unexpected errors (with tracebacks) before its log is deleted: pytest shows
    them with a failing test, so a 500 from the agent in CI can be diagnosed afterwards."""
    try:
        lines = agent.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return
    for index, line in enumerate(lines):
        if "unhandled_error" in line or '"level": "error"' in line:
            print(f"host agent {agent.state_dir.name}: " + "\n".join(lines[index : index + 40]))


def teardown_agent(agent: AgentProcess) -> None:
    """Destroys what the agent still holds, stops it, and removes its state, tables and leftovers;
    whatever fails on the way (the agent died, a call raised), the tables and state dir go."""
    try:
        _destroy_and_check(agent)
    finally:
        agent.stop(signal.SIGKILL)  # nothing when it is already down
        for table in agent.nft_tables:
            subprocess.run(["nft", "delete", "table", "ip", table], capture_output=True)
        if agent.owner is not None:  # only a state dir this process made, never someone else's
            remove_state(agent.state_dir, agent.nft_tables)
        agent.release()


def restart_if_killed(agent: AgentProcess) -> None:
    """Starts again an agent a test killed, so that it releases what it adopted (its sandboxes)
    through its own teardown; one that never started, or does not come back, is taken down as it is."""
    if agent.started and agent.process is not None and agent.process.poll() is not None:
        with contextlib.suppress(RuntimeError):
            agent.start()


def _destroy_and_check(agent: AgentProcess) -> None:
    sandbox_ids = [path.stem for path in (agent.state_dir / "sandboxes").glob("*.json")]
    if agent.process is not None and agent.process.poll() is None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        held = set(sandbox_ids)  # what the agent recorded, if it cannot say what it holds
        with contextlib.suppress(httpx.HTTPError):
            listed = httpx.get(agent.url + "/internal/v1/sandboxes", headers=headers, timeout=30)
            if listed.status_code == 200:
                held |= {sandbox["id"] for sandbox in listed.json()}
            else:  # shown with the failing test; the sandboxes recorded on disk are destroyed anyway
                print(
                    f"host agent {agent.state_dir.name}: GET /internal/v1/sandboxes answered "
                    f"{listed.status_code}: {listed.text[:2000]}"
                )
        for sandbox_id in sorted(held):  # one that fails to go is reported below with what it left
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{agent.url}/internal/v1/sandboxes/{sandbox_id}", headers=headers, timeout=60)
        # Snapshots outlive their sandboxes and keep the disk store mounted: the agent removes them too.
        snapshots = agent.state_dir / "disks" / "snapshots"
        for snapshot in sorted(snapshots.glob("snap_*")) if snapshots.is_dir() else []:
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(
                    f"{agent.url}/internal/v1/snapshots/{snapshot.name}", headers=headers, timeout=60
                )
        agent.stop()
    report_agent_errors(agent)  # after the calls above, so that an error they met is shown too
    remaining = leftovers(agent.state_dir, sandbox_ids + agent.created_ids)
    assert not remaining, f"host agent left these behind: {remaining}"


@pytest.fixture(scope="package")
def agent(debian_image: Path, guest_binary_dir: Path) -> Iterator[AgentProcess]:
    """One host agent (default runtime) shared by the tests that do not restart it."""
    process = AgentProcess(state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"), guest_dir=guest_binary_dir)
    process.start()
    try:
        yield process
    finally:
        teardown_agent(process)


@pytest.fixture
def make_agent(debian_image: Path, guest_binary_dir: Path) -> Iterator[Any]:
    """Factory for agents a test starts, kills and restarts itself; all torn down afterwards."""
    made: list[AgentProcess] = []
    tops: list[Path] = []  # the /tmp/pdkt-* dirs above a ``state_subdir``

    def make(**options: Any) -> AgentProcess:
        """``state_subdir``: the state dir is that path under the usual ``/tmp/pdkt-*`` one."""
        top = Path(f"/tmp/pdkt-{secrets.token_hex(3)}")
        subdir = options.pop("state_subdir", "")
        if subdir:
            tops.append(top)
        process = AgentProcess(state_dir=top / subdir, guest_dir=guest_binary_dir, **options)
        made.append(process)
        return process

    try:
        yield make
    finally:
        problems: list[BaseException] = []
        for process in made:  # every one, even when an earlier one's teardown fails
            try:
                restart_if_killed(process)
                teardown_agent(process)
            except Exception as error:
                problems.append(error)
        for top in tops:
            shutil.rmtree(top, ignore_errors=True)
        if problems:
            raise problems[0]


class Sandboxes:
    """Creates sandboxes through the API and destroys them at the end of the test."""

    def __init__(self, host: HostAgentClient, agent: AgentProcess | None = None) -> None:
        self.host = host
        self.agent = agent
        self.created: list[str] = []

    async def create(self, **overrides: Any) -> dict[str, Any]:
        """Creates a sandbox (``overrides``: fields of ``CreateSandboxBody``); returns the answer as its
        wire document, which the tests index like the control plane's JSON."""
        sandbox_id = overrides.pop("id", f"sb-{secrets.token_hex(5)}")
        spec = {
            "id": sandbox_id,
            "name": overrides.pop("name", f"box-{secrets.token_hex(3)}"),
            "rootfs": "debian:13",
            "vcpu": 1,
            "mem_mib": 512,
            "cpu_quota_pct": None,
            "disk_mib": DISK_MIB,
            "start_paused": False,
        }
        spec.update(overrides)
        self.track(sandbox_id)
        return (await self.host.create_sandbox(CreateSandboxBody(**spec))).model_dump()

    def track(self, sandbox_id: str) -> None:
        self.created.append(sandbox_id)
        if self.agent is not None:
            self.agent.created_ids.append(sandbox_id)

    async def destroy_all(self) -> None:
        for sandbox_id in reversed(self.created):
            with contextlib.suppress(Exception):
                await self.host.destroy_sandbox(sandbox_id)


@pytest.fixture
async def host(agent: AgentProcess) -> AsyncIterator[HostAgentClient]:
    async with agent.client() as client:
        yield client


@pytest.fixture
async def sandboxes(host: HostAgentClient, agent: AgentProcess) -> AsyncIterator[Sandboxes]:
    tracker = Sandboxes(host, agent)
    try:
        yield tracker
    finally:
        await tracker.destroy_all()


@pytest.fixture
async def sandbox(sandboxes: Sandboxes) -> dict[str, Any]:
    """A running debian:13 sandbox (512 MiB, 2 GiB disk)."""
    return await sandboxes.create()


async def run(host: HostAgentClient, sandbox_id: str, cmd: str, *args: str, **kwargs: Any) -> dict[str, Any]:
    """The command's result as its wire document (``error`` and the truncation flags only when set)."""
    result = await host.exec(sandbox_id, cmd=cmd, args=list(args), env=kwargs.pop("env", {}), **kwargs)
    return result.model_dump(exclude_none=True)


async def sh(host: HostAgentClient, sandbox_id: str, script: str) -> dict[str, Any]:
    return await run(host, sandbox_id, "bash", "-c", script)
