"""A stand-in for the host agent's runtime driver (``drivers/base.py``'s ``SandboxRuntime``) that
creates no containers: the fleet simulation's unit seam (``bench/fleet_sim.py``).

Everything above the driver is the real host agent (its registry, admission, lifecycle, heartbeat,
registrar and HTTP app), so the control plane talks to 200 agents as it would to 200 machines; what
this driver does not do is boot anything. A sandbox it "creates" is a record in the running state
with an address from its own range; pause, resume and destroy change the record's state; its guest
never answers (``guest`` raises :class:`GuestError`, which the agent treats as a guest that is not up).
The real drivers are covered by tests/hostagent and tests/isolation.
"""

from __future__ import annotations

import ipaddress
import itertools

from paddock_hostagent.drivers.base import (
    NetworkHook,
    RuntimeState,
    SandboxRecord,
    SandboxRuntime,
    SandboxSpec,
)
from paddock_hostagent.guest import GuestClient
from paddock_hostagent.guest.protocol import GuestError

MIB = 1 << 20


class StandInRuntime(SandboxRuntime):
    """Sandboxes as records only. Each one reports its whole memory limit as used, so the agent's
    admission counts none of it as still to grow into (the machine's real memory is not what these
    simulated hosts hold)."""

    name = "crun"

    def __init__(self, subnet: str) -> None:
        network = ipaddress.ip_network(subnet)
        self._addresses = (str(address) for address in itertools.islice(network.hosts(), 2, None))
        self.states: dict[str, RuntimeState] = {}

    def address(self) -> str:
        """The next address of this host's range."""
        return next(self._addresses)

    async def start(self, records: list[SandboxRecord]) -> dict[str, RuntimeState]:
        for record in records:
            self.states[record.id] = record.state
        return dict(self.states)

    async def close(self) -> None:
        return None

    async def create(
        self, spec: SandboxSpec, *, start_paused: bool = False, on_network: NetworkHook | None = None
    ) -> SandboxRecord:
        record = SandboxRecord.running(spec, ip=self.address(), driver=self.name, driver_state={})
        if on_network is not None:
            await on_network(record)
        if start_paused:
            record.state = RuntimeState.PAUSED
        self.states[record.id] = record.state
        return record

    async def fork(
        self,
        source: SandboxRecord,
        spec: SandboxSpec,
        *,
        start_paused: bool = False,
        on_network: NetworkHook | None = None,
    ) -> SandboxRecord:
        record = await self.create(spec, start_paused=start_paused, on_network=on_network)
        record.forked_from = source.id
        return record

    async def pause(self, record: SandboxRecord) -> None:
        self.states[record.id] = RuntimeState.PAUSED

    async def resume(self, record: SandboxRecord) -> None:
        self.states[record.id] = RuntimeState.RUNNING

    async def resize(self, record: SandboxRecord, disk_mib: int) -> None:
        return None

    async def destroy(self, record: SandboxRecord) -> None:
        self.states.pop(record.id, None)

    def probe(self, record: SandboxRecord) -> RuntimeState:
        return self.states.get(record.id, RuntimeState.STOPPED)

    def guest(self, record: SandboxRecord) -> GuestClient:
        raise GuestError(f"sandbox {record.id} is simulated: it has no guest agent")

    def oom_kills(self, record: SandboxRecord) -> int:
        return 0

    def memory_usage_bytes(self, record: SandboxRecord) -> int:
        return record.mem_mib * MIB
