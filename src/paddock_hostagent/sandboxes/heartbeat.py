"""What this host tells the control plane of its sandboxes on every heartbeat, and the watch that keeps
it true between beats: guests polled for self-signals (spec 12.4), S3 mounts checked, counters and
resource use read."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from paddock_core.heartbeat import ids_digest
from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import RuntimeState
from paddock_hostagent.guest import GuestError
from paddock_hostagent.sandboxes.disks import Disks
from paddock_hostagent.sandboxes.registry import Probe, Registry
from paddock_hostagent.sandboxes.traffic import Traffic

log = get_logger(__name__)

#: How often the agent checks that every mounted disk's s3fs still serves it.
DISK_CHECK_INTERVAL_S = 10.0
#: At most this many guests asked for a self-signal per second, however many sandboxes the host runs:
#: one INFO round trip costs the agent's loop ~0.1 ms, so asking each of 1,000 guests every second took
#: ~11 % of the loop at 1,000 idle sandboxes (docs/performance.md, "Growth at 1,000 live"), time that
#: heartbeats, creates and execs wait behind. Up to 250 sandboxes each guest is still asked every
#: ``guest_poll_interval_s``; at 1,000 every 4 s, which is how late a self-pause may be acted on there.
GUEST_POLLS_PER_S = 250.0


def guest_poll_pause_s(interval_s: float, sandboxes: int, pass_s: float) -> float:
    """How long the watcher rests after a pass over ``sandboxes`` guests that took ``pass_s``: the
    configured interval; no less than a pass (the watcher takes at most half of the loop); and long
    enough that the guests are asked no more than ``GUEST_POLLS_PER_S`` times a second on average."""
    return max(interval_s, pass_s, sandboxes / GUEST_POLLS_PER_S - pass_s)


class Heartbeat:
    def __init__(self, registry: Registry, traffic: Traffic, disks: Disks) -> None:
        self.registry = registry
        self.traffic = traffic
        self.disks = disks
        #: The last summary of the hibernated sandboxes and the ids it was made of.
        self._summary: tuple[frozenset[str], dict[str, Any]] | None = None

    def sandboxes(self, *, hibernated: bool = True) -> list[dict[str, Any]]:
        """Every sandbox as the heartbeat reports it; without the hibernated ones when ``hibernated`` is
        false (a control plane that takes their summary instead: :meth:`hibernated_summary`)."""
        entries = self.registry.entries
        reports = []
        registry = self.registry
        # Live sandboxes as the read before this beat found them (``refresh_usage``), off the loop.
        views = [registry.view(entry, as_read=True) for entry in list(entries.values())]
        if hibernated:
            views += [registry.hibernated_view(entry) for entry in list(registry.hibernated.values())]
        views += [registry.stopped_view(*stopped) for stopped in list(registry.stopped.values())]
        for view in views:
            report = {
                "id": view.id,
                "status": view.status,
                "oom_kills": view.oom_kills,
                "last_activity_at": view.last_activity_at,
            }
            if view.status_reason is not None:
                report["status_reason"] = view.status_reason
            if view.self_request is not None:
                report["self_request"] = view.self_request
            failed = {d.mount_path: d.error for d in view.disks if d.status == "error"}
            if failed:  # a mount this host could not restore: the control plane shows it as it is
                report["disk_errors"] = failed
            usage = self.traffic.usage.get(view.id)
            if usage is not None and view.id in entries:
                report["egress_bytes"] = usage.egress_bytes
                report["ingress_bytes"] = usage.ingress_bytes
                report["capped"] = usage.capped
                report["quota_bytes"] = entries[view.id].record.bandwidth_quota_bytes
                report["egress"] = list(entries[view.id].record.egress)
            reports.append(report)
        return reports

    def hibernated_summary(self) -> dict[str, Any]:
        """How many sandboxes this host holds hibernated, and a digest of their ids
        (:func:`paddock_core.heartbeat.ids_digest`): a control plane that holds the same set skips them
        in the beat, which at 10,000 hibernated sandboxes was a 1.1 MiB report and ~1.3 s of the control
        plane's time per beat, for sandboxes that change only when hibernated or woken."""
        ids = frozenset(self.registry.hibernated)
        if self._summary is None or self._summary[0] != ids:
            self._summary = (ids, {"count": len(ids), "digest": ids_digest(ids)})
        return self._summary[1]

    def egress_audit(self) -> dict[str, Any]:
        """How far this host's record of connection attempts has come (its run and the last attempt's
        number; an empty run without egress enforcement): the control plane asks for attempts only
        when this is past what it has recorded, instead of asking every host every few seconds."""
        egress = self.traffic.egress
        if egress is None:
            return {"epoch": "", "seq": 0}
        return {"epoch": egress.epoch, "seq": egress.last_seq}

    async def refresh_usage(self) -> None:
        """Reads every sandbox's counters (two nft calls) for the next heartbeat, the kernel's new
        connection attempts (one more, at most once a second), and, off the loop, what each uses of its
        memory and disk for admission and whether it still runs and its OOM kills for the beat (a few
        file reads per sandbox)."""
        await self.traffic.read_counters()
        await asyncio.to_thread(self._read_resource_use)
        if self.traffic.egress is not None:
            await self.traffic.egress.read_attempts()

    def _read_resource_use(self) -> None:
        runtime = self.registry.runtime
        for entry in list(self.registry.entries.values()):
            record = entry.record
            entry.mem_used_bytes = runtime.memory_usage_bytes(record)
            entry.disk_used_bytes = runtime.disk_usage_bytes(record)
            alive = runtime.probe(record) != RuntimeState.STOPPED
            entry.probed = Probe(alive, runtime.oom_kills(record))

    async def poll_self_signals(self) -> None:
        """Asks every running sandbox's guest agent for a new self-signal (spec 12.4) and keeps it as
        the sandbox's pending ``self_request`` until a pause or destroy satisfies it."""
        registry = self.registry
        for entry in list(registry.entries.values()):
            if entry.record.state != RuntimeState.RUNNING or entry.lock.locked():
                continue
            if entry.record.id in registry.diskwatch.held:  # frozen: it would only time out
                continue
            try:
                async with asyncio.timeout(0.5):
                    info = await registry.runtime.guest(entry.record).info()
            except (GuestError, TimeoutError):
                continue
            record = entry.record
            if info.self_seq > record.self_seq_seen and info.self_action is not None:
                record.self_seq_seen = info.self_seq
                record.self_request = {
                    "action": info.self_action,
                    "reason": info.self_reason,
                    "seq": info.self_seq,
                }
                registry.records.save(record)
                log.info("sandbox_self_signal", sandbox_id=record.id, action=info.self_action)

    async def watch_guests(self) -> None:
        """Polls the guests for self-signals every ``guest_poll_interval_s``, or, when a pass over every
        sandbox takes longer than that (hundreds of sandboxes on a busy host), after a pause as long as
        the pass: the watcher then takes at most half of the agent's event loop, and heartbeats, execs
        and lifecycle calls keep the other half (at 639 idle sandboxes on the loaded 2-core dev box a
        back-to-back watcher delayed heartbeats until the control plane declared the host dead), and never
        asks more than ``GUEST_POLLS_PER_S`` guests a second on average (:func:`guest_poll_pause_s`)."""
        disks_checked = time.monotonic()
        pass_s = 0.0
        polled = 0
        while True:
            interval_s = self.registry.settings.guest_poll_interval_s
            await asyncio.sleep(guest_poll_pause_s(interval_s, polled, pass_s))
            polled = len(self.registry.entries)
            started = time.monotonic()
            try:
                await self.poll_self_signals()
            except Exception as exc:  # the watcher must outlive any one bad sandbox
                log.warning("self_signal_poll_failed", error=repr(exc))
            pass_s = time.monotonic() - started
            if time.monotonic() - disks_checked >= DISK_CHECK_INTERVAL_S:
                disks_checked = time.monotonic()
                try:
                    await self.disks.check()
                except Exception as exc:  # likewise for any one bad mount
                    log.warning("disk_check_failed", error=repr(exc))
