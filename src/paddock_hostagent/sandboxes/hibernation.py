"""Hibernation (issue #34, docs/hibernation.md): a pause that frees the host. A hibernated sandbox keeps
only its disk, a clone in the disk store (``drivers/runtime/oci.py``), and its record; its processes,
cgroup, slot, loop device, netns, address, egress rules, bridge ports and s3fs mounts go. A wake boots
the kept disk as a sandbox boots from a snapshot, on a fresh slot (its address may change), and puts
its private networks, S3 disks and volumes back; its processes start afresh.

On the VM tier (``drivers/vm/qemu.py``) a hibernated sandbox keeps its memory too: QEMU's migration
stream in a file beside a copy of its overlay; its QEMU, slot, tap, namespace and address go. A wake
restores the VM from them with its own MAC, hostname and (when still free) address, and its processes
go on where they stopped.

Crash safety: the disk is copied under ``.partial-<id>`` and renamed when whole, while the sandbox is
frozen; saving the record that says hibernated is the commit. An agent killed before it leaves the
sandbox as it was (the next agent thaws it and drops the copy); killed after it, the sandbox is
hibernated and the next agent takes down whatever still ran of it (``OciRuntime.settle_hibernations``).
A wake commits by saving the record of the new sandbox; killed before that, it is still hibernated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import (
    RuntimeState,
    SandboxRecord,
    SandboxSpec,
    TierUnsupportedError,
)
from paddock_hostagent.drivers.runtime.oci import HIBERNATE, HIBERNATION, TEARDOWN, OciRuntime, hibernation_of
from paddock_hostagent.drivers.storage.s3mounts import S3Mount
from paddock_hostagent.drivers.storage.volumes import VolumeMissingError, place_in
from paddock_hostagent.drivers.system.commands import run
from paddock_hostagent.drivers.vm import qemu
from paddock_hostagent.drivers.vm.qemu import QemuRuntime
from paddock_hostagent.execution import PAUSED_MESSAGE
from paddock_hostagent.sandboxes.checks import driver_errors
from paddock_hostagent.sandboxes.disks import Disks
from paddock_hostagent.sandboxes.networks import Networks
from paddock_hostagent.sandboxes.registry import Entry, Registry
from paddock_hostagent.sandboxes.traffic import Traffic
from paddock_hostagent.sandboxes.volumes import Volumes
from paddock_hostagent.schemas import CreateSandboxResult

log = get_logger(__name__)

_IFNAME = re.compile(r"^eth[0-9]{1,3}$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")

#: The runtimes that hibernate; the VM driver's record keys are the OCI driver's.
HibernatingRuntime = OciRuntime | QemuRuntime
assert (qemu.HIBERNATION, qemu.TEARDOWN, qemu.HIBERNATE) == (HIBERNATION, TEARDOWN, HIBERNATE)


class Hibernation:
    def __init__(
        self,
        registry: Registry,
        traffic: Traffic,
        networks: Networks,
        disks: Disks,
        volumes: Volumes | None,
        rootfs: Callable[[str], Awaitable[Path]],
    ) -> None:
        self.registry = registry
        self.traffic = traffic
        self.networks = networks
        self.disks = disks
        self.volumes = volumes
        self.rootfs = rootfs

    def _runtime(self) -> HibernatingRuntime:
        runtime = self.registry.runtime
        if not isinstance(runtime, (OciRuntime, QemuRuntime)):
            with driver_errors():
                raise TierUnsupportedError(self.registry.runtime_label, HIBERNATE, "pause keeps it frozen")
        assert isinstance(runtime, (OciRuntime, QemuRuntime))
        return runtime

    # -- hibernate ------------------------------------------------------------------------------

    async def hibernate(self, sandbox_id: str) -> str:
        """Hibernates a running or frozen sandbox; one hibernated already answers as it is."""
        registry = self.registry
        if sandbox_id in registry.hibernated:
            return RuntimeState.PAUSED.value
        runtime = self._runtime()
        entry = registry.entry(sandbox_id)
        async with entry.lock:
            if registry.entries.get(sandbox_id) is not entry:
                if sandbox_id in registry.hibernated:
                    return RuntimeState.PAUSED.value
                raise errors.SandboxNotFound(f"sandbox {sandbox_id} not found on this host")
            status = registry.status(entry)
            if status == RuntimeState.STOPPED.value:
                raise errors.InvalidState(f"sandbox {sandbox_id} has stopped")
            started = time.monotonic()
            with driver_errors():
                runtime.refuse_hibernation(entry.record)
                state = await runtime.hibernate(entry.record)
            copied = time.monotonic()
            running = entry.record
            try:
                # Its private networks' interfaces keep their MAC addresses through the wake: its peers'
                # neighbour caches stay right (a new MAC went unanswered until theirs expired).
                state[HIBERNATION]["macs"] = await self._network_macs(runtime, running)
                kept = dataclasses.replace(
                    running,
                    driver_state=state,
                    state=RuntimeState.PAUSED,
                    self_request=None,
                    networks=list(running.networks),
                    disks=list(running.disks),
                    egress=list(running.egress),
                )
                registry.records.save(kept, durable=True)  # the commit: from here it is hibernated
                committed = time.monotonic()
            except BaseException:
                if isinstance(runtime, QemuRuntime):
                    await runtime.abandon_hibernation(running)
                else:
                    runtime.abandon_hibernation(running)
                raise
            # The lock stays the sandbox's: a wake or destroy waits for the teardown below.
            registry.hibernated[sandbox_id] = Entry(kept, lock=entry.lock)
            del registry.entries[sandbox_id]
            self.traffic.usage.pop(sandbox_id, None)
            try:
                await self._take_down(running)
                kept.driver_state = {HIBERNATION: state[HIBERNATION]}
                registry.records.save(kept)
            except Exception as exc:  # the next agent's start takes down what is left (``teardown``)
                log.error("hibernation_teardown_failed", sandbox_id=sandbox_id, error=repr(exc))
        await entry.end_exchanges(PAUSED_MESSAGE)
        log.info(
            "sandbox_hibernated",
            sandbox_id=sandbox_id,
            copy_ms=round((copied - started) * 1000, 3),
            commit_ms=round((committed - copied) * 1000, 3),
            teardown_ms=round((time.monotonic() - committed) * 1000, 3),
            hibernate_ms=round((time.monotonic() - started) * 1000, 3),
        )
        return RuntimeState.PAUSED.value

    async def _take_down(self, running: SandboxRecord) -> None:
        """What ran of a sandbox now hibernated: its bridge ports, egress rules, s3fs mounts (their
        credentials stay for the wake), then its container and slot."""
        runtime = self._runtime()
        await self.networks.leave_all(running)
        await self.traffic.release(running.id, runtime, running)
        mounter = self.disks.mounter
        if mounter is not None:
            for data in running.disks:
                mount = S3Mount.from_json(data)
                if not mount.at_boot:
                    await mounter._stop_host(mounter._mount_point(running.id, mount))
        teardown = running.driver_state
        await runtime.release_hibernated(running.id, teardown)

    # -- wake -----------------------------------------------------------------------------------

    async def wake(self, sandbox_id: str) -> CreateSandboxResult:
        """Boots a hibernated sandbox again from its kept disk; one running already answers as it is."""
        registry = self.registry
        entry = registry.hibernated.get(sandbox_id)
        if entry is None:
            return self._woken(registry.entry(sandbox_id))
        runtime = self._runtime()
        async with entry.lock:
            if registry.hibernated.get(sandbox_id) is not entry:
                return self._woken(registry.entry(sandbox_id))
            kept = entry.record
            if hibernation_of(kept) is None or TEARDOWN in kept.driver_state:
                raise errors.SandboxFailed(f"sandbox {sandbox_id} is not whole on this host")
            registry.reserve(sandbox_id, kept.mem_mib, kept.disk_mib, waking=True)  # as a create is
            woken: SandboxRecord | None = None
            started = time.monotonic()
            try:
                rootfs = await self.rootfs(kept.image)
                spec = SandboxSpec(sandbox_id, kept.name, kept.image, rootfs, kept.shape)
                guard = self.traffic.guarding(kept.egress, kept.bandwidth_quota_bytes)
                woken = await self.traffic.booted(sandbox_id, runtime.wake(kept, spec, on_network=guard))
                woken.created_at, woken.forked_from = kept.created_at, kept.forked_from
                woken.self_seq_seen, woken.last_activity_at = kept.self_seq_seen, time.time()
                woken.networks, woken.disks = list(kept.networks), list(kept.disks)
                await self.networks.restore(woken)
                await self._restore_macs(runtime, woken, hibernation_of(kept) or {})
                await self.disks.restore(woken)
                await self._place_volumes(runtime, woken)
                woken.spawn_ms = round((time.monotonic() - started) * 1000, 3)
                registry.records.save(woken, durable=True)  # the commit: from here it runs
            except BaseException:
                if woken is not None:
                    with contextlib.suppress(Exception):
                        await self._take_down(woken)
                raise
            finally:
                registry.release(sandbox_id)
            registry.entries[sandbox_id] = Entry(woken)
            del registry.hibernated[sandbox_id]
            await runtime.forget_hibernation(sandbox_id)
        log.info("sandbox_woken", sandbox_id=sandbox_id, wake_ms=woken.spawn_ms, ip=woken.ip)
        return CreateSandboxResult(id=sandbox_id, ip=woken.ip, spawn_ms=woken.spawn_ms, status="running")

    def _woken(self, entry: Entry) -> CreateSandboxResult:
        status = self.registry.status(entry)
        if status != RuntimeState.RUNNING.value:
            raise errors.InvalidState(f"sandbox {entry.record.id} is {status}, not hibernated")
        record = entry.record
        return CreateSandboxResult(id=record.id, ip=record.ip, spawn_ms=record.spawn_ms, status="running")

    async def _network_macs(self, runtime: HibernatingRuntime, record: SandboxRecord) -> dict[str, str]:
        """The MAC address of each of the sandbox's private-network interfaces (``ethN``)."""
        macs: dict[str, str] = {}
        if not record.networks:
            return macs
        netns = runtime.network_namespace(record)
        with contextlib.suppress(Exception):  # a wake without them only takes new addresses
            links = json.loads(await run(["ip", "-n", netns, "-j", "link", "show"], timeout_s=10))
            names = {str(member.get("ifname")) for member in record.networks}
            for link in links:
                ifname, mac = str(link.get("ifname", "")), str(link.get("address", ""))
                if ifname in names and _IFNAME.match(ifname) and _MAC.match(mac):
                    macs[ifname] = mac
        return macs

    async def _restore_macs(
        self, runtime: HibernatingRuntime, record: SandboxRecord, meta: dict[str, object]
    ) -> None:
        macs = meta.get("macs")
        if not isinstance(macs, dict) or not macs:
            return
        netns = runtime.network_namespace(record)
        for ifname, mac in sorted(macs.items()):
            if not (_IFNAME.match(str(ifname)) and _MAC.match(str(mac))):
                continue
            try:
                await run(
                    ["ip", "-n", netns, "link", "set", "dev", str(ifname), "address", str(mac)], timeout_s=10
                )
            except Exception as exc:
                log.warning("network_mac_not_restored", sandbox_id=record.id, ifname=ifname, error=str(exc))

    async def _place_volumes(self, runtime: HibernatingRuntime, record: SandboxRecord) -> None:
        """The volumes the sandbox held when it hibernated, mounted into its new namespace again."""
        volumes = self.volumes
        held = sorted(volumes.held.get(record.id, ())) if volumes is not None else []
        if volumes is None or not held or isinstance(runtime, QemuRuntime):
            return  # a VM's volumes are drives of its machine, given back by its wake (drivers/vm)
        with driver_errors():
            pid = runtime.mount_namespace_pid(record)
        for volume_id in held:
            async with volumes.store.lock(volume_id):
                try:
                    meta = volumes.store.load(volume_id)
                except VolumeMissingError:
                    continue
                for holder in [h for h in meta.holders if h.sandbox_id == record.id]:
                    with driver_errors():
                        await volumes.store.mount_on_host(volume_id)
                    reason = await place_in(
                        pid, volumes.store.mount_dir(volume_id), holder.mount_path, read_only=holder.read_only
                    )
                    if reason is not None:
                        log.warning(
                            "volume_not_placed_again", sandbox_id=record.id, volume_id=volume_id, error=reason
                        )

    # -- destroy --------------------------------------------------------------------------------

    async def destroy(self, sandbox_id: str) -> bool:
        """Destroys a hibernated sandbox (its kept disk, S3 mounts' credentials, volume holds); False
        when it is not hibernated (it may have woken meanwhile: the caller destroys it as any)."""
        registry = self.registry
        entry = registry.hibernated.get(sandbox_id)
        if entry is None:
            return False
        async with entry.lock:
            if registry.hibernated.get(sandbox_id) is not entry:
                return False
            record = entry.record
            teardown = record.driver_state.get(TEARDOWN)
            runtime = self._runtime()
            if isinstance(teardown, dict):
                with contextlib.suppress(Exception):
                    await runtime.release_hibernated(sandbox_id, teardown)
            await self.networks.leave_all(record)
            await self.disks.release(sandbox_id, record)
            if self.volumes is not None:
                await self.volumes.release(sandbox_id)
            await runtime.forget_hibernation(sandbox_id)
            registry.records.delete(sandbox_id)
            del registry.hibernated[sandbox_id]
        log.info("sandbox_destroyed", sandbox_id=sandbox_id, hibernated=True)
        return True

    async def forget_leftover(self, sandbox_id: str) -> None:
        """A destroyed sandbox's copy left by a hibernation that never committed (the agent died after
        the copy's rename, the store not mounted at its next start), if any."""
        runtime = self.registry.runtime
        if isinstance(runtime, (OciRuntime, QemuRuntime)) and (runtime.hibernated_dir / sandbox_id).exists():
            await runtime.forget_hibernation(sandbox_id)

    # -- the agent's start ----------------------------------------------------------------------

    async def adopt(self, records: list[SandboxRecord]) -> list[SandboxRecord]:
        """At start: hibernations the previous agent died in are finished or undone, and the hibernated
        sandboxes are held; answers the other records, for the runtime to adopt."""
        registry = self.registry
        runtime = registry.runtime
        # Only the records whose teardown the previous agent left unfinished change here; the others are
        # not written again (10,000 records take ~3 s to rewrite on the 2-core dev box).
        unsettled = {
            record.id
            for record in records
            if hibernation_of(record) is not None and set(record.driver_state) != {HIBERNATION}
        }
        if isinstance(runtime, (OciRuntime, QemuRuntime)):
            await runtime.settle_hibernations(records)
        rest = []
        for record in records:
            if record.driver == runtime.name and hibernation_of(record) is not None:
                registry.hibernated[record.id] = Entry(record)
                if record.id in unsettled:
                    with contextlib.suppress(OSError):
                        registry.records.save(record)  # the teardown it finished, recorded
                    log.info("sandbox_adopted", sandbox_id=record.id, state="hibernated")
            else:
                rest.append(record)
        log.info("hibernated_sandboxes_adopted", count=len(registry.hibernated), settled=len(unsettled))
        return rest
