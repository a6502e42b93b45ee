"""The reconciler: its loop and its passes — host liveness, sandboxes of dead hosts, billing, idle
auto-pause, auto-hibernate, and destroys, pauses, resumes, boots, snapshots and disk mounts a dead
process left unfinished.

Runs inside the control-plane process; every pass is a short transaction, so several control-plane
processes on PostgreSQL can run it side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, hosts
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.snapshots import CREATING as SNAPSHOT_CREATING
from paddock_controlplane.records.snapshots import Snapshot, SnapshotVolume
from paddock_controlplane.records.states import ON_HOST, SandboxStatus
from paddock_controlplane.records.views import event_data
from paddock_controlplane.resources import billing, disks, networks, snapshots, webhooks
from paddock_controlplane.sandboxes import destruction, lifecycle, suspension
from paddock_controlplane.sandboxes.host_reports import HOST_DEAD_REASON
from paddock_controlplane.sandboxes.transition import settle
from paddock_controlplane.workers.status_notify import status_listener
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import as_utc

log = get_logger("paddock.reconciler")

Pass = Callable[[AsyncSession, Services], Awaitable[None]]


async def host_liveness_pass(session: AsyncSession, services: Services) -> None:
    # Hosts could not heartbeat while this process was down: give them one full period after start
    # before judging, or a control-plane restart would kill every host (and error every sandbox).
    if services.liveness_since is None:
        services.liveness_since = time.monotonic()
    since = services.liveness_since
    if time.monotonic() - since < services.settings.host_dead_after_s:
        return
    died = await hosts.mark_silent_hosts_dead(session, services.clock(), services.settings.host_dead_after_s)
    for host_id in died:
        log.warning("host_dead", host_id=host_id)


async def dead_host_pass(session: AsyncSession, services: Services) -> None:
    """Sandboxes on a ``dead`` host become ``error`` (they can still be destroyed)."""
    dead = select(Host.id).where(Host.status == "dead")
    rows = (
        await session.scalars(select(Sandbox).where(Sandbox.host_id.in_(dead), Sandbox.status.in_(ON_HOST)))
    ).all()
    for sandbox in rows:
        if sandbox.status == SandboxStatus.RUNNING:
            await billing.settle(session, sandbox, services.clock())
        sandbox.status, sandbox.status_reason = SandboxStatus.ERROR, HOST_DEAD_REASON
        log.warning("sandbox_error_host_dead", sandbox_id=sandbox.id, host_id=sandbox.host_id)


def billing_due(services: Services) -> bool:
    return time.monotonic() - services.billing_last >= services.settings.billing_interval_s


def storage_billing_due(services: Services) -> bool:
    return time.monotonic() - services.storage_billing_last >= services.settings.billing_interval_s


async def billing_pass(session: AsyncSession, services: Services) -> None:
    """Every ``billing_interval_s``, sets off a compute billing pass (``billing.billing_pass``) beside
    the rounds: it takes a short transaction per batch of sandboxes, so a round never waits on it, and
    one runs at a time in this process (``billing_last`` is infinite while it runs)."""
    if not billing_due(services):
        return
    services.billing_last = math.inf
    services.tasks.spawn(_bill(services), name="compute billing")


async def _bill(services: Services) -> None:
    try:
        exhausted = await billing.billing_pass(services.sessions, services.clock())
        if exhausted:
            async with transaction(services.sessions) as session:
                await _pause_out_of_credit(session, services, exhausted)
    finally:
        services.billing_last = time.monotonic()


async def _pause_out_of_credit(session: AsyncSession, services: Services, exhausted: set[str]) -> None:
    """Pauses the running sandboxes of the accounts a charge has just emptied."""
    if not exhausted:
        return
    running = (
        await session.scalars(
            select(Sandbox).where(Sandbox.user_id.in_(exhausted), Sandbox.status == SandboxStatus.RUNNING)
        )
    ).all()
    for sandbox in running:
        suspension.pause_later(services, sandbox, "credit")


async def storage_billing_pass(session: AsyncSession, services: Services) -> None:
    """Charges kept snapshots and volumes, at the compute pass's interval; an account it empties has its
    running sandboxes paused, as the compute pass does."""
    if not storage_billing_due(services):
        return
    services.storage_billing_last = time.monotonic()
    exhausted = await billing.storage_pass(session, services.clock())
    await _pause_out_of_credit(session, services, exhausted)


def idle_long_enough(sandbox: Any, now_s: float, activity: dict[str, float]) -> bool:
    """Whether ``sandbox`` (a ``Sandbox``, or a row of its columns) has been idle for its
    ``auto_pause_after_seconds``: since the latest of its recorded activity, resume and start, and the
    activity this process saw (``activity``, by id) and has not written yet."""
    marks = [
        as_utc(t).timestamp()
        for t in (sandbox.last_activity_at, sandbox.last_resumed_at, sandbox.running_at)
        if t
    ]
    if sandbox.id in activity:
        marks.append(activity[sandbox.id])
    last = max(marks) if marks else now_s
    return now_s - last >= int(sandbox.auto_pause_after_seconds or 0)


async def idle_pass(session: AsyncSession, services: Services) -> None:
    """A running sandbox idle for its ``auto_pause_after_seconds`` is paused, or hibernated when its
    ``on_idle`` is ``hibernate``.

    Runs every second over every running sandbox that asked for it, and almost always finds none
    idle: it reads the seven columns it decides on, not ORM objects (a thousand rows cost ~24 ms a
    pass as objects, ~6 ms as plain rows; ``bench/idle_pass.py``)."""
    now_s = services.clock().timestamp()
    activity = services.activity.last_seen_s
    inflight = services.activity.inflight
    rows = await session.execute(
        select(
            Sandbox.id,
            Sandbox.user_id,
            Sandbox.auto_pause_after_seconds,
            Sandbox.on_idle,
            Sandbox.last_activity_at,
            Sandbox.last_resumed_at,
            Sandbox.running_at,
        ).where(Sandbox.status == SandboxStatus.RUNNING, Sandbox.auto_pause_after_seconds.is_not(None))
    )
    for sandbox in rows:
        if inflight.get(sandbox.id) or not idle_long_enough(sandbox, now_s, activity):
            continue
        target = suspension.Target(sandbox.id, sandbox.user_id)
        if sandbox.on_idle == "hibernate":  # its host keeps only its disk (docs/hibernation.md)
            suspension.hibernate_later(services, target, reason="idle", expect=SandboxStatus.RUNNING)
        else:
            suspension.pause_later(services, target, "idle")


async def auto_hibernate_pass(session: AsyncSession, services: Services) -> None:
    """A frozen pause that asked for it (``hibernate_after_seconds``, docs/hibernation.md) is hibernated
    once the sandbox has stayed paused that long: its host keeps only its disk from then on. Plain
    columns, as in ``idle_pass``: it runs every second over every such pause."""
    now = services.clock()
    rows = await session.execute(
        select(Sandbox.id, Sandbox.user_id, Sandbox.paused_at, Sandbox.auto_hibernate_after_seconds).where(
            Sandbox.status == SandboxStatus.PAUSED,
            Sandbox.auto_hibernate_after_seconds.is_not(None),
            Sandbox.hibernated.is_(False),
        )
    )
    for sandbox in rows:
        paused_at = sandbox.paused_at
        if paused_at is None:
            continue
        if (now - as_utc(paused_at)).total_seconds() >= int(sandbox.auto_hibernate_after_seconds or 0):
            suspension.hibernate_later(services, suspension.Target(sandbox.id, sandbox.user_id))


#: Seconds a row may stay ``pausing``/``resuming`` before it counts as left by a dead process: a live
#: pause or resume takes milliseconds, and its host call times out well before this.
ORPHAN_AFTER_S = 20.0


class OrphanedTransitions:
    """Reconciler pass: a pause or resume whose control-plane process died between its two
    transactions (killed, or a machine lost) leaves the row ``pausing``/``resuming``, which no request
    can move on. Once this process has seen a row there for ``ORPHAN_AFTER_S``, it drives the host to
    the state the operation wanted (pause and resume are idempotent there: a host that already did it
    answers "is paused, not running" / "is running, not paused") and records the outcome with its
    event, exactly as the operation would have. Two control planes may both try; ``settle`` records
    only while the row is still in that status, so one outcome and one event are written. The pause's
    original reason is not stored, so the event says ``api``; billing stops at the moment the row was
    first seen orphaned, not later.
    """

    def __init__(self) -> None:
        self.first_seen: dict[str, tuple[str, dt.datetime]] = {}
        self.driving: set[str] = set()

    async def __call__(self, session: AsyncSession, services: Services) -> None:
        now = services.clock()
        rows = (
            await session.scalars(
                select(Sandbox).where(Sandbox.status.in_((SandboxStatus.PAUSING, SandboxStatus.RESUMING)))
            )
        ).all()
        seen: dict[str, tuple[str, dt.datetime]] = {}
        for sandbox in rows:
            status, since = self.first_seen.get(sandbox.id, (sandbox.status, now))
            if status != sandbox.status:
                since = now
            seen[sandbox.id] = (sandbox.status, since)
            orphaned = (now - since).total_seconds() >= ORPHAN_AFTER_S
            if orphaned and sandbox.id not in self.driving and sandbox.host_id:
                self.driving.add(sandbox.id)
                services.tasks.spawn(
                    self._drive(services, sandbox, sandbox.host_id, since),
                    name=f"orphaned {sandbox.status} {sandbox.id}",
                )
        self.first_seen = seen

    async def _drive(self, services: Services, sandbox: Sandbox, host_id: str, since: dt.datetime) -> None:
        sandbox_id, status, disk_mib = sandbox.id, sandbox.status, sandbox.disk_mib
        pausing = status == SandboxStatus.PAUSING
        done_already = "is paused, not running" if pausing else "is running, not paused"

        async def drive_host() -> hostlink.Held | None:
            link = await hostlink.for_host(services, host_id)
            # A hibernation its agent died in is either whole (the host holds it hibernated) or undone.
            held = await link.inspect(sandbox_id)
            if held is not None and held.hibernated:
                if pausing:
                    return held
                woken = await link.wake(sandbox_id)
                return hostlink.Held(status="running", ip=woken.ip)
            try:
                if pausing:
                    await link.pause(sandbox_id)
                else:
                    await link.resume(sandbox_id, disk_mib=disk_mib)
            except hostlink.HostError as exc:
                if not str(exc).endswith(done_already):
                    raise
            if pausing:
                return None
            # A wake its control plane died in gave the sandbox a new address: the host's is recorded.
            return await link.inspect(sandbox_id)

        async def paused(session: AsyncSession, row: Sandbox, held: hostlink.Held | None) -> None:
            await billing.settle(session, row, since)
            row.status, row.paused_at = SandboxStatus.PAUSED, since
            extra = {}
            if held is not None and held.hibernated:
                row.hibernated, extra["hibernated"] = True, True
            data = event_data(row, reason="api", **extra)
            await webhooks.emit(session, user_id=row.user_id, action="sandbox.pause", data=data)

        async def running(session: AsyncSession, row: Sandbox, held: hostlink.Held | None) -> None:
            now = services.clock()
            row.status, row.running_at, row.last_resumed_at = SandboxStatus.RUNNING, now, now
            row.billed_until, row.last_activity_at = now, now
            if held is not None:  # as the host holds it (woken from hibernation: a new address)
                row.ip, row.hibernated = held.ip or row.ip, False
            await webhooks.emit(session, user_id=row.user_id, action="sandbox.resume", data=event_data(row))

        try:
            outcome = await settle(
                services,
                sandbox_id,
                drive_host,
                expect=(status,),
                on_success=paused if pausing else running,
            )
            if outcome.recorded:
                log.warning("orphaned_transition_settled", sandbox_id=sandbox_id, status=status)
        except Exception as exc:  # tried again on a later pass
            log.warning("orphaned_transition_failed", sandbox_id=sandbox_id, error=str(exc))
        finally:
            self.driving.discard(sandbox_id)


#: Seconds a template's image may take to reach a host before its boot starts: the host agent client's
#: timeout for an image fetch (``HostAgentClient.fetch_image``), which runs outside the boot deadline.
IMAGE_FETCH_BOUND_S = 1800.0
#: Why a boot its control plane never finished ends ``failed``; the user reads it in ``status_reason``.
ORPHANED_BOOT_REASON = "the control plane handling this create stopped before the sandbox booted"


class OrphanedBoots:
    """Reconciler pass: a create (``creating``) or a fork child (``forking``) whose control-plane
    process died before the host answered stays there, since a boot's outcome is only ever recorded
    by the process that asked. A live process ends every boot within its deadline (``boot_timeout_s``,
    ``vm_boot_timeout_s`` on a VM host; a template's image fetch comes first and has its own bound), so
    a row older than that plus ``ORPHAN_AFTER_S`` (from its ``created_at``, so a control plane started
    since sees it too) has no one left to record it. Its host is asked what became of it:

    - it holds the sandbox running or paused (the host finished the boot after the asker died): the
      sandbox is adopted in that status, as the boot would have recorded it (its address, its
      memberships active, billing from now; a create's ``sandbox.create`` event, since a fork's child
      had its ``sandbox.fork`` when it was answered), and its egress rules are sent again, since a PUT
      during the boot was only stored;
    - it does not hold it, or holds it stopped: it ends ``failed`` with :data:`ORPHANED_BOOT_REASON`, as
      a failed boot does (no event, nothing billed; ``failed`` counts toward no concurrent cap), and
      whatever the host still has of it is destroyed there;
    - the host does not answer: the row is left for a later pass (a host that stays silent is marked
      dead, and its sandboxes ``error``, by the liveness passes).

    Two control planes may both ask: the outcome is recorded only while the row is still in the status
    seen (``settle``), so one outcome and at most one event are written.
    """

    def __init__(self) -> None:
        self.asking: set[str] = set()

    async def __call__(self, session: AsyncSession, services: Services) -> None:
        now = services.clock()
        settings = services.settings
        deadline_s = settings.boot_timeout_s + ORPHAN_AFTER_S
        vm_longer_s = max(0.0, settings.vm_boot_timeout_s - settings.boot_timeout_s)
        rows = (
            await session.scalars(
                select(Sandbox).where(Sandbox.status.in_((SandboxStatus.CREATING, SandboxStatus.FORKING)))
            )
        ).all()
        for sandbox in rows:
            bound_s = deadline_s
            if sandbox.status == SandboxStatus.CREATING and sandbox.rootfs.startswith("tpl_"):
                bound_s += IMAGE_FETCH_BOUND_S
            age_s = (now - as_utc(sandbox.created_at)).total_seconds()
            if age_s < bound_s or sandbox.id in self.asking:
                continue
            if age_s < bound_s + vm_longer_s and sandbox.host_id is not None:
                host = await session.get(Host, sandbox.host_id)  # read only for a row past the short bound
                if hosts.runtime_of(host) in hosts.VM_RUNTIMES:
                    continue
            self.asking.add(sandbox.id)
            services.tasks.spawn(
                self._settle(services, sandbox.id, sandbox.status, sandbox.host_id),
                name=f"orphaned {sandbox.status} {sandbox.id}",
            )

    async def _settle(self, services: Services, sandbox_id: str, status: str, host_id: str | None) -> None:
        try:
            held = await self._ask(services, sandbox_id, host_id)
            if held is not None and held.status in ("running", "paused"):
                await self._adopt(services, sandbox_id, status, held)
            else:
                await self._fail(services, sandbox_id, status, host_id)
        except hostlink.HostError as exc:  # asked again on a later pass
            log.warning("orphaned_boot_unanswered", sandbox_id=sandbox_id, host_id=host_id, error=str(exc))
        except Exception as exc:
            log.error("orphaned_boot_failed_to_settle", sandbox_id=sandbox_id, exc_info=exc)
        finally:
            self.asking.discard(sandbox_id)

    @staticmethod
    async def _ask(services: Services, sandbox_id: str, host_id: str | None) -> hostlink.Held | None:
        if host_id is None:
            return None
        return await (await hostlink.for_host(services, host_id)).inspect(sandbox_id)

    @staticmethod
    async def _adopt(services: Services, sandbox_id: str, status: str, held: hostlink.Held) -> None:
        async def booted(session: AsyncSession, row: Sandbox, _: None) -> None:
            now = services.clock()
            row.ip = held.ip
            networks.activate_all(row)
            if held.status == "paused":
                row.status, row.paused_at = SandboxStatus.PAUSED, now
            else:
                row.status, row.running_at = SandboxStatus.RUNNING, now
                row.billed_until, row.last_activity_at = now, now
            if status == SandboxStatus.CREATING:
                await webhooks.emit(
                    session, user_id=row.user_id, action="sandbox.create", data=event_data(row)
                )

        outcome = await settle(services, sandbox_id, _nothing, expect=(status,), on_success=booted)
        if not outcome.recorded or outcome.row is None:
            return
        row = outcome.row
        log.warning("orphaned_boot_adopted", sandbox_id=sandbox_id, host_id=row.host_id, status=row.status)
        if row.egress and row.host_id:
            try:
                await (await hostlink.for_host(services, row.host_id)).set_egress(row.id, list(row.egress))
            except (hostlink.HostError, hostlink.SandboxGoneError) as exc:
                log.warning("egress_resend_failed", sandbox_id=row.id, error=str(exc))

    @staticmethod
    async def _fail(services: Services, sandbox_id: str, status: str, host_id: str | None) -> None:
        async def failed(session: AsyncSession, row: Sandbox, _: None) -> None:
            row.status, row.status_reason = SandboxStatus.FAILED, ORPHANED_BOOT_REASON
            await networks.drop_memberships(session, sandbox_id)
            await disks.drop_attachments(session, sandbox_id)

        outcome = await settle(services, sandbox_id, _nothing, expect=(status,), on_success=failed)
        if not outcome.recorded:
            return
        log.warning("orphaned_boot_failed", sandbox_id=sandbox_id, host_id=host_id)
        if host_id:
            await destruction.forget_on_host(services, host_id, sandbox_id)


def snapshot_orphaned_after_s(volume_copies: int) -> float:
    """How old a ``creating`` snapshot row must be before no live process can still record it. The
    create makes its host calls one after another, each bounded by the client's create timeout
    (``hostlink.COPY_CALL_BOUND_S``, 905 s): one copy per volume it keeps (``include_volumes``), then
    the disk's; then it records the answer in one short transaction. So a row past all its calls'
    bounds, with ``ORPHAN_AFTER_S`` for that transaction and the clocks of two control planes, has no
    one left to record it (925 s without volumes, 1,830 s with one)."""
    return (1 + volume_copies) * hostlink.COPY_CALL_BOUND_S + ORPHAN_AFTER_S


class OrphanedSnapshots:
    """Reconciler pass: a snapshot (``POST /v1/sandboxes/{id}/snapshots``) whose control-plane process
    died between writing its row ``creating`` and recording its host's answer stays ``creating``: listed,
    counted against the plan's snapshot cap, never bootable, and its ``DELETE`` a 409. Once the row is
    older than :func:`snapshot_orphaned_after_s` (from its ``created_at``, so a control plane started
    since sees it too), its host is asked (``snapshots.settle_orphaned``): a snapshot it holds whole
    becomes ``ready`` with its size and ``snapshot.create``; otherwise what the host has of it is removed
    there and the row goes, as a failed create's. A host that does not answer is asked on a later pass;
    one gone (removed, or ``dead`` and silent for ``snapshots.SNAPSHOT_HOST_GONE_S``) is not asked, and
    the row goes.
    Two control planes may both ask: the outcome is written under the row's lock only while it is still
    ``creating``, so one outcome and at most one event are recorded.
    """

    def __init__(self) -> None:
        self.asking: set[str] = set()
        self.scanned_at: dt.datetime | None = None

    def due(self, services: Services) -> bool:
        # A row waits a quarter of an hour at least: looking every ORPHAN_AFTER_S is soon enough, and
        # spares a table of many snapshots a scan every round.
        return (
            self.scanned_at is None or (services.clock() - self.scanned_at).total_seconds() >= ORPHAN_AFTER_S
        )

    async def __call__(self, session: AsyncSession, services: Services) -> None:
        if not self.due(services):
            return
        now = services.clock()
        self.scanned_at = now
        copies = (
            select(func.count())
            .select_from(SnapshotVolume)
            .where(SnapshotVolume.snapshot_id == Snapshot.id)
            .scalar_subquery()
        )
        rows = (
            await session.execute(
                select(Snapshot.id, Snapshot.created_at, copies).where(Snapshot.status == SNAPSHOT_CREATING)
            )
        ).all()
        for snapshot_id, created_at, volume_copies in rows:
            age_s = (now - as_utc(created_at)).total_seconds()
            if age_s < snapshot_orphaned_after_s(int(volume_copies or 0)) or snapshot_id in self.asking:
                continue
            self.asking.add(snapshot_id)
            services.tasks.spawn(self._settle(services, snapshot_id), name=f"orphaned snapshot {snapshot_id}")

    async def _settle(self, services: Services, snapshot_id: str) -> None:
        try:
            await snapshots.settle_orphaned(services, snapshot_id)
        except hostlink.HostError as exc:  # asked again on a later pass
            log.warning("orphaned_snapshot_unanswered", snapshot_id=snapshot_id, error=str(exc))
        except Exception as exc:
            log.error("orphaned_snapshot_failed_to_settle", snapshot_id=snapshot_id, exc_info=exc)
        finally:
            self.asking.discard(snapshot_id)


async def _nothing() -> None:
    """The host call of an outcome already learnt (``settle`` records it in its second transaction)."""


#: Every pass, in the order a round runs them.
PASSES: list[Pass] = [
    host_liveness_pass,
    dead_host_pass,
    billing_pass,
    storage_billing_pass,
    idle_pass,
    lifecycle.expire_pass,
    destruction.settle_stuck,
    disks.settle_pending,
    OrphanedTransitions(),
    auto_hibernate_pass,
    OrphanedBoots(),
    OrphanedSnapshots(),
]


#: Passes that mostly have nothing to do, and the cheap check of whether they have this round, made
#: before their transaction is opened (each pass also checks, for whoever runs it alone).
DUE: dict[Pass, Callable[[Services], bool]] = {
    billing_pass: billing_due,
    storage_billing_pass: storage_billing_due,
}


def due(step: Pass, services: Services) -> bool:
    if isinstance(step, OrphanedSnapshots):
        return step.due(services)
    check = DUE.get(step)
    return check is None or check(services)


class Reconciler:
    """The passes' loop. It also runs the status listener (status_notify.py), which folds other
    control planes' committed status changes into this process's long polls."""

    def __init__(self, services: Services, passes: list[Pass]) -> None:
        self.services = services
        self.passes = passes
        self._task: asyncio.Task[None] | None = None
        self.listener = status_listener(services.settings.database_url, services.status_watch)

    async def run_once(self) -> None:
        for step in self.passes:
            if not due(step, self.services):
                continue  # no transaction opened for nothing: 3 of an idle round's 12 were
            async with self.services.reconciling, transaction(self.services.sessions) as session:
                await step(session, self.services)
        self.services.mark_reconciled()

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # keep the loop alive; readiness shows the staleness
                log.error("reconcile_failed", exc_info=exc)
            await asyncio.sleep(self.services.settings.reconcile_interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="reconciler")
        self.listener.start()

    async def stop(self) -> None:
        await self.listener.stop()
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
