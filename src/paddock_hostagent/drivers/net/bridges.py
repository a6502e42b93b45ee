"""Private networks on this host: one Linux bridge per network, one extra veth per member sandbox.

    sandbox A netns              host                                  sandbox B netns
    eth1 10.96.0.2/24 <--veth--> pv<hash A>  ─┐
                                              ├─ pb<tag><net hash>  (bridge, no IP)
    eth1 10.96.0.3/24 <--veth--> pv<hash B>  ─┘                       <-- eth1 10.96.0.3/24

The control plane allocates every member's address from the network's block and stores it, so the
agent only programs what it is told and can re-program it after a restart. Members reach each other
at layer 2 through the bridge; nothing else can:

- the bridge and its ports carry no IP address (IPv6 disabled, ARP never answered by the host), so
  the host neither routes to nor answers on them;
- ``chain pnet_forward`` in Paddock's nftables table drops routed traffic between the bridges and any
  other interface, and traffic from the sandboxes' default veths (``pdk*``) to the private pool, so a
  non-member's packets to a member's address die on the host instead of leaving by the default route;
- ``chain pnet_input`` drops anything the host would receive from a bridge;
- the member's interface has no IPv6 (inherited from the namespace's default, set again here for
  namespaces made by older agents), and sandboxes cannot craft frames (no CAP_NET_RAW).

Names are ≤ 15 characters: ``pb`` + 4 hex of the agent's tag + 8 hex of the network id's hash for the
bridge (so two agents on one machine never share a bridge), ``pv`` + 12 hex of the hash of
(sandbox id, network id) for the host end of a member's veth.

Across hosts, each bridge whose network has members on other hosts gets one more port: a VXLAN
device ``px`` + tag + 8 hex of the network id's hash, VNI = 24 bits of that hash, UDP 4789 from this
host's address, and one all-zeros FDB entry per peer host (head-end replication of broadcast and
unknown frames; unicast MACs are learned). The peers come from the control plane in its answer to
every heartbeat (``sync_overlay``), so a member joining on another host is reachable within a beat.
Members' interfaces have MTU 1450, which leaves room for the 50 bytes of VXLAN encapsulation on a
1500-byte underlay. Two networks whose VNIs collide cannot both have a port on one host (the kernel
refuses the second device), so a collision fails closed, never joins two networks. The addressing
does not change across hosts because it never depended on the host.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.net.linkdump import links_of_kind
from paddock_hostagent.drivers.net.network import NETNS_DIR, VETH_PREFIX, VXLAN_PORT, netns_sysctl
from paddock_hostagent.drivers.system.commands import run_sync

BRIDGE_PREFIX = "pb"
PORT_PREFIX = "pv"
OVERLAY_PREFIX = "px"
MEMBER_MTU = 1450
ZERO_MAC = "00:00:00:00:00:00"
FIRST_IFNAME_INDEX = 1  # eth0 is the default network


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


@dataclass(frozen=True)
class Membership:
    """One sandbox on one network, as the agent records it (``SandboxRecord.networks``)."""

    network_id: str
    ip: str
    prefixlen: int
    ifname: str  # inside the sandbox: eth1, eth2, …
    bridge: str
    port: str  # host end of the veth

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Membership:
        return cls(
            network_id=str(data["network_id"]),
            ip=str(data["ip"]),
            prefixlen=int(data["prefixlen"]),
            ifname=str(data["ifname"]),
            bridge=str(data["bridge"]),
            port=str(data["port"]),
        )


def _sysctl(path: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).write_text(value + "\n")


def _link_index(ipr: Any, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return int(found[0]) if found else None


def _link_exists(name: str) -> bool:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return _link_index(ipr, name) is not None


def _flood_list(overlay: str) -> set[str]:
    """The peers a VXLAN port floods to: its all-zeros FDB entries' destinations."""
    out = run_sync(["bridge", "-j", "fdb", "show", "dev", overlay], check=False)
    entries = json.loads(out or "[]")
    return {str(e["dst"]) for e in entries if e.get("mac") == ZERO_MAC and e.get("dst")}


def _ports(ipr: Any, bridge_index: int) -> list[int]:
    """The bridge's ports, asked of netlink: ``/sys/class/net`` shows the namespace sysfs was mounted
    in, not necessarily this agent's (agents in their own namespaces, tests/multihost)."""
    return [int(index) for index in ipr.link_lookup(master=bridge_index)]


class BridgeNetworks:
    """Bridges and member ports of this agent; every method blocks (call it from a thread)."""

    def __init__(self, tag: str, nft_table: str, pool: str) -> None:
        self.tag = tag[:4]
        self.nft_table = nft_table
        self.pool = str(ipaddress.IPv4Network(pool))
        self._lock = threading.Lock()

    @property
    def bridge_prefix(self) -> str:
        return f"{BRIDGE_PREFIX}{self.tag}"

    def bridge_name(self, network_id: str) -> str:
        return f"{self.bridge_prefix}{_digest(network_id, 8)}"

    def overlay_name(self, network_id: str) -> str:
        return f"{OVERLAY_PREFIX}{self.tag}{_digest(network_id, 8)}"

    @staticmethod
    def vni(network_id: str) -> int:
        return int(_digest(network_id, 6), 16) or 1

    @staticmethod
    def port_name(sandbox_id: str, network_id: str) -> str:
        return f"{PORT_PREFIX}{_digest(f'{sandbox_id}/{network_id}', 12)}"

    # -- host set-up ------------------------------------------------------------------------------

    def setup_host(self) -> None:
        """Adds the isolation chains to Paddock's table (created by ``NetworkManager.setup_host``)."""
        table = f"ip {self.nft_table}"
        bridges = f'"{self.bridge_prefix}*"'
        ruleset = f"""
add chain {table} pnet_forward {{ type filter hook forward priority filter - 10; policy accept; }}
add chain {table} pnet_input {{ type filter hook input priority filter - 10; policy accept; }}
flush chain {table} pnet_forward
flush chain {table} pnet_input
add rule {table} pnet_forward iifname "{VETH_PREFIX}*" ip daddr {self.pool} drop
add rule {table} pnet_forward oifname "{VETH_PREFIX}*" ip saddr {self.pool} drop
add rule {table} pnet_forward iifname {bridges} oifname != {bridges} drop
add rule {table} pnet_forward oifname {bridges} iifname != {bridges} drop
add rule {table} pnet_input iifname {bridges} drop
"""
        run_sync(["nft", "-f", "-"], input_text=ruleset)

    # -- membership -------------------------------------------------------------------------------

    def attach(
        self, netns: str, sandbox_id: str, network_id: str, ip: str, prefixlen: int, taken: set[str]
    ) -> Membership:
        """Puts the sandbox on the network's bridge as the first free ``ethN`` not in ``taken``."""
        address = ipaddress.IPv4Interface(f"{ip}/{prefixlen}")
        index = FIRST_IFNAME_INDEX
        while f"eth{index}" in taken:
            index += 1
        member = Membership(
            network_id=network_id,
            ip=str(address.ip),
            prefixlen=address.network.prefixlen,
            ifname=f"eth{index}",
            bridge=self.bridge_name(network_id),
            port=self.port_name(sandbox_id, network_id),
        )
        with self._lock:
            try:
                self._plug(netns, member)
            except Exception as exc:
                self._unplug(member)
                raise DriverError(f"joining network {network_id} failed: {exc}") from exc
        return member

    def ensure(self, netns: str, member: Membership) -> bool:
        """Re-creates a recorded membership whose port has gone (idempotent); True if it had to."""
        with self._lock:
            if self._port_on_bridge(member):
                return False
            try:
                self._plug(netns, member)
            except Exception as exc:
                self._unplug(member)
                raise DriverError(f"restoring network {member.network_id} failed: {exc}") from exc
            return True

    def detach(self, member: Membership) -> None:
        """Removes the member's veth (both ends) and the bridge once it has no port left."""
        with self._lock:
            self._unplug(member)

    def _plug(self, netns: str, member: Membership) -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            bridge = _link_index(ipr, member.bridge)
            if bridge is None:
                ipr.link("add", ifname=member.bridge, kind="bridge")
                bridge = _link_index(ipr, member.bridge)
                assert bridge is not None
            _sysctl(f"/proc/sys/net/ipv6/conf/{member.bridge}/disable_ipv6", "1")
            _sysctl(f"/proc/sys/net/ipv4/conf/{member.bridge}/arp_ignore", "8")
            ipr.link("set", index=bridge, state="up")
            stale = _link_index(ipr, member.port)
            if stale is not None:
                ipr.link("del", index=stale)
            ipr.link(
                "add", ifname=member.port, kind="veth", peer={"ifname": member.ifname, "net_ns_fd": netns}
            )
            port = _link_index(ipr, member.port)
            assert port is not None
            _sysctl(f"/proc/sys/net/ipv6/conf/{member.port}/disable_ipv6", "1")
            ipr.link("set", index=port, master=bridge)
            ipr.link("set", index=port, state="up")
        # Before the sandbox's end is up, so it never gets a link-local address.
        netns_sysctl(NETNS_DIR / netns, {f"ipv6/conf/{member.ifname}/disable_ipv6": "1"})
        inside = "\n".join(
            [
                f"addr flush dev {member.ifname}",
                f"addr add {member.ip}/{member.prefixlen} dev {member.ifname}",
                f"link set {member.ifname} mtu {MEMBER_MTU}",
                f"link set {member.ifname} up",
            ]
        )
        run_sync(["ip", "-n", netns, "-batch", "-"], input_text=inside + "\n")

    def _unplug(self, member: Membership) -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            port = _link_index(ipr, member.port)
            if port is not None:
                with contextlib.suppress(Exception):
                    ipr.link("del", index=port)
            self._drop_if_empty(ipr, member.bridge)

    @staticmethod
    def _port_on_bridge(member: Membership) -> bool:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            bridge = _link_index(ipr, member.bridge)
            port = _link_index(ipr, member.port)
            return bridge is not None and port is not None and port in _ports(ipr, bridge)

    def _drop_if_empty(self, ipr: Any, bridge: str) -> None:
        """Removes the bridge (and its overlay port) once no member's port is left on it."""
        index = _link_index(ipr, bridge)
        if index is None:
            return
        overlay = _link_index(ipr, OVERLAY_PREFIX + bridge[len(BRIDGE_PREFIX) :])
        if [port for port in _ports(ipr, index) if port != overlay]:
            return
        for link in (overlay, index):
            if link is not None:
                with contextlib.suppress(Exception):
                    ipr.link("del", index=link)

    # -- across hosts -----------------------------------------------------------------------------

    def sync_overlay(self, peers: dict[str, list[str]], local: str) -> None:
        """Makes each of this agent's bridges reach exactly ``peers[network id]`` (host addresses)
        through its VXLAN port: adds the port where a network gained a peer, rewrites the flood list,
        removes the port where no peer is left. Networks without a bridge here are ignored."""
        with self._lock:
            wanted = {self.bridge_name(nid): (nid, sorted(set(addrs))) for nid, addrs in peers.items()}
            for bridge in self.bridges():
                network_id, addresses = wanted.get(bridge, ("", []))
                overlay = OVERLAY_PREFIX + bridge[len(BRIDGE_PREFIX) :]
                if not addresses:
                    run_sync(["ip", "link", "del", overlay], check=False)
                    continue
                if not _link_exists(overlay):
                    # nolearning: remote MACs are never learned from what arrives (anyone can send a
                    # UDP packet); frames go to every peer of the network, which holds its members.
                    vni, port = str(self.vni(network_id)), str(VXLAN_PORT)
                    add = ["ip", "link", "add", overlay, "type", "vxlan", "id", vni, "local", local]
                    run_sync([*add, "dstport", port, "nolearning"])
                    _sysctl(f"/proc/sys/net/ipv6/conf/{overlay}/disable_ipv6", "1")
                    run_sync(["ip", "link", "set", overlay, "mtu", str(MEMBER_MTU), "master", bridge, "up"])
                current = _flood_list(overlay)
                for address in sorted(current - set(addresses)):
                    run_sync(["bridge", "fdb", "del", ZERO_MAC, "dev", overlay, "dst", address], check=False)
                for address in sorted(set(addresses) - current):
                    run_sync(["bridge", "fdb", "append", ZERO_MAC, "dev", overlay, "dst", address])

    # -- start-up ---------------------------------------------------------------------------------

    def bridges(self) -> list[str]:
        """This agent's bridges that exist now (in this process's network namespace)."""
        return [name for name in links_of_kind("bridge") if name.startswith(self.bridge_prefix)]

    def prune(self, keep: set[str]) -> list[str]:
        """Removes this agent's bridges that no recorded membership uses; returns their names."""
        from pyroute2 import IPRoute

        removed: list[str] = []
        with self._lock, IPRoute() as ipr:
            for bridge in self.bridges():
                if bridge in keep:
                    continue
                index = _link_index(ipr, bridge)
                for port in _ports(ipr, index) if index is not None else []:
                    with contextlib.suppress(Exception):
                        ipr.link("del", index=port)
                if index is not None:
                    with contextlib.suppress(Exception):
                        ipr.link("del", index=index)
                removed.append(bridge)
        return removed
