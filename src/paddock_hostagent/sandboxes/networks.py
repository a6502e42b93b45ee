"""Private networks of this host's sandboxes: joining a network's bridge at boot or later, leaving it,
and every port back on its bridge after an agent restart (``drivers/net/bridges.py`` makes them)."""

from __future__ import annotations

import asyncio
import contextlib

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import PRIVATE_NETWORKS, DriverError, RuntimeState, SandboxRecord
from paddock_hostagent.drivers.net.bridges import BridgeNetworks, Membership
from paddock_hostagent.sandboxes.checks import driver_errors
from paddock_hostagent.sandboxes.registry import Registry
from paddock_hostagent.sandboxes.traffic import Traffic
from paddock_hostagent.sandboxes.views import public
from paddock_hostagent.schemas import NetworkAttachBody, NetworkAttachment

log = get_logger(__name__)


class Networks:
    def __init__(self, registry: Registry, bridges: BridgeNetworks | None, traffic: Traffic) -> None:
        self.registry = registry
        self.bridges = bridges
        self.traffic = traffic

    def _require_bridges(self) -> BridgeNetworks:
        if self.bridges is None:
            raise errors.BadRequest("private networks are not enabled on this host")
        return self.bridges

    async def attach(self, sandbox_id: str, body: NetworkAttachBody) -> NetworkAttachment:
        """Joins (or re-joins, idempotently) a running or paused sandbox to a network's bridge."""
        bridges = self._require_bridges()
        runtime = self.registry.runtime
        entry = self.registry.entry(sandbox_id)
        async with entry.lock:
            if self.registry.status(entry) == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            record = entry.record
            with driver_errors():
                runtime.refuse(PRIVATE_NETWORKS, record)
            ip = str(body.ip)
            current = [Membership.from_json(m) for m in record.networks]
            existing = next((m for m in current if m.network_id == body.network_id), None)
            if existing is not None and (existing.ip, existing.prefixlen) == (ip, body.prefixlen):
                with driver_errors():
                    await asyncio.to_thread(bridges.ensure, runtime.network_namespace(record), existing)
                return NetworkAttachment(**public(existing.to_json()))
            if existing is not None:  # re-addressed: rebuild the port
                await asyncio.to_thread(bridges.detach, existing)
                current.remove(existing)
            with driver_errors():
                member = await asyncio.to_thread(
                    bridges.attach,
                    runtime.network_namespace(record),
                    record.id,
                    body.network_id,
                    ip,
                    body.prefixlen,
                    {m.ifname for m in current},
                )
            record.networks = [m.to_json() for m in current] + [member.to_json()]
            self.registry.records.save(record)
        log.info("network_attached", sandbox_id=sandbox_id, network_id=body.network_id, ifname=member.ifname)
        return NetworkAttachment(**public(member.to_json()))

    async def join_at_boot(self, record: SandboxRecord, memberships: list[NetworkAttachBody]) -> None:
        """Joins a new sandbox to the networks its create or fork named (one host call per boot); a
        sandbox that cannot join them all is undone, like one that cannot be guarded."""
        if not memberships:
            return
        runtime = self.registry.runtime
        joined: list[Membership] = []
        try:
            bridges = self._require_bridges()
            with driver_errors():
                runtime.refuse(PRIVATE_NETWORKS, record)
                netns = runtime.network_namespace(record)
            for body in memberships:
                with driver_errors():
                    member = await asyncio.to_thread(
                        bridges.attach,
                        netns,
                        record.id,
                        body.network_id,
                        str(body.ip),
                        body.prefixlen,
                        {m.ifname for m in joined},
                    )
                joined.append(member)
        except BaseException:
            for member in joined:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(bridges.detach, member)
            await self.traffic.unguard(record)
            with contextlib.suppress(Exception):
                await runtime.destroy(record)
            raise
        record.networks = [m.to_json() for m in joined]
        log.info("networks_joined", sandbox_id=record.id, networks=[m.network_id for m in joined])

    async def detach(self, sandbox_id: str, network_id: str) -> None:
        """Removes the sandbox's interface on the network; not a member is a no-op."""
        entry = self.registry.entry(sandbox_id)
        async with entry.lock:
            record = entry.record
            members = [Membership.from_json(m) for m in record.networks]
            leaving = [m for m in members if m.network_id == network_id]
            if not leaving:
                return
            bridges = self._require_bridges()
            for member in leaving:
                await asyncio.to_thread(bridges.detach, member)
            record.networks = [m.to_json() for m in members if m.network_id != network_id]
            self.registry.records.save(record)
        log.info("network_detached", sandbox_id=sandbox_id, network_id=network_id)

    async def leave_all(self, record: SandboxRecord) -> None:
        if self.bridges is None or not record.networks:
            return
        for data in record.networks:
            with contextlib.suppress(Exception):  # destroy must go on; prune() catches the rest
                await asyncio.to_thread(self.bridges.detach, Membership.from_json(data))

    async def restore(self, record: SandboxRecord) -> None:
        """After an agent restart: every recorded membership has its port on its bridge again."""
        if self.bridges is None or not record.networks:
            return
        netns = self.registry.runtime.network_namespace(record)
        for data in record.networks:
            member = Membership.from_json(data)
            try:
                if await asyncio.to_thread(self.bridges.ensure, netns, member):
                    log.info("network_restored", sandbox_id=record.id, network_id=member.network_id)
            except DriverError as exc:
                log.warning("network_restore_failed", sandbox_id=record.id, error=str(exc))

    async def prune(self, held: list[SandboxRecord]) -> None:
        """At start: bridges no held sandbox is a member of go."""
        if self.bridges is None:
            return
        keep = {str(m["bridge"]) for record in held for m in record.networks}
        for bridge in await asyncio.to_thread(self.bridges.prune, keep):
            log.info("removed_orphan_bridge", bridge=bridge)
