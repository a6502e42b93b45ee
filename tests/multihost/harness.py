"""Several "machines" on one box: host agents in their own network namespaces, control planes on one
PostgreSQL database.

    root namespace (the control planes' "machine")          host namespaces (one per host agent)
    pmhb<tag> bridge 10.249.N.254/24 ──┬── pmh<tag>1 ─veth─ uplink 10.249.N.1  agent :8081, sandboxes 10.243.N.0/24
        control plane A  :<port>       ├── pmh<tag>2 ─veth─ uplink 10.249.N.2  agent :8081, sandboxes 10.244.N.0/24
        control plane B  :<port>       └── pmh<tag>3 ─veth─ uplink 10.249.N.3  agent :8081, sandboxes 10.245.N.0/24
        route 10.243.N.0/24 via 10.249.N.1 (one per host: routed per-host subnets, docs/deploy-multi-host.md)

Each agent has its own state dir, OCI runtime root, cgroup subtree (named after its state dir),
sandbox subnet, nftables tables (inside its own namespace) and pids budget; it is started with
``nsenter --net`` (only the network namespace changes, so its mounts and cgroups are the machine's, as
on a real host). Host namespaces have no default route: nothing in a test reaches beyond the bridge.
The control planes listen on the bridge address (API, reached by the agents' heartbeats) and on
127.0.0.1 (ingress). Everything is removed at the end, and the end checks that no namespace, link,
nftables table, mount, loop device or cgroup of the cluster is left.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import _pg_execute, pg_admin_url
from tests.hostagent.conftest import STARTUP_TIMEOUT_S, AgentProcess
from tests.live import ControlPlaneProcess, LivePlatform
from tests.ports import free_port

AGENT_PORT = 8081
DOMAIN = "sandbox.localhost"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


@dataclass
class Fabric:
    """The test bridge in the root namespace and one namespace (a "machine") per host."""

    tag: str
    octet: int

    @property
    def bridge(self) -> str:
        return f"pmhb{self.tag}"

    @property
    def gateway(self) -> str:
        return f"10.249.{self.octet}.254"

    def netns(self, index: int) -> str:
        return f"pmh-{self.tag}-{index}"

    def address(self, index: int) -> str:
        return f"10.249.{self.octet}.{index}"

    def subnet(self, index: int) -> str:
        return f"10.{242 + index}.{self.octet}.0/24"

    def up(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def add_machine(self, index: int) -> None:
        netns, outside = self.netns(index), f"pmh{self.tag}{index}"
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "uplink", "netns", netns)
        sh("ip", "link", "set", outside, "master", self.bridge, "up")
        sh("ip", "-n", netns, "addr", "add", f"{self.address(index)}/24", "dev", "uplink")
        sh("ip", "-n", netns, "link", "set", "uplink", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        # The control planes' machine routes each host's sandbox subnet via that host.
        sh("ip", "route", "replace", self.subnet(index), "via", self.address(index))

    def down(self, machines: list[int]) -> None:
        for index in machines:
            sh("ip", "route", "del", self.subnet(index), check=False)
            sh("ip", "netns", "delete", self.netns(index), check=False)
        sh("ip", "link", "delete", self.bridge, check=False)

    def leftovers(self, machines: list[int]) -> list[str]:
        found = [f"netns {name}" for name in _netns_names() if name.startswith(f"pmh-{self.tag}-")]
        links = sh("ip", "-br", "link").stdout
        found += [f"link {line.split()[0]}" for line in links.splitlines() if self.tag in line.split()[0]]
        routes = sh("ip", "route").stdout
        found += [f"route {line}" for line in routes.splitlines() if f"10.249.{self.octet}." in line]
        return found


def _netns_names() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()]


@dataclass
class HostMachine(AgentProcess):
    """A host agent started inside its machine's network namespace, listening on its own address."""

    netns: str = ""
    address: str = ""
    total_mib: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    runtime_root: Path = Path("/run/paddock")

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def host_id(self) -> str:
        return f"test-{self.nft_table}"

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(
            {
                "PADDOCK_HOST_HOST": self.address,
                "PADDOCK_HOST_RUNTIME_ROOT": str(self.runtime_root),
                "PADDOCK_HOST_LABELS": json.dumps(self.labels),
                "PADDOCK_HOST_TOTAL_MIB": str(self.total_mib),
                "PADDOCK_HOST_DISK_RESERVED_MIB": "0",
                # Every agent on the box takes its own pids cgroup; one budget each would add up.
                "PADDOCK_HOST_PIDS_BUDGET": "4096",
                "PADDOCK_HOST_SANDBOX_PIDS_MAX": "256",
            }
        )
        return env

    def argv(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}", *super().argv()]

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.port = AGENT_PORT  # every machine has its own port space
        super().start(timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a machine losing power looks to the control plane (its sandboxes live on)."""
        self.stop(signal.SIGKILL)

    def tables_in_netns(self) -> list[str]:
        """The nft tables in the machine's own netns (the base's ``nft_tables`` names those an agent on
        the host's netns makes, which the owner lock records)."""
        out = sh("ip", "netns", "exec", self.netns, "nft", "list", "tables", check=False).stdout
        return [line.split()[-1] for line in out.splitlines() if line.startswith("table")]


@dataclass
class ClusterControlPlane(ControlPlaneProcess):
    """``paddock controlplane`` on the cluster's PostgreSQL database, listening on the bridge."""

    bind: str = "127.0.0.1"
    pg_url: str = ""
    ingress_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    @property
    def database_url(self) -> str:
        return self.pg_url

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(
            {
                "PADDOCK_CP_HOST": self.bind,
                "PADDOCK_CP_INGRESS_HOST": "127.0.0.1",
                "PADDOCK_CP_INGRESS_PORT": str(self.ingress_port),
                "PADDOCK_CP_INGRESS_SCHEME": "http",
                "PADDOCK_CP_INGRESS_DOMAIN": DOMAIN,
                "PADDOCK_CP_HOST_DEAD_AFTER_S": "10",
                "PADDOCK_CP_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
            }
        )
        env.update(self.extra_env)  # the caller's settings win
        return env

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.ingress_port = self.ingress_port or free_port()
        super().start(timeout_s)


def _create_database() -> tuple[str, str]:
    admin = pg_admin_url()
    name = "mh_" + secrets.token_hex(6)
    asyncio.run(_pg_execute(admin, f"CREATE DATABASE {name}"))
    return admin, name


@dataclass
class Cluster(LivePlatform):
    """Control planes on one PostgreSQL database and host agents on their own "machines"."""

    fabric: Fabric = field(default_factory=lambda: Fabric(secrets.token_hex(2), 0))
    controlplanes: list[ClusterControlPlane] = field(default_factory=list)
    pg_admin: str = ""
    pg_name: str = ""
    machines: list[int] = field(default_factory=list)

    def cp_url(self, index: int) -> str:
        return self.controlplanes[index].url

    def http(self, api_key: str, cp: int = 0, **options: Any) -> httpx.Client:  # type: ignore[override]
        options.setdefault("timeout", 120)
        return httpx.Client(base_url=self.cp_url(cp), headers={"X-API-Key": api_key}, **options)

    def host(self, host_id: str) -> HostMachine:
        return next(a for a in self.agents if isinstance(a, HostMachine) and a.host_id == host_id)

    def host_statuses(self, key: str, cp: int = 0) -> dict[str, str]:
        with self.http(key, cp) as http:
            return {h["id"]: h["status"] for h in http.get("/v1/hosts").json()["data"]["data"]}

    def stop(self) -> None:
        problems: list[str] = []
        try:
            super().stop()  # destroys the agents' sandboxes, stops them, checks their leftovers
        except Exception as leftover:  # still take the machines down, or their namespaces leak
            problems.append(repr(leftover))
            for agent in self.agents:
                agent.stop()
            for controlplane in self.controlplanes:
                controlplane.stop()
        for extra in self.controlplanes[1:]:
            extra.stop()
        for agent in self.agents:
            if isinstance(agent, HostMachine):
                # Tables outlive an agent by design (a restarted agent adopts them): the operator's
                # uninstall removes them, as teardown_agent does on a single machine.
                for table in (agent.nft_table, f"{agent.nft_table}_egress"):
                    sh("ip", "netns", "exec", agent.netns, "nft", "delete", "table", "ip", table, check=False)
                problems += [f"nft table {t} in {agent.netns}" for t in agent.tables_in_netns()]
                sh("rm", "-rf", str(agent.runtime_root), check=False)
        self.fabric.down(self.machines)
        deadline = time.monotonic() + 10  # a deleted namespace's veths go a moment later
        while self.fabric.leftovers(self.machines) and time.monotonic() < deadline:
            time.sleep(0.1)
        problems += self.fabric.leftovers(self.machines)
        if self.pg_name:
            asyncio.run(_pg_execute(self.pg_admin, f"DROP DATABASE IF EXISTS {self.pg_name} WITH (FORCE)"))
        assert not problems, f"the cluster left these behind: {problems}"
        for controlplane in self.controlplanes:  # their logs stay only when something was left behind
            sh("rm", "-rf", str(controlplane.state_dir), check=False)


def start_cluster(
    guest_dir: Path,
    hosts: list[dict[str, Any]],
    *,
    controlplanes: int = 2,
    cp_env: dict[str, str] | None = None,
) -> Cluster:
    """``hosts``: one dict per machine (``total_mib``, ``labels``, other ``HostMachine`` fields)."""
    tag = secrets.token_hex(2)
    fabric = Fabric(tag, int(tag, 16) % 250)
    admin, name = _create_database()
    pg_url = admin.rsplit("/", 1)[0] + "/" + name
    cluster = Cluster(
        controlplane=ClusterControlPlane(state_dir=Path("/tmp/unused")),
        agents=[],
        fabric=fabric,
        pg_admin=admin,
        pg_name=name,
    )
    try:
        fabric.up()
        for index in range(controlplanes):
            cp = ClusterControlPlane(
                state_dir=Path(f"/tmp/pdkmhcp-{tag}{index}"),
                extra_env=dict(cp_env or {}),
                bind=fabric.gateway,
                pg_url=pg_url,
            )
            cp.start()
            cluster.controlplanes.append(cp)
        cluster.controlplane = cluster.controlplanes[0]
        urls = ",".join(cp.url for cp in cluster.controlplanes)
        for index, options in enumerate(hosts, start=1):
            fabric.add_machine(index)
            cluster.machines.append(index)
            machine = HostMachine(
                state_dir=Path(f"/tmp/pdkmh-{tag}{index}"),
                guest_dir=guest_dir,
                subnet=fabric.subnet(index),
                netns=fabric.netns(index),
                address=fabric.address(index),
                runtime_root=Path(f"/run/pdkmh-{tag}{index}"),
                **{"pool_size": 1, **options},
            )
            machine.controlplane_url = urls
            machine.start()
            cluster.agents.append(machine)
        cluster.wait_for_hosts()
    except BaseException:
        cluster.stop()
        raise
    return cluster
