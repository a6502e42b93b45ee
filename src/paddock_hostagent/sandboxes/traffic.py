"""Egress and bandwidth of this host's sandboxes: the allowlist and budget each boots with, changes to
them, and the counters the heartbeat reports (``egress.py``'s ``EgressService`` keeps them in the
kernel and answers the resolver)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable

from paddock_hostagent import errors
from paddock_hostagent.drivers.base import NetworkHook, RuntimeState, SandboxRecord, SandboxRuntime
from paddock_hostagent.drivers.net.egress_rules import Usage
from paddock_hostagent.egress import Attachment, EgressService
from paddock_hostagent.sandboxes.checks import check_rules, driver_errors
from paddock_hostagent.sandboxes.registry import Entry, Registry
from paddock_hostagent.sandboxes.views import bandwidth_result
from paddock_hostagent.schemas import BandwidthResult


class Traffic:
    def __init__(self, registry: Registry, egress: EgressService | None) -> None:
        self.registry = registry
        self.egress = egress
        self.usage: dict[str, Usage] = {}  # the last counters read for the heartbeat

    async def start(self, records: list[SandboxRecord]) -> None:
        """At the agent's start: the adopted sandboxes' rules and budgets, in the kernel again."""
        if self.egress is not None:
            await self.egress.start([a for a in map(self.attachment, records) if a is not None])

    async def close(self) -> None:
        if self.egress is not None:
            await self.egress.close()

    def attachment(self, record: SandboxRecord) -> Attachment | None:
        veth = self.registry.runtime.host_interface(record)
        if veth is None:
            return None
        return Attachment(record.id, veth, record.ip, list(record.egress), record.bandwidth_quota_bytes)

    def guarding(self, rules: list[str], quota_bytes: int) -> NetworkHook:
        """The hook that installs a new sandbox's allowlist and budget, which the driver runs beside
        the boot (a sandbox that cannot be guarded is undone: the driver fails its boot); one that
        fails half-way removes what it installed."""

        async def guard(record: SandboxRecord) -> None:
            record.egress, record.bandwidth_quota_bytes = list(rules), quota_bytes
            attachment = self.attachment(record)
            if self.egress is None or attachment is None:
                return
            try:
                await self.egress.attach(attachment)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.egress.detach(record.id, attachment.veth)
                raise

        return guard

    async def booted(self, sandbox_id: str, boot: Awaitable[SandboxRecord]) -> SandboxRecord:
        """The record of a create's or fork's boot; when the boot fails, the egress rules its hook
        installed go (the driver has removed the sandbox and let the hook end)."""
        try:
            with driver_errors():
                return await boot
        except BaseException:
            if self.egress is not None:
                with contextlib.suppress(Exception):
                    await self.egress.detach(sandbox_id)
            raise

    async def unguard(self, record: SandboxRecord) -> None:
        """A new sandbox undone after its boot (``Networks.join_at_boot``): its rules go, quietly."""
        attachment = self.attachment(record)
        if self.egress is not None and attachment is not None:
            with contextlib.suppress(Exception):
                await self.egress.detach(record.id, attachment.veth)

    async def release(self, sandbox_id: str, driver: SandboxRuntime, record: SandboxRecord) -> None:
        """A destroyed sandbox's rules and budget go (``driver``: the one that ran it)."""
        if self.egress is not None:
            with driver_errors():
                await self.egress.detach(sandbox_id, driver.host_interface(record))

    async def _egress_entry(self, sandbox_id: str) -> tuple[Entry, EgressService]:
        entry = self.registry.entry(sandbox_id)
        attachment = self.attachment(entry.record)
        if self.egress is None or attachment is None:
            raise errors.BadRequest("this host does not manage egress")
        if self.registry.status(entry) == RuntimeState.STOPPED.value:
            raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
        if not self.egress.guards(sandbox_id):  # never installed (an earlier attempt failed): do it now
            with driver_errors():
                await self.egress.attach(attachment)
        return entry, self.egress

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> list[str]:
        """Replaces the allowlist of a running or paused sandbox at once (new connections follow it)."""
        check_rules(rules)
        entry, egress = await self._egress_entry(sandbox_id)
        async with entry.lock:
            with driver_errors():
                await egress.set_rules(sandbox_id, rules)
            entry.record.egress = list(rules)
            self.registry.records.save(entry.record)
        return list(rules)

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> BandwidthResult:
        entry, egress = await self._egress_entry(sandbox_id)
        async with entry.lock:
            with driver_errors():
                usage = await egress.set_quota(sandbox_id, quota_bytes)
            entry.record.bandwidth_quota_bytes = quota_bytes
            self.registry.records.save(entry.record)
        return bandwidth_result(sandbox_id, quota_bytes, usage)

    async def bandwidth(self, sandbox_id: str) -> BandwidthResult:
        entry, egress = await self._egress_entry(sandbox_id)
        with driver_errors():
            usage = await egress.usage(sandbox_id)
        return bandwidth_result(sandbox_id, entry.record.bandwidth_quota_bytes, usage)

    async def read_counters(self) -> None:
        """Every sandbox's counters (two nft calls), for the next heartbeat."""
        if self.egress is not None:
            self.usage = await self.egress.snapshot()
