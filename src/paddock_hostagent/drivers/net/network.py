"""Sandbox networking: one network namespace per sandbox, joined to the host by a routed veth pair.

    host                                     sandbox netns
    pdk<slot>  10.88.0.1/32  <--veth-->      eth0  10.88.0.N/32
    route 10.88.0.N/32 dev pdk<slot>         route 10.88.0.1 dev eth0; default via 10.88.0.1

Every host-side veth carries the gateway address (as the CNI ``ptp`` plugin does), so a sandbox reaches
the outside world through the host. Addresses are allocated from the configured subnet and persisted,
so a restarted agent keeps them. nftables (``table ip <nft_table>``, owned by Paddock) masquerades
sandbox traffic leaving the host, drops forwarding between sandboxes, and keeps the host closed to its
sandboxes — whatever their egress rules::

    set veths      this agent's host veths            set sources   each veth . its sandbox's address
    sandbox_pre    (prerouting, raw) a packet from one of our veths that does not carry that veth's
                   sandbox's address, or from any ``pdk*`` veth posing as one of our addresses: drop
    sandbox_input  (input) from our veths the host answers DNS on the gateway and replies to flows
                   the host opened (ingress proxy); everything else is refused — every host address,
                   on any interface, 127.0.0.0/8 under route_localnet, 169.254.169.254 if local
    sandbox_forward (forward) link-local (cloud metadata) and flows something on the host DNATs
                   (published ports of the host's own services): refused, allowlist or not; new
                   connections to the operator's denied ranges (``egress_deny``; settings.py's
                   default is private address space) and to any VXLAN port: refused, allowlist or not

A veth and its address enter the sets before the link exists, so no sandbox ever sends unguarded.
IPv6 is off for sandboxes: ``default.disable_ipv6`` in the namespace before its interfaces exist
(``lo`` keeps ``::1``, which never leaves it), and on the host end of every veth, where the kernel then
drops any IPv6 frame a sandbox could still send. ``net.ipv4.ping_group_range`` lets ``ping`` use ICMP
datagram sockets, as sandboxes hold no CAP_NET_RAW (``ocispec.py``).

Host-side links, addresses and routes go through pyroute2. The namespace itself and the configuration
inside it go through ``ip``: pyroute2 enters namespaces by forking helper processes, which is unsafe in
the agent's threaded event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from paddock_hostagent.drivers.base import CapacityError, CommandFailedError, DriverError
from paddock_hostagent.drivers.net.nftlib import Nft
from paddock_hostagent.drivers.net.nftnetlink import AddElement, DeleteElement, Op, render
from paddock_hostagent.drivers.system.commands import run_sync
from paddock_hostagent.drivers.system.nsthread import CLONE_NEWNET, in_namespace

NETNS_DIR = Path("/run/netns")
VETH_PREFIX = "pdk"
LINK_LOCAL = "169.254.0.0/16"
#: Private networks' VXLAN between hosts (bridges.py). A sandbox's packets leave masqueraded as its
#: host, which other hosts accept VXLAN from: one sent to this port could inject frames into another
#: tenant's private network there, so no sandbox may send to it, wherever it points.
VXLAN_PORT = 4789

#: Written in every sandbox's namespace before its interfaces exist (relative to /proc/sys/net).
SANDBOX_SYSCTLS = {
    # Interfaces created from now on (eth0, and eth1… of private networks) get no IPv6 at all.
    "ipv6/conf/default/disable_ipv6": "1",
    # ping through ICMP datagram sockets for every group: no CAP_NET_RAW needed.
    "ipv4/ping_group_range": "0 2147483647",
}


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

    def allocate(self, owner: str, prefer: str | None = None) -> str:
        """A free address for ``owner``: ``prefer`` when it is one of the network's and free."""
        with self._locked() as table:
            if prefer and prefer != self.gateway and prefer not in table and prefer in self._hosts(prefer):
                table[prefer] = owner
                return prefer
            for host in self.network.hosts():
                address = str(host)
                if address != self.gateway and address not in table:
                    table[address] = owner
                    return address
        raise CapacityError(f"no free address left in {self.network}")

    def _hosts(self, address: str) -> tuple[str, ...]:
        with contextlib.suppress(ValueError):
            parsed = ipaddress.IPv4Address(address)
            if parsed in self.network and parsed not in (
                self.network.network_address,
                self.network.broadcast_address,
            ):
                return (address,)
        return ()

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


def netns_sysctl(netns_path: Path, values: dict[str, str]) -> None:
    """Writes ``/proc/sys/net/<key>`` inside a network namespace, in process (``drivers/system/nsthread.py``;
    about 0.7 ms, where ``ip netns exec sysctl`` costs a process)."""

    def write() -> None:
        for key, value in values.items():
            Path("/proc/sys/net", key).write_text(value + "\n")

    in_namespace(netns_path, CLONE_NEWNET, write, f"configuring {netns_path}")


def disable_host_ipv6(ifname: str) -> None:
    """No IPv6 on a host-side link: no address, and the kernel drops every IPv6 frame arriving on it."""
    Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1\n")


class NetworkManager:
    def __init__(
        self,
        subnet: str,
        state_dir: Path,
        nft_table: str,
        dns_servers: list[str],
        gso_max_segs: int = 1,
        egress_deny: tuple[str, ...] = (),
    ) -> None:
        self.addresses = AddressAllocator(subnet, state_dir)
        self.gso_max_segs = gso_max_segs
        self.egress_deny = egress_deny
        self.subnet = subnet
        self.nft_table = nft_table
        self._t = f"ip {nft_table}"  # how nft names the table, for the guard elements' batches
        self.dns_servers = dns_servers
        self.nft = Nft()

    @property
    def gateway(self) -> str:
        return self.addresses.gateway

    def setup_host(self) -> None:
        """Enables forwarding and (re)writes Paddock's nftables table; idempotent.

        The guard sets are rebuilt from the persisted addresses in the same atomic batch, so sandboxes
        that outlived an agent restart are never unguarded; their namespaces and host veths get the
        IPv6 and ping settings again (sandboxes made by an older agent had IPv6)."""
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        owners = self.addresses.owners()
        table = f"table ip {self.nft_table}"
        refuse = "meta l4proto tcp reject with tcp reset\n        reject with icmp type admin-prohibited"
        denied = f"elements = {{ {', '.join(self.egress_deny)} }}" if self.egress_deny else ""
        ruleset = f"""
add {table}
flush {table}
{table} {{
    set veths {{ type ifname; }}
    set sources {{ type ifname . ipv4_addr; }}
    set denied {{ type ipv4_addr; flags interval; {denied} }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr {self.subnet} oifname != "{VETH_PREFIX}*" masquerade
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{VETH_PREFIX}*" oifname "{VETH_PREFIX}*" drop
    }}
    chain sandbox_pre {{
        type filter hook prerouting priority raw; policy accept;
        iifname @veths iifname . ip saddr != @sources drop
        iifname "{VETH_PREFIX}*" ip saddr {self.subnet} iifname . ip saddr != @sources drop
    }}
    chain sandbox_input {{
        type filter hook input priority filter - 5; policy accept;
        iifname != @veths accept
        ct state established,related accept
        ip daddr {self.gateway} meta l4proto {{ tcp, udp }} th dport 53 accept
        {refuse}
    }}
    chain sandbox_forward {{
        type filter hook forward priority filter - 10; policy accept;
        iifname != @veths accept
        ip daddr {LINK_LOCAL} goto refuse
        ct status dnat goto refuse
        udp dport {VXLAN_PORT} goto refuse
        ct state new ip daddr @denied goto refuse
    }}
    chain refuse {{
        {refuse}
    }}
}}
flush set ip {self.nft_table} veths
flush set ip {self.nft_table} sources
"""
        elements = self._elements("add", [(slot, address) for address, slot in owners.items()])
        lines = "".join(render(self._t, op) + "\n" for op in elements)
        run_sync(["nft", "-f", "-"], input_text=ruleset + lines)
        for slot in sorted(set(owners.values())):
            net = SandboxNetwork(slot=slot, ip="", gateway=self.gateway)
            with contextlib.suppress(OSError, DriverError):  # a slot whose pieces are gone
                if interface_exists(net.host_veth):
                    disable_host_ipv6(net.host_veth)
                if net.netns_path.exists():
                    netns_sysctl(net.netns_path, {**SANDBOX_SYSCTLS, "ipv6/conf/eth0/disable_ipv6": "1"})

    def teardown_host(self) -> None:
        run_sync(["nft", "delete", "table", "ip", self.nft_table], check=False)
        run_sync(["nft", "delete", "table", "ip", f"{self.nft_table}_egress"], check=False)  # egress.py

    def _elements(self, verb: str, pairs: list[tuple[str, str]]) -> list[Op]:
        """Adds (``verb`` "add") or deletes the elements of (slot, address) pairs in the guard sets."""
        element = AddElement if verb == "add" else DeleteElement
        ops: list[Op] = [
            element("veths", f"{VETH_PREFIX}{slot}") for slot in dict.fromkeys(s for s, _ in pairs)
        ]
        ops += [element("sources", f"{VETH_PREFIX}{slot}", address=address) for slot, address in pairs]
        return ops

    def _guard(self, net: SandboxNetwork) -> None:
        """The veth and its address join the guard sets (before the link exists). Netlink messages
        (``Nft.apply_sync``): libnftables would read every named object in the namespace first, a quota
        per metered sandbox (``egress_rules.py``)."""
        self.nft.apply_sync(self._t, self._elements("add", [(net.slot, net.ip)]))

    def _unguard(self, net: SandboxNetwork) -> None:
        """Removes the slot's elements; ``add`` first makes each ``delete`` safe when one is absent."""
        owned = [a for a, owner in self.addresses.owners().items() if owner == net.slot]
        pairs = [(net.slot, address) for address in dict.fromkeys([*owned, *([net.ip] if net.ip else [])])]
        pairs = pairs or [(net.slot, "0.0.0.0")]
        with contextlib.suppress(CommandFailedError):  # the table is gone (host torn down)
            self.nft.apply_sync(self._t, self._elements("add", pairs) + self._elements("delete", pairs))

    def create(self, slot: str, prefer_ip: str | None = None) -> SandboxNetwork:
        """Allocates an address (``prefer_ip`` if free) and builds the namespace and veth pair (blocking:
        run in a thread)."""
        net = SandboxNetwork(slot=slot, ip=self.addresses.allocate(slot, prefer_ip), gateway=self.gateway)
        try:
            self._build(net)
        except BaseException:
            self.destroy(net)
            raise
        return net

    def _build(self, net: SandboxNetwork) -> None:
        from pyroute2 import IPRoute

        run_sync(["ip", "netns", "add", net.netns])
        netns_sysctl(net.netns_path, SANDBOX_SYSCTLS)  # before eth0 exists: it is born without IPv6
        self._guard(net)
        with IPRoute() as ipr:
            ipr.link(
                "add", ifname=net.host_veth, kind="veth", peer={"ifname": "eth0", "net_ns_fd": net.netns}
            )
            index = ipr.link_lookup(ifname=net.host_veth)[0]
            disable_host_ipv6(net.host_veth)  # before it is up: never gets a link-local address
            ipr.addr("add", index=index, address=net.gateway, prefixlen=32)
            ipr.link("set", index=index, state="up")
            ipr.route("add", dst=f"{net.ip}/32", oif=index, scope="link")
        inside = "\n".join(
            [
                "link set lo up",
                f"addr add {net.ip}/32 dev eth0",
                # 1: one MTU-sized segment per packet the sandbox sends, so the egress quota
                # (drivers/net/egress_rules.py) stops within one wire packet of the budget, not one 64 KiB GSO
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
        self._unguard(net)
        self.addresses.release_owner(net.slot)

    def pristine(self, net: SandboxNetwork) -> bool:
        """Whether a destroyed sandbox's network may serve another sandbox as it is (``pool.py``'s
        recycling): its namespace and veth exist, and inside it the namespace holds exactly what
        ``_build`` made and nothing a tenant left — the links ``lo`` and ``eth0`` and nothing else, both
        having carried not one packet (so no peer, flow, DNS answer or byte count of the previous
        tenant is left to see, here or in conntrack), no socket of any family (not even one in
        TIME_WAIT), and the two routes to the gateway. Blocking (a thread enters the namespace)."""
        if not self.exists(net):
            return False
        gateway = _route_hex(self.gateway)
        expected_routes = {("eth0", "00000000", gateway), ("eth0", gateway, "00000000")}

        def inspect() -> bool:
            net_dir = Path("/proc/thread-self/net")
            links: dict[str, list[str]] = {}
            for line in (net_dir / "dev").read_text().splitlines()[2:]:
                name, _, counters = line.partition(":")
                links[name.strip()] = counters.split()
            if set(links) != {"lo", "eth0"}:
                return False
            # /proc/net/dev: receive bytes, packets … (8 fields), then transmit bytes, packets …
            if any(fields[1] != "0" or fields[9] != "0" for fields in links.values()):
                return False
            if open_sockets(net_dir):
                return False
            routes = {tuple(line.split()[:3]) for line in (net_dir / "route").read_text().splitlines()[1:]}
            return routes == expected_routes

        try:
            return in_namespace(net.netns_path, CLONE_NEWNET, inspect, f"inspecting {net.netns}")
        except DriverError:
            return False

    def exists(self, net: SandboxNetwork) -> bool:
        return net.netns_path.exists() and interface_exists(net.host_veth)

    def resolv_conf(self) -> str:
        """Sandboxes resolve through the host agent's resolver on the gateway (drivers/net/dns.py)."""
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


#: ``/proc/net/sockstat`` and ``sockstat6``: the namespace's own count of each protocol's sockets.
#: The kernel keeps ``inuse`` (every hashed socket: listening, connected, orphaned, bound UDP or raw)
#: and TCP's ``tw`` (TIME_WAIT) per network namespace; ``orphan``, ``alloc`` and ``mem`` are the
#: host's, so they are not read.
SOCKSTAT_FILES = ("sockstat", "sockstat6")
#: Sockets that sockstat does not count, from their ``/proc/net`` tables (a header line, then one line
#: per socket): each is read in well under 0.1 ms in an empty namespace.
SOCKET_TABLES = ("icmp", "icmp6", "unix", "packet")


def open_sockets(net_dir: Path) -> list[str]:
    """What sockets the network namespace whose ``/proc/net`` is ``net_dir`` holds, as ``"TCP6 inuse
    1"`` or ``"unix"``; empty when it holds none of any family, not even one in TIME_WAIT.

    Counted rather than listed: reading ``/proc/net/tcp`` and ``tcp6`` walks the host's whole TCP hash
    tables whatever the namespace, 31 and 50 ms of kernel time in an empty namespace on a 24 GiB host,
    and that was most of what recycling a network cost (issue #36, sustained creates)."""
    found: list[str] = []
    for name in SOCKSTAT_FILES:
        with contextlib.suppress(FileNotFoundError):  # a host without IPv6 has no sockstat6
            for line in (net_dir / name).read_text().splitlines():
                protocol, _, counters = line.partition(":")
                fields = counters.split()
                pairs = dict(zip(fields[::2], fields[1::2], strict=False))
                if protocol == "sockets":
                    continue  # "used": every socket the namespace's kernel side made, tenants' or not
                for counter in ("inuse", "tw"):
                    if pairs.get(counter, "0") != "0":
                        found.append(f"{protocol} {counter} {pairs[counter]}")
    for table in SOCKET_TABLES:
        with contextlib.suppress(FileNotFoundError):
            if len((net_dir / table).read_text().splitlines()) > 1:
                found.append(table)
    return found


def _route_hex(address: str) -> str:
    """An IPv4 address as ``/proc/net/route`` writes it (the in-memory word, in hex)."""
    return f"{struct.unpack('=I', socket.inet_aton(address))[0]:08X}"


def interface_exists(name: str) -> bool:
    """Whether this process's network namespace has the interface. Asked of the kernel, not of
    ``/sys/class/net``, which shows the namespace sysfs was mounted in: an agent started in its own
    namespace (one of several "machines" on one box, tests/multihost) would see the wrong one."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True
