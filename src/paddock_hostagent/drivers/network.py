"""Sandbox networking: one network namespace per sandbox, joined to the host by a routed veth pair.

    host                                     sandbox netns
    pdk<slot>  10.88.0.1/32  <--veth-->      eth0  10.88.0.N/32
    route 10.88.0.N/32 dev pdk<slot>         route 10.88.0.1 dev eth0; default via 10.88.0.1

Every host-side veth carries the gateway address (as the CNI ``ptp`` plugin does), so a sandbox reaches
the host at ``.1`` and the outside world through it. nftables (``table ip <nft_table>``, owned by
Paddock) masquerades sandbox traffic leaving the host and drops forwarding between sandboxes. Addresses
are allocated from the configured subnet and persisted, so a restarted agent keeps them.

Host-side links, addresses and routes go through pyroute2. The namespace itself and the configuration
inside it go through ``ip``: pyroute2 enters namespaces by forking helper processes, which is unsafe in
the agent's threaded event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from paddock_hostagent.drivers.base import CapacityError
from paddock_hostagent.drivers.commands import run_sync

NETNS_DIR = Path("/run/netns")
VETH_PREFIX = "pdk"


@dataclass(frozen=True)
class SandboxNetwork:
    slot: str
    ip: str
    gateway: str

    @property
    def netns(self) -> str:
        return f"{VETH_PREFIX}-{self.slot}"

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def host_veth(self) -> str:
        return f"{VETH_PREFIX}{self.slot}"


class AddressAllocator:
    """IPv4 addresses from the subnet, persisted in ``addresses.json`` (address -> owner)."""

    def __init__(self, subnet: str, state_dir: Path) -> None:
        self.network = ipaddress.IPv4Network(subnet)
        self.gateway = str(self.network.network_address + 1)
        self.path = state_dir / "addresses.json"
        state_dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, str]]:
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                table: dict[str, str] = json.loads(self.path.read_text())
            except (FileNotFoundError, ValueError):
                table = {}
            yield table
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            tmp.replace(self.path)

    def allocate(self, owner: str) -> str:
        with self._locked() as table:
            for host in self.network.hosts():
                address = str(host)
                if address != self.gateway and address not in table:
                    table[address] = owner
                    return address
        raise CapacityError(f"no free address left in {self.network}")

    def release(self, address: str) -> None:
        with self._locked() as table:
            table.pop(address, None)

    def release_owner(self, owner: str) -> None:
        with self._locked() as table:
            for address in [a for a, o in table.items() if o == owner]:
                del table[address]

    def retain_owners(self, owners: set[str]) -> list[str]:
        """Frees every address whose owner is not in ``owners``; returns the freed addresses."""
        with self._locked() as table:
            freed = [address for address, owner in table.items() if owner not in owners]
            for address in freed:
                del table[address]
        return freed

    def owners(self) -> dict[str, str]:
        with self._locked() as table:
            return dict(table)


class NetworkManager:
    def __init__(
        self, subnet: str, state_dir: Path, nft_table: str, dns_servers: list[str], gso_max_segs: int = 1
    ) -> None:
        self.addresses = AddressAllocator(subnet, state_dir)
        self.gso_max_segs = gso_max_segs
        self.subnet = subnet
        self.nft_table = nft_table
        self.dns_servers = dns_servers

    @property
    def gateway(self) -> str:
        return self.addresses.gateway

    def setup_host(self) -> None:
        """Enables forwarding and (re)writes Paddock's nftables table; idempotent."""
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        table = f"table ip {self.nft_table}"
        ruleset = f"""
add {table}
flush {table}
{table} {{
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr {self.subnet} oifname != "{VETH_PREFIX}*" masquerade
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{VETH_PREFIX}*" oifname "{VETH_PREFIX}*" drop
    }}
}}
"""
        run_sync(["nft", "-f", "-"], input_text=ruleset)

    def teardown_host(self) -> None:
        run_sync(["nft", "delete", "table", "ip", self.nft_table], check=False)
        run_sync(["nft", "delete", "table", "ip", f"{self.nft_table}_egress"], check=False)  # egress.py

    def create(self, slot: str) -> SandboxNetwork:
        """Allocates an address and builds the namespace and veth pair (blocking: run in a thread)."""
        net = SandboxNetwork(slot=slot, ip=self.addresses.allocate(slot), gateway=self.gateway)
        try:
            self._build(net)
        except BaseException:
            self.destroy(net)
            raise
        return net

    def _build(self, net: SandboxNetwork) -> None:
        from pyroute2 import IPRoute

        run_sync(["ip", "netns", "add", net.netns])
        with IPRoute() as ipr:
            ipr.link(
                "add", ifname=net.host_veth, kind="veth", peer={"ifname": "eth0", "net_ns_fd": net.netns}
            )
            index = ipr.link_lookup(ifname=net.host_veth)[0]
            ipr.addr("add", index=index, address=net.gateway, prefixlen=32)
            ipr.link("set", index=index, state="up")
            ipr.route("add", dst=f"{net.ip}/32", oif=index, scope="link")
        inside = "\n".join(
            [
                "link set lo up",
                f"addr add {net.ip}/32 dev eth0",
                # 1: one MTU-sized segment per packet the sandbox sends, so the egress quota
                # (drivers/egress.py) stops within one wire packet of the budget, not one 64 KiB GSO
                # burst; larger values trade that precision for throughput (settings.py).
                f"link set dev eth0 gso_max_segs {self.gso_max_segs}",
                "link set eth0 up",
                f"route add {net.gateway}/32 dev eth0 scope link",
                f"route add default via {net.gateway} dev eth0",
            ]
        )
        run_sync(["ip", "-n", net.netns, "-batch", "-"], input_text=inside + "\n")

    def destroy(self, net: SandboxNetwork) -> None:
        """Removes the veth pair and namespace and frees the address; tolerates missing pieces."""
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            indexes = ipr.link_lookup(ifname=net.host_veth)
            if indexes:
                with contextlib.suppress(Exception):
                    ipr.link("del", index=indexes[0])
        if net.netns_path.exists():
            run_sync(["ip", "netns", "delete", net.netns], check=False)
        self.addresses.release_owner(net.slot)

    def exists(self, net: SandboxNetwork) -> bool:
        return net.netns_path.exists() and Path(f"/sys/class/net/{net.host_veth}").exists()

    def resolv_conf(self) -> str:
        """Sandboxes resolve through the host agent's resolver on the gateway (drivers/dns.py)."""
        return f"nameserver {self.gateway}\noptions timeout:2 attempts:2\n"

    def upstream_servers(self) -> list[str]:
        """Where that resolver forwards to when not configured: the configured or the host's servers
        (loopback ones included: the resolver runs in the host's namespace)."""
        return self.dns_servers or host_nameservers(include_loopback=True) or ["1.1.1.1"]


def host_nameservers(path: Path = Path("/etc/resolv.conf"), *, include_loopback: bool = False) -> list[str]:
    """The host's resolvers, minus loopback ones (unreachable from a sandbox's namespace) unless asked."""
    servers: list[str] = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    if include_loopback or not ipaddress.ip_address(parts[1]).is_loopback:
                        servers.append(parts[1])
    return servers


def interface_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")
