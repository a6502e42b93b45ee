"""Placement: pick an active host with enough free memory, honouring ``host_id`` and ``node_selector``.

A host's free memory is the smaller of two views, so neither can over-place it:

- what the host itself last reported, minus what this database placed there since that report (the
  report cannot include those yet). This is the only view that sees memory the database does not
  know about: sandboxes left from another database, or from a process that died mid-create;
- its total minus the memory of every sandbox the database has placed there and not yet released,
  so two creates between heartbeats cannot both take the last slot.

A placement looks at the hosts in order of what each could have free at most (its report, capped by
its total: neither view can exceed it), counting what is held only on the leading ones, and stops once
no host further down could beat the best found (:func:`_pick_leading`): the decision reads a few
hosts' sandboxes whatever the fleet's size. Counting is the part of a placement that grows with the
host's sandboxes (one row read per sandbox held there: ~1 ms per 1,000 on SQLite on the dev box), so
each host is counted once. When that finds no room, or no host qualifies, the whole fleet is read with
every active host locked (FOR UPDATE on PostgreSQL), as before, and the 503 says why (``no host with
capacity: no host has 1024 MiB free (largest: 297 MiB)``); the message keeps the contract's ``no host
with capacity`` at its start for clients that look for it.

On PostgreSQL everything that adds memory to a host by a decision, or takes a host out of placement,
takes turns on one advisory lock (:func:`placement_lock`), held to its commit: a create's placement, a
fork's room check (:func:`check_room`) and a drain (``hosts.set_drained``). So a count made under it is
the truth until the commit: no row of the chosen host is locked and nothing is counted twice. Before,
a placement locked its leading host's row and then the chosen one's and counted the chosen one again
(a fork locked only that row); those were 3 of a create's ~16 round trips under its account's lock,
which bounded one user's creates to ~65/s on two control planes (docs/performance.md, "PostgreSQL
creates"). Hibernated sandboxes woken again are not decided here, as before: their host refuses a wake
it has no room for. SQLite's writers take turns on the whole file, which covers all of this.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import bindparam, case, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.states import HOLDING_MEMORY
from paddock_core import errors
from paddock_core.timeutil import as_utc

NO_CAPACITY = "no host with capacity"
#: Seconds a client should wait before retrying a create refused for capacity (heartbeats are ~2 s).
RETRY_AFTER_S = 2


def labels_match(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Kubernetes node-selector semantics: every requested pair is among the host's labels."""
    return all(labels.get(key) == value for key, value in selector.items())


def no_capacity(reason: str) -> errors.Unavailable:
    return errors.Unavailable(f"{NO_CAPACITY}: {reason}", retry_after_s=RETRY_AFTER_S)


@dataclass(frozen=True)
class Held:
    """Memory the database has placed on one host: all of it, and the part placed since its report."""

    placed_mib: int
    since_report_mib: int


# Every create runs these: built once (building and keying a statement costs about what SQLite takes
# to run it), the host ids an expanding parameter.
_SINCE_REPORT = case((Sandbox.created_at > Host.last_heartbeat_at, Sandbox.mem_mib), else_=0)
_HELD = (
    select(Sandbox.host_id, func.sum(Sandbox.mem_mib), func.sum(_SINCE_REPORT))
    .join(Host, Host.id == Sandbox.host_id)
    .where(
        Sandbox.host_id.in_(bindparam("host_ids", expanding=True)),
        Sandbox.status.in_(HOLDING_MEMORY),
        Sandbox.hibernated.is_(False),  # a hibernated sandbox holds only its disk (docs/hibernation.md)
    )
    .group_by(Sandbox.host_id)
)
_ACTIVE_HOSTS = select(Host).where(Host.status == "active").order_by(Host.id).with_for_update()
_ACTIVE_HOST = _ACTIVE_HOSTS.where(Host.id == bindparam("host_id"))
#: What a fork's room check needs of its host, read once the placement lock is held (so not locking the
#: row: a heartbeat writing it would only hold the fork up). Plain columns: loading the whole host (its
#: JSON lists too) through the ORM cost as much as the statement.
_HOST_ROOM = select(Host.status, Host.last_heartbeat_at, Host.free_mib, Host.total_mib).where(
    Host.id == bindparam("host_id")
)


#: What a placement reads of the hosts, leading ones first: plain columns, ordered by the most each
#: could have free (``free_mib`` capped by ``total_mib``), a batch at a time.
_BOUND = case((Host.free_mib < Host.total_mib, Host.free_mib), else_=Host.total_mib)
_LEADING = (
    select(
        Host.id,
        Host.last_heartbeat_at,
        Host.free_mib,
        Host.total_mib,
        Host.labels,
        Host.rootfses,
        Host.buildable,
    )
    .where(Host.status == "active")
    .order_by(_BOUND.desc(), Host.id)
    .limit(bindparam("limit"))
    .offset(bindparam("offset"))
)
#: Hosts read per statement, and held memory counted for at most this many hosts per statement.
LEADING_BATCH = 32
HELD_BATCH = 4
#: Hosts read by the first statement: the choice is usually among the first few, and a fleet of up to
#: 16 is read whole, without a second trip when their bounds tie (hosts that report alike between two
#: heartbeats). 16 rows cost the statement what 4 did: it sorts every active host either way.
FIRST_LEADING = 16
#: Every placement on PostgreSQL takes this transaction-scoped advisory lock first (an arbitrary
#: constant: "paddock placement"), instead of locking every active host's row. A create takes it as a
#: column of the statement of its checks (``lifecycle._CHECKS``): what such a statement reads comes from
#: before its wait for the lock, so it must read nothing a placement decides by.
PLACEMENT_LOCK_COLUMN = func.pg_advisory_xact_lock(literal_column("7305916612"))
PLACEMENT_LOCK = select(PLACEMENT_LOCK_COLUMN)


async def placement_lock(session: AsyncSession) -> None:
    """Take turns with every placement, fork room check and drain until this transaction ends
    (PostgreSQL; on SQLite the transaction already holds the database's write lock)."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(PLACEMENT_LOCK)


async def held_by_host(session: AsyncSession, host_ids: Collection[str]) -> dict[str, Held]:
    if not host_ids:
        return {}
    rows = await session.execute(_HELD, {"host_ids": list(host_ids)})
    return {str(host_id): Held(int(placed or 0), int(since or 0)) for host_id, placed, since in rows.all()}


@dataclass
class Tally:
    """Memory held per host as counted once in one transaction, plus what that transaction placed since,
    its rows not yet written: a group of creates (``lifecycle``'s group commit) places each of its
    members without counting a host again. Sound under the placement lock, which the transaction holds
    from its first count: nothing else adds memory to a host until the commit, and what is released
    meanwhile only makes the tally cautious."""

    counted: dict[str, Held] = field(default_factory=dict)

    async def held(self, session: AsyncSession, host_ids: Collection[str]) -> dict[str, Held]:
        missing = [host_id for host_id in host_ids if host_id not in self.counted]
        if missing:
            found = await held_by_host(session, missing)
            for host_id in missing:
                self.counted[host_id] = found.get(host_id, Held(0, 0))
        return {host_id: self.counted[host_id] for host_id in host_ids}

    def place(self, host_id: str, mem_mib: int) -> None:
        """``mem_mib`` placed on ``host_id`` (counted already: a choice always is), after its report."""
        held = self.counted[host_id]
        self.counted[host_id] = Held(held.placed_mib + mem_mib, held.since_report_mib + mem_mib)


async def _held(session: AsyncSession, host_ids: Collection[str], tally: Tally | None) -> dict[str, Held]:
    return await (tally.held(session, host_ids) if tally is not None else held_by_host(session, host_ids))


def free_mib(reported_free_mib: int, total_mib: int, held: Held | None) -> int:
    """A host's free memory from what it reported and its total (the module's two views)."""
    held = held or Held(0, 0)
    reported = int(reported_free_mib) - held.since_report_mib
    return max(min(reported, int(total_mib) - held.placed_mib), 0)


async def pick_host(
    session: AsyncSession,
    *,
    mem_mib: int,
    rootfs: str,
    now: dt.datetime,
    dead_after_s: float,
    host_id: str | None = None,
    node_selector: dict[str, str] | None = None,
    exclude: Collection[str] = (),
    fetchable: bool = False,
    lock_held: bool = False,
    tally: Tally | None = None,
) -> str:
    """The id of the qualifying host with the most free memory; 503 saying why when there is none.

    ``lock_held``: the transaction already took the placement lock (a create takes it with its checks,
    ``PLACEMENT_LOCK_COLUMN``). ``tally``: hosts counted earlier in this transaction are not counted
    again (the caller records each choice in it, ``Tally.place``).

    ``fetchable``: the image (a template's) can be fetched from a host that holds it, so a host
    without it qualifies too, after every holder (a holder with room is always preferred).

    ``host_id`` naming no host at all is the caller's mistake (400 naming the field); a known host that
    is dead, draining or full is a capacity answer (503), as the contract says. ``exclude`` lists hosts
    that have just refused this sandbox for capacity.
    """
    if host_id and await session.get(Host, host_id) is None:
        raise errors.ValidationFailed.field("host_id", f"no host {host_id!r}; see GET /v1/hosts")
    if not lock_held:
        await placement_lock(session)
    if not host_id:
        leading = await _pick_leading(
            session,
            mem_mib=mem_mib,
            rootfs=rootfs,
            now=now,
            dead_after_s=dead_after_s,
            node_selector=node_selector,
            exclude=exclude,
            fetchable=fetchable,
            tally=tally,
        )
        if leading is not None:
            return leading
    query, params = (_ACTIVE_HOST, {"host_id": host_id}) if host_id else (_ACTIVE_HOSTS, {})
    alive = [
        host
        for host in (await session.scalars(query, params)).all()
        if (now - as_utc(host.last_heartbeat_at)).total_seconds() <= dead_after_s
    ]
    if not alive:
        raise no_capacity(f"host {host_id} is not active" if host_id else "no active host")
    matching = [h for h in alive if not node_selector or labels_match(h.labels or {}, node_selector)]
    if not matching:
        selector = json.dumps(node_selector, sort_keys=True)
        raise no_capacity(f"no active host matches node_selector {selector}")
    serving = [h for h in matching if rootfs in (h.rootfses or []) or rootfs in (h.buildable or [])]
    tiers = [serving, [h for h in matching if h not in serving]] if fetchable else [serving]
    if not any(tiers):
        raise no_capacity(f"no active host can run image {rootfs!r}")
    held = await _held(session, [host.id for tier in tiers for host in tier], tally)
    best: tuple[int, Host] | None = None
    largest = 0
    for tier in tiers:
        for host in tier:
            if host.id in exclude:
                continue
            free = free_mib(host.free_mib, host.total_mib, held.get(host.id))
            largest = max(largest, free)
            if free >= mem_mib and (best is None or free > best[0]):
                best = (free, host)
        if best is not None:
            break
    if best is None:
        if host_id:
            raise no_capacity(f"host {host_id} has {largest} MiB free, {mem_mib} MiB requested")
        raise no_capacity(f"no host has {mem_mib} MiB free (largest: {largest} MiB)")
    return str(best[1].id)


async def check_room(
    session: AsyncSession,
    host_id: str,
    *,
    mem_mib: int,
    now: dt.datetime,
    dead_after_s: float,
    lock_held: bool = False,
) -> None:
    """For a fork, which must run on its source's host: 503 unless that host can take ``mem_mib`` more.
    ``lock_held``: the transaction already took the placement lock (``PLACEMENT_LOCK_COLUMN``)."""
    if not lock_held:
        await placement_lock(session)
    host = (await session.execute(_HOST_ROOM, {"host_id": host_id})).first()
    if host is None or host.status != "active":
        raise no_capacity(f"host {host_id} is not active")
    if (now - as_utc(host.last_heartbeat_at)).total_seconds() > dead_after_s:
        raise no_capacity(f"host {host_id} is not active")
    held = (await held_by_host(session, [host_id])).get(host_id)
    free = free_mib(host.free_mib, host.total_mib, held)
    if free < mem_mib:
        raise no_capacity(f"host {host_id} has {free} MiB free, {mem_mib} MiB requested")


async def _pick_leading(
    session: AsyncSession,
    *,
    mem_mib: int,
    rootfs: str,
    now: dt.datetime,
    dead_after_s: float,
    node_selector: dict[str, str] | None,
    exclude: Collection[str],
    fetchable: bool,
    tally: Tally | None = None,
) -> str | None:
    """:func:`pick_host`'s choice without a ``host_id``, reading only the leading hosts; None when
    it cannot say (nothing fits among the hosts read): the caller then decides over the whole fleet,
    which also words the refusal. Called with the placement lock held.

    The hosts come in order of the most they could have free (``bound``); their held memory is counted
    a few at a time, and the reading stops once the best free memory found is more than the next
    host's bound (or equal, the next one's id coming later: the whole-fleet choice takes the lowest id
    among equals). A host that serves the image always wins over one that would fetch it (``fetchable``).
    """
    best: tuple[int, str] | None = None  # (free, id) of the best host serving the image
    fallback: tuple[int, str] | None = None  # the best one that would fetch it
    waiting: list[tuple[int, str, int, int, bool]] = []  # (bound, id, free_mib, total_mib, serving)

    def done(bound: int, host: str) -> bool:
        return best is not None and (bound < best[0] or (bound == best[0] and host > best[1]))

    async def count(candidates: list[tuple[int, str, int, int, bool]]) -> None:
        nonlocal best, fallback
        held = await _held(session, [c[1] for c in candidates], tally)
        for _, host, reported, total, serving in candidates:
            free = free_mib(reported, total, held.get(host))
            if free < mem_mib:
                continue
            if serving and (best is None or free > best[0] or (free == best[0] and host < best[1])):
                best = (free, host)
            elif not serving and (
                fallback is None or free > fallback[0] or (free == fallback[0] and host < fallback[1])
            ):
                fallback = (free, host)

    offset = 0
    exhausted = False
    while not exhausted:
        limit = FIRST_LEADING if offset == 0 else LEADING_BATCH
        rows = (await session.execute(_LEADING, {"limit": limit, "offset": offset})).all()
        offset += len(rows)
        exhausted = len(rows) < limit
        for row in rows:
            bound = max(min(int(row.free_mib), int(row.total_mib)), 0)
            if done(bound, str(row.id)):
                exhausted = True
                break
            if row.id in exclude or (now - as_utc(row.last_heartbeat_at)).total_seconds() > dead_after_s:
                continue
            if node_selector and not labels_match(row.labels or {}, node_selector):
                continue
            serving = rootfs in (row.rootfses or []) or rootfs in (row.buildable or [])
            if not serving and not fetchable:
                continue
            waiting.append((bound, str(row.id), int(row.free_mib), int(row.total_mib), serving))
            # The first host that qualifies is counted alone: it is most often the choice, and the
            # next host's bound then ends the reading (counted with it, a host of 500 sandboxes next
            # in line cost a 33-sandbox host's placement fifteen times its rows).
            if len(waiting) >= HELD_BATCH or best is None:
                await count(waiting)
                waiting = []
        if not rows:
            break
    if waiting:
        await count(waiting)
    chosen = best or fallback
    return None if chosen is None else chosen[1]
