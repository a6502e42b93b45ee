"""Egress allowlists and bandwidth quotas in the kernel (nftables): shared chains, per-sandbox elements.

Everything lives in ``table ip <nft_table>_egress``, apart from the NAT table ``network.py`` owns, so
each can be rebuilt without touching the other. A sandbox is only elements, keyed on its host veth
``pdk<slot>``, of sets and maps every sandbox shares::

    forward (hook)   iifname vmap @out_chains ── goto allowlist     (a sandbox with rules)
                                               ├ goto denylist      (with deny rules: open but these)
                                               └ goto budget        (open: no rules)
                     iifname "pdk*" ip saddr <subnet> drop        (a veth without a policy: fail closed)
    allowlist        ct state established,related goto budget     (replies and flows already admitted)
                     iifname . ip daddr @allow_net / iifname . ip daddr . port @allow_netport
                                                                   -> budget   (ip, cidr rules)
                     iifname . ip daddr @answers / iifname . ip daddr . port @answer_ports
                                                                   -> budget   (answers of the
                                                                    sandbox's resolver, with their TTL)
                     goto refused
    denylist         ct state established,related goto budget
                     the allowlist's four matches -> budget       (an allowed entry wins over a denied
                                                                   one, as E2B's ``allowOut`` does)
                     iifname . ip daddr @deny_net / iifname . ip daddr . port @deny_netport
                                                                   -> refused
                     goto budget
    refused          ct state new: update @tried_refused          (the attempt, for the audit trail)
                     tcp: reject with tcp reset; else icmp admin-prohibited
    budget           quota name iifname map @budgets goto over_budget   (metered: quota used up)
                     ct state new: update @tried_allowed          (the attempt, for the audit trail)
                     iifname @egress_bytes accept                 (egress bytes, exact: the element's
                                                                   own counter)
    over_budget      as refused                                   (its own chain, so that a listing
                                                                   tells the two apart)
    post (hook)      oifname @ingress_bytes                       (ingress bytes, observed only)

libnftables reads the chains and the named objects (counters, quotas) of every table in the network
namespace before it runs any command, and the elements of every set before a listing: a chain pair and
three named objects per sandbox made each create, destroy and counter read cost more with every sandbox
on the host (an install took 0.6 ms beside one sandbox and 16 ms beside 1,000, and ``network.py``'s
guard elements 25 ms), as four sets per sandbox had before. Byte counts are therefore counters *of set
elements*, which are not read unless listed; the quota stays a named object, as only those can be given
per sandbox, and only a metered sandbox has one. The spoofing check is ``network.py``'s: its
``sandbox_pre`` drops whatever a veth sends from another address than its sandbox's before it is routed.

Which elements belong to a veth, and which chain its ``out_chains`` element points to (a map element
is replaced by deleting it, and only a present one can be deleted), are kept here and read back from
the table when the agent starts, so a new allowlist replaces exactly the old one. A table of the
earlier chain-per-sandbox layout is converted then, keeping each sandbox's policy, counts and budget.

Connection attempts (a TCP or UDP packet that opens a flow) are kept for the audit trail in two
dynamic sets filled from the packet path, ``tried_allowed`` and ``tried_refused``: one element per
veth, address, protocol and port, with a packet counter, expiring ``ATTEMPT_TIMEOUT_S`` after its
last packet and at most ``ATTEMPT_SET_SIZE`` of them (a full set records nothing more until elements
expire; the packets pass or are refused all the same). ``attempts()`` lists them; ``egress.py`` turns
new elements and rising counters into the attempts the control plane polls for.

Only forwarded traffic is egress: what a sandbox sends to the host itself (DNS, replies to the
ingress proxy) is neither filtered by the allowlist nor counted. What every sandbox may send to the
host at all — DNS and replies, nothing else, with or without rules — and the per-veth source check
are ``network.py``'s, in the table that exists from the moment a veth does. Every change is one
batch, which the kernel applies atomically: netlink messages when it is only elements keyed on a veth
and quotas (a create's, a destroy's, a quota change: ``nftnetlink.py``, which skips libnftables'
reading of the whole namespace, a named quota per metered sandbox included), else ``nft`` text.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import CommandFailedError
from paddock_hostagent.drivers.net.nftlib import Nft
from paddock_hostagent.drivers.net.nftnetlink import (
    AddElement,
    AddQuota,
    DeleteElement,
    DeleteQuota,
    Op,
    render,
)

log = get_logger(__name__)

#: Addresses admitted from a DNS answer stay at least this long (a TTL of 0 would be useless).
MIN_ANSWER_TTL_S = 30
MAX_ANSWER_TTL_S = 86400
#: One object of ``nft -j`` output (a counter, a quota …), fields as nft names them.
NftObject = dict[str, Any]


class EgressRuleError(ValueError):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"egress rule {rule!r}: {reason}")
        self.rule = rule


@dataclass(frozen=True)
class NameRule:
    name: str
    wildcard: bool
    port: int | None

    def matches(self, qname: str) -> bool:
        if self.wildcard:
            return qname.endswith("." + self.name)
        return qname == self.name


#: Addresses (any port) and addresses with a port, as a policy holds them.
Networks = tuple[ipaddress.IPv4Network, ...]
NetworkPorts = tuple[tuple[ipaddress.IPv4Network, int], ...]
#: What a rule starts with to deny what it names instead of allowing it (``!1.2.3.4``, ``!10.0.0.0/8:25``).
DENY = "!"


@dataclass(frozen=True)
class EgressPolicy:
    """A parsed list of rules. ``open`` means no rules: everything passes. ``denylist`` means the list
    has deny rules (``!ip``, ``!cidr``, either with a port): everything passes but what they name, and
    an allow rule that also names it wins (E2B's ``denyOut`` and ``allowOut``). Without deny rules the
    allow rules are an allowlist: what they name passes, nothing else."""

    networks: Networks = ()
    network_ports: NetworkPorts = ()
    names: tuple[NameRule, ...] = ()
    open: bool = True
    denied_networks: Networks = ()
    denied_network_ports: NetworkPorts = ()
    denylist: bool = False

    @classmethod
    def parse(cls, rules: list[str]) -> EgressPolicy:
        """Rules as the control plane normalises them: host, host:port, *.host, ip, ip:port, cidr,
        cidr:port, [v6]:port, and ``!`` before an address rule to deny it. IPv6 rules are accepted and
        match nothing (sandboxes have no IPv6)."""
        if not rules or rules == ["*"]:
            return cls()
        networks: list[ipaddress.IPv4Network] = []
        network_ports: dict[int, list[ipaddress.IPv4Network]] = {}
        denied: list[ipaddress.IPv4Network] = []
        denied_ports: dict[int, list[ipaddress.IPv4Network]] = {}
        names: list[NameRule] = []
        denylist = False
        for raw in rules:
            rule = raw.strip().lower()
            if rule == "*":
                raise EgressRuleError(raw, "'*' is allowed only as the sole entry")
            denies = rule.startswith(DENY)
            denylist = denylist or denies
            host, port = _split_port(raw, rule.removeprefix(DENY).strip())
            if host.startswith("[") or ":" in host:
                _parse_v6(raw, host)
                continue
            try:
                net = ipaddress.ip_network(host, strict=False)
            except ValueError:
                net = None
            if isinstance(net, ipaddress.IPv6Network):
                continue
            if net is not None:
                nets, by_port = (denied, denied_ports) if denies else (networks, network_ports)
                (by_port.setdefault(port, []) if port else nets).append(net)
                continue
            if denies:  # its address could be dialled without asking the resolver
                raise EgressRuleError(raw, "only addresses and CIDR blocks can be denied, not names")
            wildcard = host.startswith("*.")
            name = host[2:] if wildcard else host
            _check_hostname(raw, name)
            if wildcard and "." not in name.rstrip("."):  # as the control plane's validation: no "*.com"
                raise EgressRuleError(raw, "'*.' needs a domain with at least two labels")
            names.append(NameRule(name, wildcard, port))
        return cls(
            networks=_collapsed(networks),
            network_ports=_collapsed_by_port(network_ports),
            names=tuple(dict.fromkeys(names)),
            open=False,
            denied_networks=_collapsed(denied),
            denied_network_ports=_collapsed_by_port(denied_ports),
            denylist=denylist,
        )

    def name_ports(self, qname: str) -> tuple[bool, set[int]] | None:
        """For a queried name: (any port allowed, specific ports), or None when no rule allows it."""
        qname = qname.lower().rstrip(".")
        matched = [rule for rule in self.names if rule.matches(qname)]
        if not matched:
            return None
        return any(rule.port is None for rule in matched), {r.port for r in matched if r.port is not None}


def _collapsed(networks: list[ipaddress.IPv4Network]) -> Networks:
    return tuple(ipaddress.collapse_addresses(networks))


def _collapsed_by_port(by_port: dict[int, list[ipaddress.IPv4Network]]) -> NetworkPorts:
    return tuple((net, port) for port, nets in sorted(by_port.items()) for net in _collapsed(nets))


def _split_port(raw: str, rule: str) -> tuple[str, int | None]:
    if rule.startswith("["):
        addr, sep, port = rule[1:].partition("]:")
        if not sep:
            raise EgressRuleError(raw, "IPv6 with a port is written [addr]:port")
        return "[" + addr, _port(raw, port)
    if rule.count(":") == 1:
        host, _, port = rule.partition(":")
        return host, _port(raw, port)
    return rule, None


def _port(raw: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise EgressRuleError(raw, f"port {text!r} must be 1-65535")
    return int(text)


def _parse_v6(raw: str, host: str) -> None:
    try:
        ipaddress.ip_network(host.lstrip("["), strict=False)
    except ValueError:
        raise EgressRuleError(raw, "not a valid address") from None


def _check_hostname(raw: str, name: str) -> None:
    labels = name.rstrip(".").split(".")
    ok = 0 < len(name) <= 253 and all(
        0 < len(label) <= 63
        and label[0] != "-"
        and label[-1] != "-"
        and all(c.isalnum() or c == "-" for c in label)
        and label.isascii()
        for label in labels
    )
    if not ok:
        raise EgressRuleError(raw, "not a valid host name")


@dataclass(frozen=True)
class Admission:
    """An address a DNS answer admitted: any port (``port`` None) or one port, for ``ttl_s``."""

    address: str
    port: int | None
    ttl_s: int


@dataclass
class Usage:
    egress_bytes: int = 0
    ingress_bytes: int = 0
    capped: bool = False


@dataclass
class Snapshot:
    """Counters of every installed sandbox, by host veth."""

    usage: dict[str, Usage] = field(default_factory=dict)


#: The shared address sets: name → nft type and flags. Interval sets hold the allowlist's addresses
#: and networks; timeout sets the addresses DNS answers admitted, each for its TTL.
ADDRESS_SETS = {
    "allow_net": "type ifname . ipv4_addr; flags interval;",
    "allow_netport": "type ifname . ipv4_addr . inet_service; flags interval;",
    "answers": "type ifname . ipv4_addr; flags timeout;",
    "answer_ports": "type ifname . ipv4_addr . inet_service; flags timeout;",
    "deny_net": "type ifname . ipv4_addr; flags interval;",
    "deny_netport": "type ifname . ipv4_addr . inet_service; flags interval;",
}
#: Sets whose elements expire by themselves: an element may be gone before it is deleted.
EXPIRING = ("answers", "answer_ports")
#: The three chains a veth's forwarded packets go to (its element of ``out_chains``).
ALLOWLIST, DENYLIST, BUDGET = "allowlist", "denylist", "budget"
#: Where what a list of rules does not let out is refused (and recorded as a refused attempt).
REFUSED = "refused"
#: Where a metered sandbox's packets go once its quota is used up. They are refused, not dropped: a
#: dropped segment stays in the sender's buffer and is retransmitted, so the data a killed program
#: left behind would leave the moment a recharge opened the budget and spend it before anything the
#: user runs next (a 16 MiB gVisor send buffer spent a 500 kB recharge in under 0.5 s). A reset ends
#: the connection and frees its buffer, and the program learns at once instead of timing out.
OVER_BUDGET = "over_budget"
#: Per-veth byte counters: elements of these sets, each with its own counter.
EGRESS_BYTES, INGRESS_BYTES = "egress_bytes", "ingress_bytes"
#: Connection attempts seen in the packet path, by verdict (``attempts()``).
TRIED_ALLOWED, TRIED_REFUSED = "tried_allowed", "tried_refused"
ATTEMPT_SETS = {TRIED_ALLOWED: "allowed", TRIED_REFUSED: "refused"}
#: Elements a set of attempts holds at most (shared by the host's sandboxes), and how long one stays
#: after its last packet: long enough for the control plane's polls (every few seconds) to see it.
ATTEMPT_SET_SIZE = 65536
ATTEMPT_TIMEOUT_S = 120


@dataclass(frozen=True)
class Attempt:
    """One element of a set of attempts: packets that opened flows from ``veth`` to an address and
    port, ``verdict`` allowed or refused; ``idle_s`` since the last of them."""

    verdict: str
    veth: str
    address: str
    protocol: str
    port: int
    packets: int
    idle_s: int


class EgressFirewall:
    """The nftables side: installs, updates and removes per-sandbox policy and reads its counters.

    Once ``installed()`` has read the table back, this object is its only writer: it knows which
    chain each veth's ``out_chains`` element points to (a map element can only be replaced by
    deleting it first, and deleting needs it present)."""

    def __init__(self, nft_table: str, subnet: str, gateway: str) -> None:
        self.table = f"{nft_table}_egress"
        self.subnet = subnet
        self.gateway = gateway
        self._t = f"ip {self.table}"
        self.nft = Nft()
        # veth → shared set → the element keys (nft text, without the veth) it holds there.
        self._held: dict[str, dict[str, set[str]]] = {}
        # veth → the chain its element of ``out_chains`` points to (ALLOWLIST or BUDGET).
        self._routed: dict[str, str] = {}

    # -- host-wide --------------------------------------------------------------------------------

    def setup_host(self) -> None:
        """Creates the table, its chains, sets and maps, keeping installed sandboxes (idempotent).

        A table of the chain-per-sandbox layout (agents before this one) is left as it is, its
        sandboxes still guarded by their chains: ``installed()`` converts it when the agent starts."""
        try:
            self.nft.run_sync(f"list chain {self._t} {BUDGET}")
        except CommandFailedError:  # no table yet, or one of the earlier layout
            with contextlib.suppress(CommandFailedError):
                self.nft.run_sync(f"list chain {self._t} forward")
                return
        self.nft.run_sync(self._layout())

    def _layout(self) -> str:
        """The batch creating the table's shared chains, sets and maps (or refreshing their rules)."""
        t = self._t
        sets = "\n".join(f"add set {t} {name} {{ {kind} }}" for name, kind in ADDRESS_SETS.items())
        ports = "meta l4proto { tcp, udp }"
        attempt_sets = "\n".join(
            f"add set {t} {name} {{ type ifname . ipv4_addr . inet_proto . inet_service; "
            f"flags dynamic,timeout; size {ATTEMPT_SET_SIZE}; timeout {ATTEMPT_TIMEOUT_S}s; counter; }}"
            for name in ATTEMPT_SETS
        )
        attempt = "iifname . ip daddr . meta l4proto . th dport"
        chains = (ALLOWLIST, DENYLIST, BUDGET, REFUSED, OVER_BUDGET)
        # What an allowlist lets out, and what a denylist lets out whatever it denies.
        admitted = "\n".join(
            f"add rule {t} {chain} {rule} goto {BUDGET}"
            for chain in (ALLOWLIST, DENYLIST)
            for rule in (
                "ct state established,related",
                "iifname . ip daddr @allow_net",
                f"{ports} iifname . ip daddr . th dport @allow_netport",
                "iifname . ip daddr @answers",
                f"{ports} iifname . ip daddr . th dport @answer_ports",
            )
        )
        refusals = "\n".join(
            f"add rule {t} {chain} {rule}"
            for chain in (REFUSED, OVER_BUDGET)
            for rule in (
                f"ct state new {ports} update @{TRIED_REFUSED} {{ {attempt} }}",
                "meta l4proto tcp reject with tcp reset",
                "reject with icmp type admin-prohibited",
            )
        )
        return f"""
add table {t}
add map {t} out_chains {{ type ifname : verdict; }}
add set {t} {EGRESS_BYTES} {{ type ifname; counter; }}
add set {t} {INGRESS_BYTES} {{ type ifname; counter; }}
add map {t} budgets {{ type ifname : quota; }}
{sets}
{attempt_sets}
add chain {t} forward {{ type filter hook forward priority filter - 5; policy accept; }}
add chain {t} post {{ type filter hook postrouting priority filter; policy accept; }}
{chr(10).join(f"add chain {t} {chain}" for chain in chains)}
flush chain {t} forward
flush chain {t} post
{chr(10).join(f"flush chain {t} {chain}" for chain in chains)}
add rule {t} forward iifname vmap @out_chains
add rule {t} forward iifname "pdk*" ip saddr {self.subnet} drop
{admitted}
add rule {t} {ALLOWLIST} goto {REFUSED}
add rule {t} {DENYLIST} iifname . ip daddr @deny_net goto {REFUSED}
add rule {t} {DENYLIST} {ports} iifname . ip daddr . th dport @deny_netport goto {REFUSED}
add rule {t} {DENYLIST} goto {BUDGET}
{refusals}
add rule {t} {BUDGET} quota name iifname map @budgets goto {OVER_BUDGET}
add rule {t} {BUDGET} ct state new {ports} update @{TRIED_ALLOWED} {{ {attempt} }}
add rule {t} {BUDGET} iifname @{EGRESS_BYTES} accept
add rule {t} post oifname @{INGRESS_BYTES}
"""

    async def _convert(self) -> None:
        """Replaces a table of the chain-per-sandbox layout, in one atomic batch, by this layout with
        the same sandboxes in it: each veth's policy (open or allowlist), byte counts, budget and
        spending, allowlist elements and admitted answers (with the time they had left)."""
        try:
            listing = await self.nft.run(f"list table {self._t}", json_output=True)
        except CommandFailedError:
            return  # no table at all: nothing is installed
        items = _objects_of(listing)
        counters = {c.get("name"): c for c in (item["counter"] for item in items if "counter" in item)}
        quotas = {q.get("name"): q for q in (item["quota"] for item in items if "quota" in item)}
        rules: dict[str, str] = {}  # chain → its rules' expressions, as JSON text
        for rule in (item["rule"] for item in items if "rule" in item):
            rules[rule.get("chain", "")] = rules.get(rule.get("chain", ""), "") + json.dumps(rule.get("expr"))
        routed = {
            element[0]
            for item in items
            if item.get("map", {}).get("name") == "out_chains"
            for element in item["map"].get("elem", [])
            if isinstance(element, list) and isinstance(element[0], str)
        }
        t = self._t
        lines = [f"delete table {t}", self._layout()]
        for veth in sorted(routed):
            v, chain = _q(veth), ALLOWLIST if '"reject"' in rules.get(f"sb_{veth}", "") else BUDGET
            for name, prefix in ((EGRESS_BYTES, "co"), (INGRESS_BYTES, "ci")):
                counted = counters.get(f"{prefix}_{veth}", {})
                packets, count = int(counted.get("packets", 0)), int(counted.get("bytes", 0))
                lines.append(f"add element {t} {name} {{ {v} counter packets {packets} bytes {count} }}")
            quota = quotas.get(f"q_{veth}")
            if quota is not None and '"quota"' in rules.get(f"m_{veth}", ""):
                budget = self._budget(veth, int(quota.get("bytes", 1)), int(quota.get("used", 0)))
                lines += [render(t, op) for op in budget]
            lines.append(f"add element {t} out_chains {{ {v} : goto {chain} }}")
        for item in items:
            held = item.get("set", {}).get("name")
            for element in item["set"].get("elem", []) if held in ADDRESS_SETS else []:
                parsed, left = _element_key(element), _expires(element)
                if parsed is not None and parsed[0] in routed and (held not in EXPIRING or left):
                    timeout = f" timeout {left}s" if held in EXPIRING else ""
                    lines.append(f"add element {t} {held} {{ {_q(parsed[0])} . {parsed[1]}{timeout} }}")
        await self._nft(lines)
        log.info("egress_table_converted", table=self.table, sandboxes=len(routed))

    def teardown_host(self) -> None:
        with contextlib.suppress(CommandFailedError):  # already gone
            self.nft.run_sync(f"delete table {self._t}")
        self._held.clear()
        self._routed.clear()

    # -- per sandbox ----------------------------------------------------------------------------

    def _unbudget(self, veth: str) -> list[Op]:
        """Deletes the veth's quota; adding it first makes the deletes safe if it is absent."""
        name = f"q_{veth}"
        return [
            AddQuota(name, 1),
            AddElement("budgets", veth, object=name),
            DeleteElement("budgets", veth),
            DeleteQuota(name),
        ]

    def _budget(self, veth: str, quota_bytes: int, used_bytes: int) -> list[Op]:
        """Gives the veth (which has none) its quota: ``used_bytes`` of ``quota_bytes`` spent, or none
        at all when ``quota_bytes`` is -1 (unmetered)."""
        if quota_bytes < 0:
            return []
        name = f"q_{veth}"
        return [
            AddQuota(name, max(quota_bytes, 1), max(used_bytes, 0)),
            AddElement("budgets", veth, object=name),
        ]

    def _unroute(self, veth: str) -> list[Op]:
        """Deletes the veth's element of ``out_chains``, if it has one."""
        return [DeleteElement("out_chains", veth)] if veth in self._routed else []

    def _forget(self, veth: str, sets: tuple[str, ...] = tuple(ADDRESS_SETS)) -> list[str]:
        """Lines deleting what ``veth`` holds in ``sets``. An expiring element is added again first (with
        a short timeout), so its delete is safe whether or not it has expired meanwhile."""
        t, held = self._t, self._held.get(veth, {})
        lines: list[str] = []
        for name in sets:
            for key in sorted(held.get(name, ())):
                element = f"{_q(veth)} . {key}"
                if name in EXPIRING:
                    lines.append(f"add element {t} {name} {{ {element} timeout 1s }}")
                lines.append(f"delete element {t} {name} {{ {element} }}")
        return lines

    async def install(
        self, veth: str, ip: str, policy: EgressPolicy, *, quota_bytes: int, used_bytes: int = 0
    ) -> None:
        """Installs or replaces the sandbox's allowlist and budget in one atomic batch; its byte
        counters keep counting (they start at zero for a veth that had none).

        Addresses admitted by earlier DNS answers are forgotten (the rules they came from may be
        gone); flows already established keep going. ``ip`` is not needed here: ``network.py``'s
        ``sandbox_pre`` drops whatever a veth sends from another address before it is routed."""
        del ip
        t, v = self._t, _q(veth)
        lines: list[Op | str] = [*self._forget(veth), *self._unroute(veth)]
        held = {
            "allow_net": _keys(policy.networks),
            "allow_netport": _port_keys(policy.network_ports),
            "deny_net": _keys(policy.denied_networks),
            "deny_netport": _port_keys(policy.denied_network_ports),
        }
        for name, keys in held.items():
            if keys:
                items = ", ".join(f"{v} . {key}" for key in sorted(keys))
                lines.append(f"add element {t} {name} {{ {items} }}")
        chain = BUDGET if policy.open else DENYLIST if policy.denylist else ALLOWLIST
        lines += [
            *self._unbudget(veth),
            *self._budget(veth, quota_bytes, used_bytes),
            AddElement(EGRESS_BYTES, veth),  # an existing element keeps its counter
            AddElement(INGRESS_BYTES, veth),
            AddElement("out_chains", veth, goto=chain),
        ]
        await self._nft(lines)
        self._held[veth] = held
        self._routed[veth] = chain

    async def set_quota(self, veth: str, *, quota_bytes: int, used_bytes: int) -> None:
        """A new budget (-1: unmetered) counted from ``used_bytes`` already spent."""
        await self._nft([*self._unbudget(veth), *self._budget(veth, quota_bytes, used_bytes)])

    async def admit(self, veth: str, admissions: list[Admission]) -> None:
        """Adds resolved addresses with their TTL; an address already present gets the new timeout."""
        t = self._t
        lines: list[str] = []
        added: list[tuple[str, str]] = []
        for item in admissions:
            ttl = min(max(item.ttl_s, MIN_ANSWER_TTL_S), MAX_ANSWER_TTL_S)
            if item.port is None:
                target, key = "answers", item.address
            else:
                target, key = "answer_ports", f"{item.address} . {item.port}"
            element = f"{_q(veth)} . {key}"
            lines += [
                f"add element {t} {target} {{ {element} timeout {ttl}s }}",
                f"delete element {t} {target} {{ {element} }}",
                f"add element {t} {target} {{ {element} timeout {ttl}s }}",
            ]
            added.append((target, key))
        if lines:
            await self._nft(lines)
            held = self._held.setdefault(veth, {})
            for target, key in added:
                held.setdefault(target, set()).add(key)

    async def remove(self, veth: str) -> None:
        """Removes everything the sandbox had in the table; safe on an absent one."""
        lines: list[Op | str] = [
            *self._forget(veth),
            *self._unroute(veth),
            *self._unbudget(veth),
            *(
                op
                for name in (EGRESS_BYTES, INGRESS_BYTES)
                for op in (AddElement(name, veth), DeleteElement(name, veth))
            ),
        ]
        await self._nft(lines)
        self._held.pop(veth, None)
        self._routed.pop(veth, None)

    # -- counters ---------------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """Egress and ingress bytes and the cap of every installed sandbox (three ``nft -j`` reads:
        nft 1.0 cannot list two sets in one command)."""
        egress, ingress = await self._counters(EGRESS_BYTES), await self._counters(INGRESS_BYTES)
        snap = Snapshot({veth: Usage(value, ingress.get(veth, 0)) for veth, value in egress.items()})
        for quota in await self._quotas(f"quotas table {self._t}"):
            usage = snap.usage.get(quota.get("name", "")[2:])
            if usage is not None:
                usage.capped = _capped(quota)
        return snap

    async def usage(self, veth: str, *, metered: bool) -> Usage | None:
        """One sandbox's counters (None when it has no policy installed).

        The sets are listed whole: ``get element`` and ``list quota`` read every element of every
        set on the host first, a listed set only its own."""
        egress = await self._counters(EGRESS_BYTES)
        if veth not in egress:
            return None
        usage = Usage(egress[veth], (await self._counters(INGRESS_BYTES)).get(veth, 0))
        usage.capped = metered and any(map(_capped, await self._quotas(f"quota {self._t} q_{veth}")))
        return usage

    async def attempts(self) -> list[Attempt]:
        """Every element of the sets of attempts (two ``nft -j`` listings; none without a table)."""
        found: list[Attempt] = []
        for name, verdict in ATTEMPT_SETS.items():
            for element in await self._elements(name):
                attempt = _attempt(verdict, element)
                if attempt is not None:
                    found.append(attempt)
        return found

    async def _counters(self, name: str) -> dict[str, int]:
        """Bytes by veth counted in one of the counted sets."""
        return dict(map(_counted, await self._elements(name)))

    async def _quotas(self, what: str) -> list[NftObject]:
        """The quota objects ``list <what>`` prints (none when they are gone)."""
        try:
            out = await self.nft.run(f"list {what}", json_output=True)
        except CommandFailedError:
            return []
        return [dict(item["quota"]) for item in _objects_of(out) if "quota" in item]

    async def installed(self) -> set[str]:
        """Host veths that have a policy installed. Also reads back which chain each one goes to and
        which elements of the shared sets it holds (what an earlier agent process installed), so a
        later change replaces them."""
        try:
            await self.nft.run(f"list chain {self._t} {BUDGET}")
        except CommandFailedError:  # no table yet, or one of the chain-per-sandbox layout
            await self._convert()
        return await self._read_back()

    async def _read_back(self) -> set[str]:
        self._held, self._routed = {}, {}
        for name in ADDRESS_SETS:
            for element in await self._elements(name):
                parsed = _element_key(element)
                if parsed is not None:
                    veth, key = parsed
                    self._held.setdefault(veth, {}).setdefault(name, set()).add(key)
        for element in await self._elements("out_chains"):
            veth, verdict = element
            if isinstance(veth, str) and isinstance(verdict, dict) and "goto" in verdict:
                self._routed[veth] = verdict["goto"]["target"]
        return set(self._routed)

    async def _elements(self, name: str) -> list[Any]:
        """The elements of a set or map as ``nft -j`` prints them (none when there is no table)."""
        kind = "map" if name == "out_chains" else "set"
        try:
            out = await self.nft.run(f"list {kind} {self._t} {name}", json_output=True)
        except CommandFailedError:
            return []
        return [e for item in _objects_of(out) if kind in item for e in item[kind].get("elem", [])]

    async def _nft(self, batch: Sequence[Op | str]) -> None:
        """One atomic batch: as netlink messages when it is only elements keyed on a veth and quotas
        (a create's, a destroy's, a quota change), else as text (``Nft.apply``)."""
        await self.nft.apply(self._t, batch)


def _objects_of(output: str) -> list[dict[str, NftObject]]:
    """nft -j prints one JSON document per listed command."""
    items: list[dict[str, NftObject]] = []
    decoder = json.JSONDecoder()
    text, pos = output.strip(), 0
    while pos < len(text):
        doc, end = decoder.raw_decode(text, pos)
        items += doc.get("nftables", [])
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return items


def _q(text: str) -> str:
    return f'"{text}"'


def _keys(networks: Networks) -> set[str]:
    """Elements' keys (without the veth) for a set of addresses, as nft text."""
    return {str(net) for net in networks}


def _port_keys(network_ports: NetworkPorts) -> set[str]:
    return {f"{net} . {port}" for net, port in network_ports}


def _element_key(element: Any) -> tuple[str, str] | None:
    """(veth, key as nft text) of one element of a shared set as ``nft -j`` prints it: the veth, then
    an address, a prefix or a range, then a port, with the TTL wrapped around it in timeout sets."""
    if isinstance(element, dict) and "elem" in element:
        element = element["elem"].get("val")
    parts = element.get("concat") if isinstance(element, dict) else None
    if not parts or not isinstance(parts[0], str):
        return None
    rendered: list[str] = []
    for part in parts[1:]:
        if isinstance(part, dict) and "prefix" in part:
            rendered.append(f"{part['prefix']['addr']}/{part['prefix']['len']}")
        elif isinstance(part, dict) and "range" in part:
            rendered.append(f"{part['range'][0]}-{part['range'][1]}")
        else:
            rendered.append(str(part))
    return parts[0], " . ".join(rendered)


def _counted(element: Any) -> tuple[str, int]:
    """(veth, bytes) of an element of a counted set as ``nft -j`` prints it."""
    elem = element.get("elem", {}) if isinstance(element, dict) else {}
    return str(elem.get("val", element)), int(elem.get("counter", {}).get("bytes", 0))


def _attempt(verdict: str, element: Any) -> Attempt | None:
    """An element of a set of attempts as ``nft -j`` prints it: ``{"elem": {"val": {"concat": [veth,
    address, protocol, port]}, "expires": s, "counter": {...}}}``; None for anything else."""
    elem = element.get("elem", {}) if isinstance(element, dict) else {}
    parts = elem.get("val", {}).get("concat") if isinstance(elem.get("val"), dict) else None
    if not isinstance(parts, list) or len(parts) != 4:
        return None
    veth, address, protocol, port = parts
    if not isinstance(veth, str) or not isinstance(address, str) or not isinstance(port, int):
        return None
    packets = int(elem.get("counter", {}).get("packets", 0))
    idle_s = max(ATTEMPT_TIMEOUT_S - int(elem.get("expires", ATTEMPT_TIMEOUT_S)), 0)
    return Attempt(verdict, veth, address, str(protocol), port, packets, idle_s)


def _capped(quota: NftObject) -> bool:
    return int(quota.get("used", 0)) >= int(quota.get("bytes", 0))


def _expires(element: Any) -> int:
    """Whole seconds an element of a timeout set has left (0: none, or no timeout)."""
    elem = element.get("elem", {}) if isinstance(element, dict) else {}
    return int(elem.get("expires", 0))
