"""Warm pool of sandbox slots: everything about a sandbox that does not depend on its image.

A slot is a directory (``<state>/slots/<slot id>``) with a formatted disk image attached to a loop
device and mounted, plus a network namespace with its veth pair and address. Preparing one takes
~100 ms (a clone of a blank disk, loop, mount; the netns and veth built beside them); a create that
finds one ready only mounts the overlay and starts the runtime. The pool refills in the background,
one slot at a time, between bursts of boots (``WarmPool``).

A slot's ``slot.json`` records its parts, so an agent restart can find and remove slots that no
sandbox owns.

**Parked sandboxes.** Where the runtime can (``Parker``: crun and runc), the pool also boots a sandbox
of the host's pool image in each free slot (but the one readied for a fork): its container and guest
agent run, with a placeholder name and the pool's limits. A create of that image *claims* one: the
driver gives it the sandbox's limits, name and identity files, and the boot (``crun run`` and the
guest's start, ~70 % of a create's CPU) is out of the create's way, as in E2B's and CubeSandbox's
snapshot pools. The parked sandbox's container id and cgroup are the slot's (``Parked``), recorded in
``slot.json``; a restarted agent stops those no sandbox claimed.

**The seam.** A runtime reaches its slots through ``SlotPool`` only (take, take for a fork, destroy,
reclaim what no sandbox owns), and the pool reaches the runtime through ``ParkingRuntime`` only (boot a
container in a slot, stop it). When to park, in which slot, under which container id, and which create
may claim a parked sandbox (``image_key``) is this module's business (``Parking``), not the runtime's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.net.network import NetworkManager, SandboxNetwork
from paddock_hostagent.drivers.storage import mounts, rootdisks
from paddock_hostagent.drivers.storage.rootdisks import Disk, Filesystem

log = get_logger(__name__)
T = TypeVar("T")
A = TypeVar("A")
NETWORK_THREADS = 16


@dataclass
class Parked:
    """A sandbox booted in a free slot, waiting to be claimed: the runtime's container id and cgroup
    path (both the slot's, not a sandbox's), the image it runs (a key the driver makes of its root
    filesystem) and its init process."""

    container_id: str
    cgroups_path: str
    rootfs: str
    init_pid: int
    init_ticks: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Parked:
        return cls(**data)


@dataclass
class Slot:
    id: str
    dir: Path
    network: SandboxNetwork
    disk: Disk
    disk_mib: int
    parked: Parked | None = None

    @property
    def bundle_dir(self) -> Path:
        return self.dir

    @property
    def rootfs_dir(self) -> Path:
        return self.dir / "rootfs"

    @property
    def socket_path(self) -> Path:
        return self.dir / "guest.sock"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "dir": str(self.dir),
            "ip": self.network.ip,
            "gateway": self.network.gateway,
            "disk_image": str(self.disk.image_path),
            "disk_mount": str(self.disk.mount_dir),
            "fs": self.disk.fs,
            "loop_device": self.disk.loop_device,
            "disk_mib": self.disk_mib,
            **({"parked": self.parked.to_json()} if self.parked is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Slot:
        network = SandboxNetwork(slot=data["id"], ip=data["ip"], gateway=data["gateway"])
        disk = Disk(Path(data["disk_image"]), Path(data["disk_mount"]), data["fs"], data["loop_device"])
        parked = Parked.from_json(data["parked"]) if "parked" in data else None
        return cls(data["id"], Path(data["dir"]), network, disk, int(data["disk_mib"]), parked)

    def save(self) -> None:
        tmp = self.dir / "slot.json.tmp"
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(self.dir / "slot.json")


async def _finish_even_if_cancelled(work: Coroutine[Any, Any, T]) -> T:
    """Awaits ``work`` to its end even when the caller is cancelled (a thread cannot be stopped
    half-way, and what it made must be known to be cleaned up), then re-raises the cancellation."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


class Parker(Protocol):
    """What the pool needs of a runtime that can park sandboxes in its free slots."""

    async def park(self, slot: Slot) -> bool:
        """Boots a parked sandbox in ``slot`` (sets ``slot.parked``); False when there is nothing to
        park now (no pool image on this host). On failure it raises, having stopped what it started;
        the slot is then no longer clean and the pool destroys it."""

    async def discard(self, slot: Slot) -> None:
        """Stops the slot's parked sandbox and destroys the slot."""


def image_key(rootfs: Path) -> str:
    """What a parked sandbox must match to be claimed: the image's root filesystem, that very
    directory (an image rebuilt since is renamed into place: another inode)."""
    try:
        return f"{rootfs}@{os.stat(rootfs).st_ino}"
    except FileNotFoundError:
        return str(rootfs)


class ParkingRuntime(Protocol):
    """What parking needs of a runtime: a container booted in a free slot, and stopped again."""

    def cgroups_path(self, container_id: str) -> str:
        """The cgroup a container of this id runs in."""

    async def boot_parked(self, slot: Slot, parked: Parked, rootfs: Path) -> None:
        """Boots ``parked.container_id`` of the image at ``rootfs`` in ``slot`` with the parked limits and
        sets ``parked``'s init process; on failure stops what it started and raises."""

    async def stop_parked(self, slot: Slot, parked: Parked) -> None:
        """Stops the container parked in ``slot`` (its processes, runtime state and cgroup); the slot
        and its disk stay."""


class Parking:
    """The pool's ``Parker``: which image to park (``pool_rootfs``; None parks nothing), under which
    container id and cgroup, recorded before the boot; the boot and the stop are the runtime's."""

    def __init__(
        self,
        factory: SlotFactory,
        runtime: ParkingRuntime,
        pool_rootfs: Callable[[], Path | None] | None,
    ) -> None:
        self.factory = factory
        self.runtime = runtime
        self.pool_rootfs = pool_rootfs

    async def park(self, slot: Slot) -> bool:
        rootfs = self.pool_rootfs() if self.pool_rootfs is not None else None
        if rootfs is None:
            return False
        container_id = f"parked-{slot.id}"
        # Recorded before the boot: an agent killed half-way through leaves a slot whose container
        # the next agent finds and stops (by its id and cgroup) instead of one it cannot know about.
        parked = Parked(container_id, self.runtime.cgroups_path(container_id), image_key(rootfs), 0, 0)
        slot.parked = parked
        slot.save()
        try:
            await self.runtime.boot_parked(slot, parked, rootfs)
        except BaseException:
            slot.parked = None
            raise
        slot.save()
        return True

    async def discard(self, slot: Slot) -> None:
        if slot.parked is not None:
            await self.runtime.stop_parked(slot, slot.parked)
        await self.factory.destroy(slot)


class SlotFactory:
    def __init__(
        self, slots_dir: Path, network: NetworkManager, fs: Filesystem, guest_binary: Path | None = None
    ) -> None:
        self.slots_dir = slots_dir
        self.network = network
        self.fs = fs
        self.guest_binary = guest_binary  # copied onto each new disk (rootdisks.install_guest)
        # Where new disk images go: the disk store once opened (rootdisks.open_store), else the slot's dir.
        self._images_dir: Path | None = None
        self._store_opened = False
        self._store_lock = asyncio.Lock()
        # Network builds and teardowns wait on `ip` commands (tens of ms each): threads of their own, so
        # that a burst of slots built on demand does not hold every thread of the loop's default
        # executor, behind which each create's short blocking steps (mounts, clones) would queue.
        self._network_threads = ThreadPoolExecutor(NETWORK_THREADS, thread_name_prefix="slot-network")

    async def _in_network_thread(self, work: Callable[[A], T], argument: A) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._network_threads, work, argument)

    async def images_dir(self) -> Path | None:
        """The disk store (opened on first use, once); None when this host has none."""
        async with self._store_lock:
            if not self._store_opened:
                self._images_dir = await rootdisks.open_store(self.slots_dir)
                self._store_opened = True
                log.info("disk_store", directory=str(self._images_dir) if self._images_dir else None)
        return self._images_dir

    def _image_path(self, slot_id: str, images_dir: Path | None) -> Path:
        if images_dir is None:
            return self.slots_dir / slot_id / "disk.img"
        return images_dir / f"{slot_id}.img"

    async def close(self) -> None:
        """Takes the disk store down if no image is left in it — also when this agent never opened it:
        an agent restarted after a crash adopts its sandboxes from the store a previous agent mounted,
        and is the one that must take it down once they are gone."""
        async with self._store_lock:
            await rootdisks.close_store(self.slots_dir)
            self._store_opened, self._images_dir = False, None

    async def build(self, disk_mib: int, *, with_disk: bool = True) -> Slot:
        images_dir = await self.images_dir()
        slot_id = secrets.token_hex(4)
        slot_dir = self.slots_dir / slot_id
        slot_dir.mkdir(parents=True)
        disk = Disk(self._image_path(slot_id, images_dir), slot_dir / "disk", self.fs)
        network = SandboxNetwork(slot=slot_id, ip="", gateway=self.network.gateway)
        slot = Slot(slot_id, slot_dir, network, disk, disk_mib)
        try:
            # The disk and the network are independent: built side by side, the disk's waits (the
            # write-through queue freeze, the mount's reads) overlap the network's commands.
            outcomes = await asyncio.gather(
                _finish_even_if_cancelled(self._build_disk(disk, disk_mib, images_dir, with_disk=with_disk)),
                _finish_even_if_cancelled(self._in_network_thread(self.network.create, slot_id)),
                return_exceptions=True,
            )
            if not isinstance(outcomes[1], BaseException):
                slot.network = outcomes[1]
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            slot.rootfs_dir.mkdir()
            slot.save()
        except BaseException:
            await self.destroy(slot)
            raise
        return slot

    async def _build_disk(
        self, disk: Disk, disk_mib: int, images_dir: Path | None, *, with_disk: bool
    ) -> None:
        if not with_disk:
            return
        if images_dir is None:
            await rootdisks.format_image(disk.image_path, disk_mib, self.fs)
        else:
            await rootdisks.format_from_blank(disk.image_path, disk_mib, self.fs, images_dir)
        await rootdisks.attach(disk)
        if self.guest_binary is not None:
            await asyncio.to_thread(rootdisks.install_guest, disk, self.guest_binary)

    async def destroy(self, slot: Slot) -> None:
        """Removes every part of the slot; parts already gone are skipped."""
        mounts.unmount(slot.rootfs_dir)
        await rootdisks.detach(slot.disk)
        await self._in_network_thread(self.network.destroy, slot.network)
        slot.disk.image_path.unlink(missing_ok=True)  # in the disk store, outside the slot's directory
        shutil.rmtree(slot.dir, ignore_errors=True)

    def load_all(self) -> list[Slot]:
        slots: list[Slot] = []
        if not self.slots_dir.is_dir():
            return slots
        for entry in sorted(self.slots_dir.iterdir()):
            try:
                slots.append(Slot.from_json(json.loads((entry / "slot.json").read_text())))
            except (OSError, ValueError, KeyError):
                # A slot whose build was interrupted before it saved: clean what can be found.
                image = rootdisks.store_dir(self.slots_dir) / f"{entry.name}.img"
                disk = Disk(image if image.exists() else entry / "disk.img", entry / "disk", self.fs)
                slots.append(
                    Slot(entry.name, entry, SandboxNetwork(entry.name, "", self.network.gateway), disk, 0)
                )
        return slots


class WarmPool:
    """Free slots of ``disk_mib``, refilled in the background up to ``size``.

    The refill builds between bursts: while ``busy()`` (creates and forks booting) it holds off, up
    to ``busy_wait_s`` per slot, so that a burst's boots get the CPU instead of slots for later
    requests (a burst that empties the pool builds its own slots on demand anyway); a steady stream
    of creates still gets its slots once that wait has passed.

    A pool of two or more also keeps one slot ready for a fork: a slot built while another is free
    and none is ready has its disk unmounted before it is offered (the fork replaces its image with a
    clone of its source's, and unmounting an XFS disk that had the guest binary written to it cost the
    fork 2-5 ms). Creates take the mounted slots first, and mount that one again only when no other
    is free (a clean mount of cached metadata).

    With a ``parker`` every other free slot gets a parked sandbox (module docstring) once built, and
    slots built before the pool image was on the host are parked when the refill next runs. A create
    of the parked image claims a parked slot first; any other create, and every fork, takes a plain
    one, and never a parked one (its disk holds what the parked sandbox wrote)."""

    refill_delay_s = 0.15
    busy_poll_s = 0.02
    busy_wait_s = 1.0
    park_retry_s = 5.0
    close_wait_s = 30.0  # how long ``close`` lets a slot being built or parked finish before cancelling

    def __init__(
        self,
        factory: SlotFactory,
        size: int,
        disk_mib: int,
        busy: Callable[[], bool] = lambda: False,
        parker: Parker | None = None,
    ) -> None:
        self.factory = factory
        self.size = size
        self.disk_mib = disk_mib
        self.busy = busy
        self.parker = parker
        self._free: list[Slot] = []
        self._parking = 0  # free slots taken out of ``_free`` while a sandbox is parked in them
        self._unmounted: set[str] = set()  # free slots readied for a fork: their disk is not mounted
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._park_failed_at = -float("inf")
        self.last_error: str | None = None

    def start(self) -> None:
        if self._task is None and self.size > 0:
            self._task = asyncio.create_task(self._refill_forever(), name="warm-pool")
            self._wake.set()

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def parked_count(self) -> int:
        return sum(1 for slot in self._free if slot.parked is not None)

    async def take(self, disk_mib: int, rootfs: str | None = None) -> tuple[Slot, bool]:
        """A slot whose disk is ``disk_mib`` or smaller (to be grown): one with a sandbox of ``rootfs``
        parked in it if there is one, else a plain one; builds one if none is ready.

        Returns the slot and whether it came from the pool.
        """
        fitting = [slot for slot in self._free if slot.disk_mib <= disk_mib]
        parked = [slot for slot in fitting if slot.parked is not None and slot.parked.rootfs == rootfs]
        if parked:
            slot = max(parked, key=lambda candidate: candidate.disk_mib)
            self._free.remove(slot)
            self._wake.set()
            return slot, True
        candidates = [slot for slot in fitting if slot.parked is None]
        if candidates:
            slot = max(
                candidates, key=lambda candidate: (candidate.id not in self._unmounted, candidate.disk_mib)
            )
            self._free.remove(slot)
            self._wake.set()
            if slot.id in self._unmounted:  # the only free slot that fits was readied for a fork
                self._unmounted.discard(slot.id)
                try:
                    await rootdisks.attach(slot.disk)
                except BaseException:
                    await self.factory.destroy(slot)
                    raise
            return slot, True
        self._wake.set()
        return await self.factory.build(disk_mib), False

    async def take_for_fork(self) -> Slot:
        """A slot for a fork, the one readied for it first: the fork replaces the image under the
        slot's loop device with a clone of its source's (``rootdisks.clone_disk``, which unmounts the
        slot's disk, if mounted, while the source syncs). Without a free plain slot, one with a
        network and no disk (the clone is then attached as any disk)."""
        plain = [slot for slot in self._free if slot.parked is None]
        if plain:
            slot = next((slot for slot in plain if slot.id in self._unmounted), plain[0])
            self._free.remove(slot)
            self._unmounted.discard(slot.id)
            self._wake.set()
            return slot
        self._wake.set()
        return await self.factory.build(0, with_disk=False)

    async def wait_full(self, timeout_s: float = 30.0) -> None:
        """For benchmarks and tests: waits until the pool has refilled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(self._free) < self.size and loop.time() < deadline:
            await asyncio.sleep(0.02)

    async def _refill_forever(self) -> None:
        while not self._closing:
            await self._wake.wait()
            # Let the create that took a slot finish before competing with it for the CPU.
            await asyncio.sleep(self.refill_delay_s)
            self._wake.clear()
            while len(self._free) + self._parking < self.size and not self._closing:
                await self._wait_quiet()
                try:
                    slot = await self.factory.build(self.disk_mib)
                    self.last_error = None
                except DriverError as exc:
                    self.last_error = str(exc)
                    log.warning("warm_pool_refill_failed", error=str(exc))
                    await asyncio.sleep(5)
                    break
                await self._offer(slot)
            await self._park_plain_slots()

    async def _offer(self, slot: Slot, *, park: bool = False) -> None:
        """Makes a slot free: readied for a fork (unless ``park``), parked, or as it is once the pool is
        closing (a stop does not wait for a boot). A slot this is cancelled on, half readied or half
        parked (a stop that outlasted ``close_wait_s``), is removed, not left behind."""
        try:
            if self._closing:
                self._free.append(slot)
            elif not park and self._wants_fork_slot():
                await self._ready_for_fork(slot)
                self._free.append(slot)
            else:
                await self._park(slot)
        except BaseException:
            if slot not in self._free:
                await _finish_even_if_cancelled(self._remove(slot))
            raise

    async def _remove(self, slot: Slot) -> None:
        """Stops the slot's parked sandbox, if any, and destroys the slot."""
        if slot.parked is not None and self.parker is not None:
            await self.parker.discard(slot)
        else:
            await self.factory.destroy(slot)

    def _wants_fork_slot(self) -> bool:
        """Whether the slot just built should be readied for forks: a pool of two or more keeps one.
        Without a parker it comes second, so that the first free slot is a mounted one for creates;
        with one it comes first, since a fork can use no parked slot and creates claim the others."""
        if self._unmounted or self.size < 2:
            return False
        return bool(self._free) or self.parker is not None

    async def _park(self, slot: Slot) -> None:
        """Parks a sandbox in a slot that is not in ``_free`` (no create may take it half booted),
        then offers it; a slot whose parking failed is destroyed, and parking rests a while."""
        loop = asyncio.get_running_loop()
        if self.parker is None or loop.time() - self._park_failed_at < self.park_retry_s:
            self._free.append(slot)
            return
        self._parking += 1
        try:
            await self.parker.park(slot)
        except Exception as exc:  # any failure: the slot goes, the pool goes on
            self._park_failed_at = loop.time()
            self.last_error = f"parking a sandbox failed: {exc}"
            log.warning("warm_pool_park_failed", slot=slot.id, error=str(exc))
            await self.factory.destroy(slot)
            return
        finally:
            self._parking -= 1
        self._free.append(slot)

    async def _park_plain_slots(self) -> None:
        """Parks sandboxes in the free plain slots (not the one readied for a fork): those built
        before the pool image was on the host, or while parking was failing."""
        if self.parker is None:
            return
        for slot in list(self._free):
            if self._closing:
                return
            if slot.parked is not None or slot.id in self._unmounted or slot not in self._free:
                continue
            await self._wait_quiet()
            if slot not in self._free:  # a create took it meanwhile
                continue
            self._free.remove(slot)
            await self._offer(slot, park=True)
            if slot.parked is None:  # nothing to park (no pool image yet), or it failed
                return

    async def _ready_for_fork(self, slot: Slot) -> None:
        """Unmounts the disk of a slot about to join the free ones, so that a fork taking it has no
        unmount to wait for; done before the slot is offered, so that no boot races it."""
        try:
            await asyncio.to_thread(mounts.unmount, slot.disk.mount_dir)
        except DriverError as exc:  # still mounted: an ordinary warm slot
            log.warning("warm_pool_ready_for_fork_failed", slot=slot.id, error=str(exc))
            return
        self._unmounted.add(slot.id)

    async def _wait_quiet(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.busy_wait_s
        while self.busy() and not self._closing and loop.time() < deadline:
            await asyncio.sleep(self.busy_poll_s)

    async def close(self) -> None:
        """Lets a slot being built finish (so nothing is half made), then removes the free slots."""
        if self._task is not None:
            self._closing = True
            self._wake.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.close_wait_s)
            except TimeoutError:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._free:
            await self._remove(self._free.pop())  # a parked sandbox is stopped with its slot
        self._unmounted.clear()
        await self.factory.close()


@dataclass
class Taken:
    """A slot a create took: the sandbox parked in it for this create to claim (None: a plain slot,
    for a boot), and whether the slot was ready in the pool (False: built on demand)."""

    slot: Slot
    parked: Parked | None
    warm: bool


class SlotPool:
    """A runtime's one door to its slots: the warm pool, the parking in it (where the runtime parks),
    and the slots on disk that no sandbox owns."""

    def __init__(
        self,
        factory: SlotFactory,
        size: int,
        disk_mib: int,
        *,
        runtime: ParkingRuntime,
        busy: Callable[[], bool],
        parks: bool,
        pool_rootfs: Callable[[], Path | None] | None,
    ) -> None:
        """``parks``: whether this runtime parks sandboxes in free slots; a runtime that does not still
        stops what an earlier agent parked (``reclaim``)."""
        self.factory = factory
        self._parking = Parking(factory, runtime, pool_rootfs)
        self.warm = WarmPool(factory, size, disk_mib, busy=busy, parker=self._parking if parks else None)

    @property
    def slots_dir(self) -> Path:
        return self.factory.slots_dir

    @property
    def free_count(self) -> int:
        return self.warm.free_count

    @property
    def parked_count(self) -> int:
        return self.warm.parked_count

    def start(self) -> None:
        self.warm.start()

    async def close(self) -> None:
        await self.warm.close()

    async def take(self, disk_mib: int, rootfs: Path) -> Taken:
        """A slot for a create of the image at ``rootfs``: one with a sandbox of that image parked in
        it (handed over: the slot no longer records it), else a plain one."""
        # The image's key costs a stat: only asked for when a parked sandbox could match it.
        key = image_key(rootfs) if self.warm.parked_count else None
        slot, warm = await self.warm.take(disk_mib, key)
        parked, slot.parked = slot.parked, None
        return Taken(slot, parked, warm)

    async def take_for_fork(self) -> Slot:
        return await self.warm.take_for_fork()

    async def destroy(self, slot: Slot) -> None:
        """Removes every part of a slot whose container is gone."""
        await self.factory.destroy(slot)

    async def reclaim(self, owned: set[str], kept_images: set[str]) -> None:
        """Removes the slots (warm, parked or half-made) whose id is not in ``owned``, stopping what is
        parked in them, and the loop devices of the slots' images but those in ``kept_images``."""
        for slot in self.factory.load_all():
            if slot.id not in owned:
                log.info("reclaiming_orphan_slot", slot=slot.id, parked=slot.parked is not None)
                await self._parking.discard(slot)
        for device in await rootdisks.detach_stray_loops(self.factory.slots_dir, kept_images):
            log.info("detached_stray_loop", device=device)
