"""Egress allowlists and bandwidth quotas in the kernel (nftables), one chain per sandbox.

Everything lives in ``table ip <nft_table>_egress``, apart from the NAT table ``network.py`` owns, so
each can be rebuilt without touching the other. Per sandbox, keyed on its host veth ``pdk<slot>``::

    forward (hook)   iifname vmap @out_chains ── goto sb_<veth>
                     iifname "pdk*" ip saddr <subnet> drop        (a veth without a policy: fail closed)
    sb_<veth>        ip saddr != <sandbox ip> drop                (no spoofing)
                     ct state established,related goto m_<veth>   (replies and flows already admitted)
                     iifname . ip daddr @allow_net / iifname . ip daddr . port @allow_netport
                                                                   -> m_<veth>   (ip, cidr rules)
                     iifname . ip daddr @answers / iifname . ip daddr . port @answer_ports
                                                                   -> m_<veth>   (answers of the
                                                                    sandbox's resolver, with their TTL)
                     reject                                       (only when the allowlist has rules)
    m_<veth>         quota name q_<veth> drop                     (metered: the budget is used up)
                     counter name co_<veth> accept                (egress bytes, exact)
    postrouting      counter name oifname map @in_counters        (ingress bytes, observed only)

The four address sets are shared by every sandbox, each element prefixed by its veth, rather than four
sets per sandbox: libnftables reads every set's elements (one netlink dump per set) before it runs any
command, so per-sandbox sets made each create, remove and counter read cost more with every sandbox on
the host (an install took 0.5 ms beside 10 sandboxes and 700 ms beside 1,000). Which elements belong to
a veth is kept here (``_held``) and read back from the sets when the agent starts, so a new allowlist
replaces exactly the old one.

Only forwarded traffic is egress: what a sandbox sends to the host itself (DNS, replies to the
ingress proxy) is neither filtered by the allowlist nor counted. What every sandbox may send to the
host at all — DNS and replies, nothing else, with or without rules — and the per-veth source check
are ``network.py``'s, in the table that exists from the moment a veth does. Every change is one
``nft -f`` batch, which the kernel applies atomically.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

from paddock_hostagent.drivers.base import CommandFailedError
from paddock_hostagent.drivers.nftlib import Nft

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


@dataclass(frozen=True)
class EgressPolicy:
    """A parsed allowlist. ``open`` means no rules: everything passes."""

    networks: tuple[ipaddress.IPv4Network, ...] = ()
    network_ports: tuple[tuple[ipaddress.IPv4Network, int], ...] = ()
    names: tuple[NameRule, ...] = ()
    open: bool = True

    @classmethod
    def parse(cls, rules: list[str]) -> EgressPolicy:
        """Rules as the control plane normalises them: host, host:port, *.host, ip, ip:port, cidr,
        cidr:port, [v6]:port. IPv6 rules are accepted and match nothing (sandboxes have no IPv6)."""
        if not rules or rules == ["*"]:
            return cls()
        networks: list[ipaddress.IPv4Network] = []
        network_ports: dict[int, list[ipaddress.IPv4Network]] = {}
        names: list[NameRule] = []
        for raw in rules:
            rule = raw.strip().lower()
            if rule == "*":
                raise EgressRuleError(raw, "'*' is allowed only as the sole entry")
            host, port = _split_port(raw, rule)
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
                (network_ports.setdefault(port, []) if port else networks).append(net)
                continue
            wildcard = host.startswith("*.")
            name = host[2:] if wildcard else host
            _check_hostname(raw, name)
            if wildcard and "." not in name.rstrip("."):  # as the control plane's validation: no "*.com"
                raise EgressRuleError(raw, "'*.' needs a domain with at least two labels")
            names.append(NameRule(name, wildcard, port))
        return cls(
            networks=tuple(ipaddress.collapse_addresses(networks)),
            network_ports=tuple(
                (net, port)
                for port, nets in sorted(network_ports.items())
                for net in ipaddress.collapse_addresses(nets)
            ),
            names=tuple(dict.fromkeys(names)),
            open=False,
        )

    def name_ports(self, qname: str) -> tuple[bool, set[int]] | None:
        """For a queried name: (any port allowed, specific ports), or None when no rule allows it."""
        qname = qname.lower().rstrip(".")
        matched = [rule for rule in self.names if rule.matches(qname)]
        if not matched:
            return None
        return any(rule.port is None for rule in matched), {r.port for r in matched if r.port is not None}


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
}
#: Sets whose elements expire by themselves: an element may be gone before it is deleted.
EXPIRING = ("answers", "answer_ports")


class EgressFirewall:
    """The nftables side: installs, updates and removes per-sandbox policy and reads its counters."""

    def __init__(self, nft_table: str, subnet: str, gateway: str) -> None:
        self.table = f"{nft_table}_egress"
        self.subnet = subnet
        self.gateway = gateway
        self._t = f"ip {self.table}"
        self.nft = Nft()
        # veth → shared set → the element keys (nft text, without the veth) it holds there.
        self._held: dict[str, dict[str, set[str]]] = {}

    # -- host-wide --------------------------------------------------------------------------------

    def setup_host(self) -> None:
        """Creates the table, its base chains and shared sets, keeping installed sandboxes
        (idempotent)."""
        t = self._t
        sets = "\n".join(f"add set {t} {name} {{ {kind} }}" for name, kind in ADDRESS_SETS.items())
        self.nft.run_sync(
            f"""
add table {t}
add map {t} out_chains {{ type ifname : verdict; }}
add map {t} in_counters {{ type ifname : counter; }}
{sets}
add chain {t} forward {{ type filter hook forward priority filter - 5; policy accept; }}
add chain {t} post {{ type filter hook postrouting priority filter; policy accept; }}
flush chain {t} forward
flush chain {t} post
add rule {t} forward iifname vmap @out_chains
add rule {t} forward iifname "pdk*" ip saddr {self.subnet} drop
add rule {t} post counter name oifname map @in_counters
"""
        )
        # Agents before the host guard moved to network.py kept an input chain here that guarded only
        # sandboxes with rules, keyed on a set of them: both go (created first so the delete is safe).
        self.nft.run_sync(
            f"""
add chain {t} input {{ type filter hook input priority filter - 5; policy accept; }}
add set {t} guarded {{ type ifname; }}
flush chain {t} input
delete chain {t} input
delete set {t} guarded
"""
        )

    def teardown_host(self) -> None:
        with contextlib.suppress(CommandFailedError):  # already gone
            self.nft.run_sync(f"delete table {self._t}")
        self._held.clear()

    # -- per sandbox ----------------------------------------------------------------------------

    def _objects(self, veth: str) -> str:
        t = self._t
        return "\n".join(
            [
                f"add chain {t} sb_{veth}",
                f"add chain {t} m_{veth}",
                f"add counter {t} co_{veth}",
                f"add counter {t} ci_{veth}",
                f"add quota {t} q_{veth} {{ over 1 bytes }}",
            ]
        )

    def _meter(self, veth: str, quota_bytes: int, used_bytes: int) -> list[str]:
        t = self._t
        lines = [
            f"flush chain {t} m_{veth}",
            f"delete quota {t} q_{veth}",
            f"add quota {t} q_{veth} {{ over {max(quota_bytes, 1)} bytes used {max(used_bytes, 0)} bytes }}",
        ]
        if quota_bytes >= 0:
            lines.append(f'add rule {t} m_{veth} quota name "q_{veth}" drop')
        lines.append(f'add rule {t} m_{veth} counter name "co_{veth}" accept')
        return lines

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
        """Installs or replaces the sandbox's allowlist and budget in one atomic batch.

        Addresses admitted by earlier DNS answers are forgotten (the rules they came from may be
        gone); flows already established keep going."""
        t = self._t
        g = f"{t} sb_{veth}"
        lines = [self._objects(veth), *self._forget(veth)]
        networks = {str(net) for net in policy.networks}
        network_ports = {f"{net} . {port}" for net, port in policy.network_ports}
        for name, keys in (("allow_net", networks), ("allow_netport", network_ports)):
            if keys:
                items = ", ".join(f"{_q(veth)} . {key}" for key in sorted(keys))
                lines.append(f"add element {t} {name} {{ {items} }}")
        lines += self._meter(veth, quota_bytes, used_bytes)
        lines += [
            f"flush chain {g}",
            f"add rule {g} ip saddr != {ip} drop",
        ]
        if policy.open:
            lines.append(f"add rule {g} goto m_{veth}")
        else:
            lines += [
                f"add rule {g} ct state established,related goto m_{veth}",
                f"add rule {g} iifname . ip daddr @allow_net goto m_{veth}",
                f"add rule {g} meta l4proto {{ tcp, udp }} iifname . ip daddr . th dport @allow_netport"
                f" goto m_{veth}",
                f"add rule {g} iifname . ip daddr @answers goto m_{veth}",
                f"add rule {g} meta l4proto {{ tcp, udp }} iifname . ip daddr . th dport @answer_ports"
                f" goto m_{veth}",
                f"add rule {g} meta l4proto tcp reject with tcp reset",
                f"add rule {g} reject with icmp type admin-prohibited",
            ]
        lines += [
            f"add element {t} out_chains {{ {_q(veth)} : goto sb_{veth} }}",
            f"add element {t} in_counters {{ {_q(veth)} : {_q('ci_' + veth)} }}",
        ]
        await self._nft("\n".join(lines))
        self._held[veth] = {"allow_net": networks, "allow_netport": network_ports}

    async def set_quota(self, veth: str, *, quota_bytes: int, used_bytes: int) -> None:
        """A new budget (-1: unmetered) counted from ``used_bytes`` already spent."""
        await self._nft("\n".join([self._objects(veth), *self._meter(veth, quota_bytes, used_bytes)]))

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
            await self._nft("\n".join(lines))
            held = self._held.setdefault(veth, {})
            for target, key in added:
                held.setdefault(target, set()).add(key)

    async def remove(self, veth: str) -> None:
        """Removes everything the sandbox had in the table; safe on a half-installed or absent one."""
        t = self._t
        lines = [
            self._objects(veth),
            *self._forget(veth),
            f"add element {t} out_chains {{ {_q(veth)} : goto sb_{veth} }}",
            f"add element {t} in_counters {{ {_q(veth)} : {_q('ci_' + veth)} }}",
            f"delete element {t} out_chains {{ {_q(veth)} }}",
            f"delete element {t} in_counters {{ {_q(veth)} }}",
            f"flush chain {t} sb_{veth}",
            f"flush chain {t} m_{veth}",
            f"delete chain {t} sb_{veth}",
            f"delete chain {t} m_{veth}",
            f"delete counter {t} co_{veth}",
            f"delete counter {t} ci_{veth}",
            f"delete quota {t} q_{veth}",
        ]
        await self._nft("\n".join(lines))
        self._held.pop(veth, None)

    # -- counters ---------------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """Egress and ingress bytes and the cap of every installed sandbox (two ``nft -j`` reads)."""
        counters, quotas = await asyncio.gather(
            self._list("counters"),
            self._list("quotas"),
        )
        snap = Snapshot()
        for item in counters:
            name, value = item.get("name", ""), int(item.get("bytes", 0))
            if name.startswith("co_"):
                snap.usage.setdefault(name[3:], Usage()).egress_bytes = value
            elif name.startswith("ci_"):
                snap.usage.setdefault(name[3:], Usage()).ingress_bytes = value
        for item in quotas:
            name = item.get("name", "")
            if name.startswith("q_") and name[2:] in snap.usage:
                snap.usage[name[2:]].capped = int(item.get("used", 0)) >= int(item.get("bytes", 0))
        return snap

    async def usage(self, veth: str, *, metered: bool) -> Usage | None:
        """One sandbox's counters (None when it has no policy installed)."""
        try:
            outputs = [
                await self.nft.run(f"list {kind} {self._t} {prefix}_{veth}", json_output=True)
                for kind, prefix in (("counter", "co"), ("counter", "ci"), ("quota", "q"))
            ]
        except CommandFailedError:
            return None
        out = "\n".join(outputs)
        usage = Usage()
        for item in _objects_of(out):
            if "counter" in item:
                name, value = item["counter"].get("name", ""), int(item["counter"].get("bytes", 0))
                if name.startswith("co_"):
                    usage.egress_bytes = value
                else:
                    usage.ingress_bytes = value
            elif "quota" in item and metered:
                usage.capped = int(item["quota"].get("used", 0)) >= int(item["quota"].get("bytes", 0))
        return usage

    async def installed(self) -> set[str]:
        """Host veths that have a policy installed. Also reads back which elements of the shared sets
        each one holds (what an earlier agent process installed), so a later change replaces them."""
        self._held = {}
        for name in ADDRESS_SETS:
            try:
                out = await self.nft.run(f"list set {self._t} {name}", json_output=True)
            except CommandFailedError:
                continue  # no table yet
            elements = [e for item in _objects_of(out) if "set" in item for e in item["set"].get("elem", [])]
            for element in elements:
                parsed = _element_key(element)
                if parsed is not None:
                    veth, key = parsed
                    self._held.setdefault(veth, {}).setdefault(name, set()).add(key)
        return {
            item["name"][3:] for item in await self._list("counters") if item.get("name", "")[:3] == "co_"
        }

    async def _list(self, kind: str) -> list[NftObject]:
        try:
            out = await self.nft.run(f"list {kind} table {self._t}", json_output=True)
        except CommandFailedError:
            return []
        key = kind[:-1]
        return [dict(item[key]) for item in _objects_of(out) if key in item]

    async def _nft(self, batch: str) -> None:
        await self.nft.run(batch)


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
