"""Egress of this host's sandboxes: allowlists, bandwidth budgets and the resolver that serves names.

``EgressService`` keeps each sandbox's policy (by id and by address), installs it in the kernel through
``drivers.net.egress_rules.EgressFirewall`` and answers the resolver (``drivers.net.dns.Resolver``): a name the
sandbox's rules allow is forwarded and its answers are admitted into the sandbox's sets before the
sandbox sees them. Policy changes and admissions of one sandbox are serialised by its lock, so an
answer to a query made under an old allowlist cannot land after the new one is installed.

It also keeps the sandboxes' connection attempts for the audit trail (``attempts``): the kernel's sets
of attempts (``egress_rules.py``) are read when the control plane asks, at most once a second, and
each new element or risen packet count becomes an ``AttemptRecord`` in a bounded ring, numbered, that
the control plane reads from where it stopped (``GET /internal/v1/egress/attempts``). The numbers
restart with the agent (a new ``epoch``); a control plane that falls more than ``ATTEMPT_RING`` behind
is told how many it lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import deque
from dataclasses import dataclass, field

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.net.dns import Decision, Resolver, Upstream
from paddock_hostagent.drivers.net.egress_rules import (
    MAX_ANSWER_TTL_S,
    MIN_ANSWER_TTL_S,
    Admission,
    Attempt,
    EgressFirewall,
    EgressPolicy,
    Usage,
)

log = get_logger(__name__)

UNMETERED = -1
#: Attempts kept for the control plane to read; older ones are dropped (and counted as lost).
ATTEMPT_RING = 10_000
#: The kernel's sets are read at most this often, however often the control plane asks.
ATTEMPT_READ_EVERY_S = 1.0


@dataclass
class _Guarded:
    sandbox_id: str
    veth: str
    ip: str
    rules: list[str]
    policy: EgressPolicy
    quota_bytes: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    generation: int = 0  # bumped by every rule change; stale admissions are dropped
    # (address, port) -> monotonic time its set element expires; lets repeated answers skip nft.
    admitted: dict[tuple[str, int | None], float] = field(default_factory=dict)


@dataclass(frozen=True)
class Attachment:
    """What a sandbox needs to be guarded: its id, host veth, address, rules and budget."""

    sandbox_id: str
    veth: str
    ip: str
    rules: list[str]
    quota_bytes: int


@dataclass(frozen=True)
class AttemptRecord:
    """Connection attempts of one sandbox to one address and port, with one verdict, seen since the
    last record of them: ``packets`` opening packets, the last at ``at`` (epoch seconds)."""

    seq: int
    sandbox_id: str
    at: float
    verdict: str
    address: str
    protocol: str
    port: int
    packets: int


class EgressService:
    def __init__(self, firewall: EgressFirewall, listen: str, upstreams: list[Upstream]) -> None:
        self.firewall = firewall
        self.resolver = Resolver(listen, upstreams, self.decide)
        self._by_id: dict[str, _Guarded] = {}
        self._by_ip: dict[str, _Guarded] = {}
        #: This agent run's id: attempt numbers start again with it.
        self.epoch = secrets.token_hex(8)
        self._attempts: deque[AttemptRecord] = deque(maxlen=ATTEMPT_RING)
        self._seq = 0
        #: Packets already recorded per element of the kernel's sets (veth, verdict, address, proto, port).
        self._counted: dict[tuple[str, str, str, str, int], int] = {}
        self._read_at = 0.0
        self._reading = asyncio.Lock()

    # -- start-up and shutdown ------------------------------------------------------------------

    async def start(self, sandboxes: list[Attachment]) -> None:
        """Re-adopts the policies of sandboxes that survived a restart (their counters kept), installs
        missing ones, removes policies no sandbox owns, and starts the resolver."""
        installed = await self.firewall.installed()
        for item in sandboxes:
            guarded = self._remember(item, EgressPolicy.parse(item.rules))
            if item.veth not in installed:
                await self.firewall.install(
                    item.veth, item.ip, guarded.policy, quota_bytes=item.quota_bytes, used_bytes=0
                )
        for veth in installed - {item.veth for item in sandboxes}:
            log.info("egress_orphan_removed", veth=veth)
            await self.firewall.remove(veth)
        await self.resolver.start()

    async def close(self) -> None:
        await self.resolver.close()

    # -- per sandbox ----------------------------------------------------------------------------

    def _remember(self, item: Attachment, policy: EgressPolicy) -> _Guarded:
        guarded = _Guarded(item.sandbox_id, item.veth, item.ip, list(item.rules), policy, item.quota_bytes)
        self._by_id[item.sandbox_id] = guarded
        self._by_ip[item.ip] = guarded
        return guarded

    async def attach(self, item: Attachment) -> None:
        """Installs a new sandbox's allowlist and budget (its counters start at zero)."""
        policy = EgressPolicy.parse(item.rules)
        await self.firewall.install(item.veth, item.ip, policy, quota_bytes=item.quota_bytes, used_bytes=0)
        self._remember(item, policy)

    async def detach(self, sandbox_id: str, veth: str | None = None) -> None:
        if sandbox_id in self._by_id:  # its last attempts, while its veth still says whose they are
            with contextlib.suppress(Exception):
                await self.read_attempts(force=True)
        guarded = self._by_id.pop(sandbox_id, None)
        if guarded is not None and self._by_ip.get(guarded.ip) is guarded:
            del self._by_ip[guarded.ip]
        veth = veth or (guarded.veth if guarded else None)
        if veth:
            await self.firewall.remove(veth)

    async def set_rules(self, sandbox_id: str, rules: list[str]) -> list[str]:
        guarded = self._by_id[sandbox_id]
        policy = EgressPolicy.parse(rules)
        if rules == guarded.rules:
            return guarded.rules  # idempotent: addresses admitted by earlier answers stay
        async with guarded.lock:
            usage = await self.firewall.usage(guarded.veth, metered=guarded.quota_bytes >= 0)
            await self.firewall.install(
                guarded.veth,
                guarded.ip,
                policy,
                quota_bytes=guarded.quota_bytes,
                used_bytes=_spent(usage),
            )
            guarded.rules, guarded.policy = list(rules), policy
            guarded.generation += 1
            guarded.admitted.clear()
        return guarded.rules

    async def set_quota(self, sandbox_id: str, quota_bytes: int) -> Usage:
        """A new total budget (-1: unmetered); a capped sandbox with room again is unblocked."""
        guarded = self._by_id[sandbox_id]
        if quota_bytes == guarded.quota_bytes:
            return await self.usage(sandbox_id)
        async with guarded.lock:
            usage = await self.firewall.usage(guarded.veth, metered=guarded.quota_bytes >= 0)
            await self.firewall.set_quota(guarded.veth, quota_bytes=quota_bytes, used_bytes=_spent(usage))
            guarded.quota_bytes = quota_bytes
        return await self.usage(sandbox_id)

    async def usage(self, sandbox_id: str) -> Usage:
        guarded = self._by_id[sandbox_id]
        usage = await self.firewall.usage(guarded.veth, metered=guarded.quota_bytes >= 0)
        return usage or Usage()

    def guards(self, sandbox_id: str) -> bool:
        return sandbox_id in self._by_id

    def quota_of(self, sandbox_id: str) -> int:
        return self._by_id[sandbox_id].quota_bytes

    def rules_of(self, sandbox_id: str) -> list[str]:
        return list(self._by_id[sandbox_id].rules)

    async def snapshot(self) -> dict[str, Usage]:
        """Usage of every guarded sandbox, by sandbox id (for the heartbeat)."""
        snap = await self.firewall.snapshot()
        out: dict[str, Usage] = {}
        for sandbox_id, guarded in list(self._by_id.items()):
            usage = snap.usage.get(guarded.veth)
            if usage is not None:
                usage.capped = usage.capped and guarded.quota_bytes >= 0
                out[sandbox_id] = usage
        return out

    # -- connection attempts, for the audit trail -------------------------------------------------

    async def read_attempts(self, *, force: bool = False) -> None:
        """Turns what the kernel's sets of attempts gained since the last read into records."""
        async with self._reading:
            now = time.monotonic()
            if not force and now - self._read_at < ATTEMPT_READ_EVERY_S:
                return
            self._read_at = now
            found = await self.firewall.attempts()
            owners = {guarded.veth: guarded.sandbox_id for guarded in self._by_id.values()}
            counted: dict[tuple[str, str, str, str, int], int] = {}
            wall = time.time()
            for item in sorted(found, key=lambda a: -a.idle_s):  # oldest first
                key = (item.veth, item.verdict, item.address, item.protocol, item.port)
                counted[key] = item.packets
                seen = self._counted.get(key, 0)
                new = item.packets - seen if item.packets >= seen else item.packets
                owner = owners.get(item.veth)
                if new > 0 and owner is not None:
                    self._record(owner, item, new, wall - item.idle_s)
            self._counted = counted  # expired elements are forgotten: a later one is new

    def _record(self, sandbox_id: str, item: Attempt, packets: int, at: float) -> None:
        self._seq += 1
        self._attempts.append(
            AttemptRecord(
                self._seq, sandbox_id, at, item.verdict, item.address, item.protocol, item.port, packets
            )
        )

    @property
    def last_seq(self) -> int:
        """The number of the last attempt recorded in this run (0: none yet); the heartbeat sends it."""
        return self._seq

    async def attempts(self, epoch: str, after: int, limit: int) -> tuple[list[AttemptRecord], int, int]:
        """Records after ``after`` of run ``epoch`` (from the first, for another run), at most ``limit``;
        also the last number given and how many records after ``after`` were already dropped."""
        await self.read_attempts()
        if epoch != self.epoch:
            after = 0
        first = self._attempts[0].seq if self._attempts else self._seq + 1
        lost = max(first - after - 1, 0)
        start = max(after - first + 1, 0)
        out = list(itertools.islice(self._attempts, start, start + limit))
        return out, (out[-1].seq if out else max(after, first - 1)), lost

    # -- the resolver's questions ---------------------------------------------------------------

    def decide(self, source: str, qname: str) -> Decision:
        guarded = self._by_ip.get(source)
        if guarded is None:
            return "unknown"
        if guarded.policy.open:
            return "open"
        allowed = guarded.policy.name_ports(qname)
        if allowed is None:
            # A denylist lets every name resolve (what it denies are addresses, refused whatever the
            # name); an allowlist resolves only the names it allows.
            return "open" if guarded.policy.denylist else "deny"
        any_port, ports = allowed
        generation = guarded.generation

        async def admit(addresses: list[tuple[str, int]]) -> None:
            async with guarded.lock:
                if guarded.generation != generation or self._by_id.get(guarded.sandbox_id) is not guarded:
                    raise RuntimeError("the sandbox's allowlist changed while resolving")
                now = time.monotonic()
                admissions = [
                    Admission(address, port, _kept_s(ttl))
                    for address, ttl in addresses
                    for port in ([None] if any_port else sorted(ports))
                    # already admitted for at least half of this answer's lifetime: nothing to do
                    if guarded.admitted.get((address, port), 0.0) < now + _kept_s(ttl) / 2
                ]
                if admissions:
                    await self.firewall.admit(guarded.veth, admissions)
                    for item in admissions:
                        guarded.admitted[(item.address, item.port)] = now + item.ttl_s
                    if len(guarded.admitted) > 4096:
                        guarded.admitted = {k: v for k, v in guarded.admitted.items() if v > now}

        return admit


def _kept_s(ttl_s: int) -> int:
    return min(max(ttl_s, MIN_ANSWER_TTL_S), MAX_ANSWER_TTL_S)


def _spent(usage: Usage | None) -> int:
    return usage.egress_bytes if usage is not None else 0


async def close_quietly(service: EgressService | None) -> None:
    if service is not None:
        with contextlib.suppress(Exception):
            await service.close()
