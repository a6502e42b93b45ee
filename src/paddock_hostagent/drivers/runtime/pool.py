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

**Per-image pools.** The default pool parks the pool image at its disk size only. What else creates ask
for — another image (``devbox:1``, a user's template), another disk size — is counted per kind (image
and disk size, ``Demand``: an exponentially decayed create rate) and parked by ``ImagePools``, one of a
kind once it is asked for, more as it gets busier, none once it has not been asked for in minutes,
all parked sandboxes together within a budget of host memory (``PADDOCK_HOST_POOL_MEMORY_PCT`` of
MemTotal, measured in their cgroups). A create whose size has none parked claims one of its image on
a smaller disk, grown on claim (``SlotPool.take``: XFS online, the ioctl alone, ``grow_xfs(home=False)``,
a few ms; still no boot). A parked sandbox is no sandbox's: it has no
record, counts against no tenant's quota and no admission's promise.

**Snapshots.** A snapshot is a kind of its own (``Kind.snapshot``: its disk image): the sandbox parked
for it runs on a clone of the snapshot's disk (``rootdisks.restore_disk``, grown to the size creates
ask for), and only a boot from that snapshot claims it (``snapshot_key``: the image and the snapshot's
disk, that very file). A snapshot just taken counts as one create of its kind
(``expect_snapshot_boots``), so one is parked before the first boot asks; a deleted snapshot's parked
sandbox matches nothing and is stopped. A boot that finds its disk smaller than it asks grows it with
the ioctl alone (``grow_xfs(home=False)``, a few ms).

**Recycled networks.** A destroyed sandbox's network (namespace, veth, address, guard elements) is
the costly half of a slot to make and unmake (two ``ip`` processes and the kernel's namespace setup
and teardown). A destroy therefore goes in two halves (``SlotPool.retire``, then ``recycle`` once the
sandbox's egress rules are gone): its disk and files go at once, and its network is kept for the next
slot built (``SlotFactory.build``), at most ``RECYCLE_MAX`` of them, only if it is pristine
(``NetworkManager.pristine``: never carried a packet, holds no socket, has only what was made). A
network that carried traffic is destroyed as before. The disk is never reused: a new slot gets a
fresh clone of the blank.

**The seam.** A runtime reaches its slots through ``SlotPool`` only (take, take for a fork, destroy,
reclaim what no sandbox owns), and the pool reaches the runtime through ``ParkingRuntime`` only (boot a
container in a slot, stop it). When to park, in which slot, under which container id, and which create
may claim a parked sandbox (``image_key``) is this module's business (``Parking``), not the runtime's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import secrets
import shutil
import struct
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.net.network import NetworkManager, SandboxNetwork
from paddock_hostagent.drivers.runtime.cgroups import SandboxCgroup
from paddock_hostagent.drivers.storage import loops, mounts, rootdisks
from paddock_hostagent.drivers.storage.rootdisks import Disk, Filesystem

log = get_logger(__name__)
T = TypeVar("T")
A = TypeVar("A")
NETWORK_THREADS = 16
MIB = 1 << 20
#: Networks of destroyed sandboxes kept for the next slots (``SlotFactory.recycle``).
RECYCLE_MAX = 8


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


def snapshot_key(rootfs: Path, snapshot: Path) -> str:
    """What a sandbox parked on a snapshot's disk must match to be claimed: its image (``image_key``) and
    the snapshot's disk image, that very file (a snapshot deleted and another taken under its id is
    another inode; a deleted one matches nothing, so what is parked on it is stopped)."""
    try:
        return f"{image_key(rootfs)}+{snapshot}@{os.stat(snapshot).st_ino}"
    except FileNotFoundError:
        return f"{image_key(rootfs)}+{snapshot}"


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
        await self.park_image(slot, rootfs)
        return True

    async def park_image(self, slot: Slot, rootfs: Path, key: str | None = None) -> None:
        """Boots a parked sandbox of the image at ``rootfs`` in ``slot`` (``ImagePools``' images), to be
        claimed by creates whose key is ``key`` (the image's ``image_key`` unless given)."""
        container_id = f"parked-{slot.id}"
        # Recorded before the boot: an agent killed half-way through leaves a slot whose container
        # the next agent finds and stops (by its id and cgroup) instead of one it cannot know about.
        parked = Parked(container_id, self.runtime.cgroups_path(container_id), key or image_key(rootfs), 0, 0)
        slot.parked = parked
        slot.save()
        try:
            await self.runtime.boot_parked(slot, parked, rootfs)
        except BaseException:
            slot.parked = None
            raise
        slot.save()

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
        #: Slots of destroyed sandboxes kept with their network only (``recycle``): the next build
        #: takes one instead of making a namespace, veth, address and guard elements.
        self._recycled: list[Slot] = []

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
        while self._recycled:
            await self.destroy(self._recycled.pop())
        async with self._store_lock:
            await rootdisks.close_store(self.slots_dir)
            self._store_opened, self._images_dir = False, None

    async def build(self, disk_mib: int, *, with_disk: bool = True) -> Slot:
        images_dir = await self.images_dir()
        if self._recycled:
            return await self._rebuild(self._recycled.pop(), disk_mib, images_dir, with_disk=with_disk)
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

    # -- recycling: a destroyed sandbox's network serves the next slot ----------------------------

    async def strip(self, slot: Slot) -> None:
        """Removes all of a slot whose container is gone but its network: the disk (unmounted,
        detached, its image deleted) and every file of the slot's directory, which then holds only a
        ``slot.json`` saying so (an agent restarted meanwhile reclaims it as any unowned slot)."""
        mounts.unmount(slot.rootfs_dir)
        await rootdisks.detach(slot.disk)
        slot.disk.image_path.unlink(missing_ok=True)
        await asyncio.to_thread(shutil.rmtree, slot.dir, True)
        slot.dir.mkdir(parents=True)
        slot.disk = Disk(slot.disk.image_path, slot.dir / "disk", self.fs)
        slot.disk_mib, slot.parked = 0, None
        slot.save()

    async def recycle(self, slot: Slot) -> bool:
        """Keeps a stripped slot's network for the next ``build`` when it is pristine
        (``NetworkManager.pristine``: the namespace never carried a packet, holds no socket and has
        only what ``create`` made) and fewer than ``RECYCLE_MAX`` wait; else destroys it. Called once
        nothing refers to the network any more (the sandbox's egress rules are gone)."""
        if len(self._recycled) < RECYCLE_MAX and await self._in_network_thread(
            self.network.pristine, slot.network
        ):
            self._recycled.append(slot)
            return True
        await self.destroy(slot)
        return False

    @property
    def recycled_count(self) -> int:
        return len(self._recycled)

    async def _rebuild(self, slot: Slot, disk_mib: int, images_dir: Path | None, *, with_disk: bool) -> Slot:
        """A new slot on a recycled one's network: a new disk (a clone of the blank, as ``build``
        makes), the same slot id, namespace, veth and address."""
        slot.disk = Disk(self._image_path(slot.id, images_dir), slot.dir / "disk", self.fs)
        slot.disk_mib = disk_mib
        try:
            await _finish_even_if_cancelled(
                self._build_disk(slot.disk, disk_mib, images_dir, with_disk=with_disk)
            )
            slot.rootfs_dir.mkdir(exist_ok=True)
            slot.save()
        except BaseException:
            await _finish_even_if_cancelled(self.destroy(slot))
            raise
        return slot

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

    async def stop_building(self) -> None:
        """Lets a slot being built finish (so nothing is half made), for at most ``close_wait_s``, and
        builds no more."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.close_wait_s)
            except TimeoutError:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self) -> None:
        """Stops building (``stop_building``), then removes the free slots."""
        await self.stop_building()
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


# -- a disk grown on claim ---------------------------------------------------------------------------

_XFS_IOC_FSGEOMETRY_V1 = (2 << 30) | (112 << 16) | (ord("X") << 8) | 100  # _IOR('X', 100, 112 bytes)
_XFS_IOC_FSGROWFSDATA = (1 << 30) | (16 << 16) | (ord("X") << 8) | 110  # _IOW('X', 110, 16 bytes)


def grow_xfs(disk: Disk, size_mib: int, *, home: bool = True) -> None:
    """Grows a mounted XFS disk to ``size_mib``, as ``rootdisks.grow`` does without its ``xfs_growfs``
    process: the image file, its loop device, the filesystem (``XFS_IOC_FSGROWFSDATA``: ~1 ms for 1 to
    2 GiB, ~4 ms for 1 to 10 GiB on a quiet box), then a freeze and thaw that writes the grown superblock
    home and covers the log (30-45 ms here, the loop device's synchronous writes): a copy of the image
    (a fork's clone, a snapshot) or a crash's log replay then sees the new size (``rootdisks.grow``
    says why this kernel's replay of a growth fails).

    ``home`` False leaves the freeze out (a create or a boot from a snapshot claiming a parked sandbox
    on a smaller disk): the superblock reaches its home as the log moves on (XFS's log worker pushes
    what the log holds each second on an agent's host, ``host.hurry_xfs_log_worker``), and until then
    a copy of the disk finds it not home and freezes the filesystem for its clone
    (``rootdisks._clone_for_mount``), so a fork in that second pays the freeze the create left out; a
    sandbox's disk is never mounted again after a host crash, so no replay of the growth is ever asked
    of it. ``rootdisks.grow`` (a resize) keeps the freeze: it answers no create."""
    with open(disk.image_path, "r+b") as image:
        image.truncate(size_mib * MIB)
    loops.refresh_capacity(disk.loop_device)
    fd = os.open(disk.mount_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        geometry = bytearray(112)
        fcntl.ioctl(fd, _XFS_IOC_FSGEOMETRY_V1, geometry)
        block_size = struct.unpack_from("=I", geometry, 0)[0]
        imaxpct = struct.unpack_from("=I", geometry, 28)[0]
        fcntl.ioctl(fd, _XFS_IOC_FSGROWFSDATA, struct.pack("=QI4x", size_mib * MIB // block_size, imaxpct))
    except OSError as exc:
        raise DriverError(f"growing the disk {disk.image_path.name} to {size_mib} MiB failed: {exc}") from exc
    finally:
        os.close(fd)
    if home:
        mounts.freeze_filesystem(disk.mount_dir)
        mounts.thaw_filesystem(disk.mount_dir)


# -- demand: which images to keep parked, at which disk size, and how many ----------------------------


@dataclass(frozen=True)
class Kind:
    """What a parked sandbox of the per-image pools is: an image (its root filesystem's path) on a disk
    of ``disk_mib``, empty, or a clone of the snapshot whose disk image is ``snapshot``
    (docs/snapshots.md)."""

    rootfs: Path
    disk_mib: int
    snapshot: Path | None = None
    fs: Filesystem = "xfs"  # the snapshot's disk's filesystem

    def key(self) -> str:
        """The ``Parked.rootfs`` a sandbox parked for this kind has, while it is claimable."""
        if self.snapshot is None:
            return image_key(self.rootfs)
        return snapshot_key(self.rootfs, self.snapshot)


@dataclass
class _Rate:
    """Creates of one kind as two exponentially decayed counts: ``slow`` says whether it was asked for
    in the last minutes, ``fast`` how many per second now."""

    slow: float = 0.0
    fast: float = 0.0
    at: float = 0.0

    def decay(self, now: float, slow_half_life_s: float, fast_half_life_s: float) -> None:
        elapsed = max(now - self.at, 0.0)
        self.slow *= 0.5 ** (elapsed / slow_half_life_s)
        self.fast *= 0.5 ** (elapsed / fast_half_life_s)
        self.at = now


class Demand:
    """Creates per kind (image and disk size) that the default pool does not serve (another image, a
    disk smaller than the pool's, or the pool image once the default pool's parked sandboxes are all
    claimed), and the parked sandboxes each should have: none once a kind has not been asked for in a
    while (its slow count, half-life ``slow_half_life_s``, fell below ``FORGET_BELOW``: four minutes
    after one create, longer after many), else one per ``horizon_s`` worth of its current rate
    (creates/s from the fast count, half-life ``fast_half_life_s``), at least one and at most
    ``per_kind_max``."""

    FORGET_BELOW = 0.25  # one create, two slow half-lives ago

    def __init__(
        self,
        *,
        per_kind_max: int = 4,
        slow_half_life_s: float = 120.0,
        fast_half_life_s: float = 5.0,
        horizon_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_kind_max = per_kind_max
        self.slow_half_life_s = slow_half_life_s
        self.fast_half_life_s = fast_half_life_s
        self.horizon_s = horizon_s
        self.clock = clock
        self._rates: dict[Kind, _Rate] = {}

    def record(self, kind: Kind) -> None:
        now = self.clock()
        rate = self._rates.setdefault(kind, _Rate(at=now))
        rate.decay(now, self.slow_half_life_s, self.fast_half_life_s)
        rate.slow += 1.0
        rate.fast += 1.0

    def targets(self) -> dict[Kind, int]:
        """Kind -> parked sandboxes wanted, busiest first; kinds no longer asked for are forgotten."""
        now = self.clock()
        wanted: list[tuple[float, Kind, int]] = []
        for kind, rate in list(self._rates.items()):
            rate.decay(now, self.slow_half_life_s, self.fast_half_life_s)
            if rate.slow < self.FORGET_BELOW:
                del self._rates[kind]
                continue
            per_s = rate.fast * math.log(2) / self.fast_half_life_s
            wanted.append((per_s, kind, min(max(math.ceil(per_s * self.horizon_s), 1), self.per_kind_max)))
        wanted.sort(key=lambda item: -item[0])
        return {kind: count for _, kind, count in wanted}


def parked_memory_bytes(parked: Parked) -> int:
    """What a parked sandbox holds of the host's memory now: its cgroup's usage (``memory.usage_in_bytes``,
    the page cache charged to it included)."""
    return SandboxCgroup(parked.cgroups_path).memory_usage_bytes()


#: What the budget counts a parked sandbox at, at least, whatever its cgroup says (~0.5 MiB for an idle
#: guest agent): the kernel's share for its mounted XFS disk (log buffers), loop device and network
#: namespace is in no cgroup. An estimate that bounds how many the budget admits (~75 in 1.2 GiB).
PARKED_FLOOR_BYTES = 16 * MIB


def budgeted_bytes(parked: Parked) -> int:
    return max(parked_memory_bytes(parked), PARKED_FLOOR_BYTES)


class ImagePools:
    """Parked sandboxes of the kinds (image, disk size) the default pool does not park — ``devbox:1``, a
    user's template, the pool image on a 2 GiB disk — as many of each as ``Demand`` says, all together
    within ``budget_bytes`` of host memory with the default pool's parked ones (``held_elsewhere``),
    each counted at what its cgroup holds and at least ``PARKED_FLOOR_BYTES``; a new one is counted at
    what the last of its image held, ``DEFAULT_COST_BYTES`` before any. The busiest kinds are parked
    first.

    A create claims one of its image on a disk of its size, else on the largest smaller disk there is,
    grown on claim (``SlotPool.take``). Built and parked one at a time, between bursts (``busy``), as the
    default pool refills; what demand no longer wants is stopped, one a tick, and so is a sandbox of an
    image rebuilt since it was parked (no create can claim it)."""

    tick_s = 1.0
    park_retry_s = 30.0  # a kind whose parking failed is not parked again for this long
    DEFAULT_COST_BYTES = 64 * MIB

    def __init__(
        self,
        factory: SlotFactory,
        parking: Parking,
        demand: Demand,
        *,
        budget_bytes: int,
        busy: Callable[[], bool],
        held_elsewhere: Callable[[], int] = lambda: 0,
    ) -> None:
        self.factory = factory
        self.parking = parking
        self.demand = demand
        self.budget_bytes = budget_bytes
        self.busy = busy
        self.held_elsewhere = held_elsewhere
        self._free: list[tuple[Kind, Slot]] = []
        self._cost: dict[Path, int] = {}
        self._failed_at: dict[Kind, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.last_error: str | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="image-pools")

    def wake(self) -> None:
        self._wake.set()

    @property
    def count(self) -> int:
        return len(self._free)

    def counts(self) -> dict[Kind, int]:
        out: dict[Kind, int] = {}
        for kind, _ in self._free:
            out[kind] = out.get(kind, 0) + 1
        return out

    def held_bytes(self) -> int:
        return sum(parked_memory_bytes(slot.parked) for _, slot in self._free if slot.parked is not None)

    def budgeted_bytes(self) -> int:
        return sum(budgeted_bytes(slot.parked) for _, slot in self._free if slot.parked is not None)

    def take(self, rootfs_key: str, disk_mib: int) -> Slot | None:
        """A parked slot of the image whose ``image_key`` is ``rootfs_key`` on a disk of ``disk_mib``, else
        on the largest smaller one; None if there is none."""
        fitting = [
            (slot.disk_mib, index)
            for index, (_, slot) in enumerate(self._free)
            if slot.parked is not None and slot.parked.rootfs == rootfs_key and slot.disk_mib <= disk_mib
        ]
        if not fitting:
            return None
        _, index = max(fitting)
        slot = self._free.pop(index)[1]
        self._wake.set()
        return slot

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick_s)
            self._wake.clear()
            if self._closing:
                return
            try:
                await self._balance()
            except DriverError as exc:
                self.last_error = str(exc)
                log.warning("image_pool_refill_failed", error=str(exc))
                await asyncio.sleep(self.tick_s)

    def _unwanted(self, targets: dict[Kind, int], counts: dict[Kind, int]) -> int | None:
        """The index in ``_free`` of one no longer wanted (its kind's demand fell, or its image was
        rebuilt), if any."""
        for index, (kind, slot) in enumerate(self._free):
            stale = slot.parked is None or slot.parked.rootfs != kind.key()
            if stale or counts.get(kind, 0) > targets.get(kind, 0):
                return index
        return None

    async def _balance(self) -> None:
        targets, counts = self.demand.targets(), self.counts()
        if self._unwanted(targets, counts) is not None:
            await self._wait_quiet()  # stopping one takes the CPU as parking one does
            # Read again: what a create claimed meanwhile is no longer in ``_free``.
            targets, counts = self.demand.targets(), self.counts()
            index = self._unwanted(targets, counts)
            if index is not None:
                _, slot = self._free.pop(index)
                await _finish_even_if_cancelled(self.parking.discard(slot))
                return
        now = time.monotonic()
        for kind, wanted in targets.items():
            if self._closing:
                return
            if counts.get(kind, 0) >= wanted or now - self._failed_at.get(kind, -1e9) < self.park_retry_s:
                continue
            if not kind.rootfs.is_dir() or (kind.snapshot is not None and not kind.snapshot.is_file()):
                continue
            cost = max(self._cost.get(kind.rootfs, self.DEFAULT_COST_BYTES), PARKED_FLOOR_BYTES)
            if self.held_elsewhere() + self.budgeted_bytes() + cost > self.budget_bytes:
                return  # the budget is spent: the busiest kinds got theirs first
            await self._wait_quiet()
            await self._park_one(kind)
            self._wake.set()  # the next one, or the next kind, on the next pass
            return

    async def _park_one(self, kind: Kind) -> None:
        # A snapshot's kind: a slot without a disk, given a clone of the snapshot's (as a boot from it
        # does, ``rootdisks.restore_disk``) before the sandbox is parked on it.
        slot = await self.factory.build(kind.disk_mib, with_disk=kind.snapshot is None)
        try:
            if kind.snapshot is not None:
                slot.disk.fs = kind.fs
                await rootdisks.restore_disk(kind.snapshot, slot.disk)
                slot.disk_mib = slot.disk.size_mib()
                if slot.disk_mib < kind.disk_mib and kind.fs == "xfs":  # grown now, not on claim
                    await asyncio.to_thread(grow_xfs, slot.disk, kind.disk_mib)
                    slot.disk_mib = kind.disk_mib
                slot.save()
            if kind.snapshot is None:
                await self.parking.park_image(slot, kind.rootfs)
            else:
                await self.parking.park_image(slot, kind.rootfs, key=kind.key())
        except Exception as exc:  # any failure: the slot goes, the kind rests, the pools go on
            self._failed_at[kind] = time.monotonic()
            self.last_error = f"parking a sandbox of {kind.rootfs} failed: {exc}"
            log.warning("image_pool_park_failed", image=str(kind.rootfs), error=str(exc))
            await _finish_even_if_cancelled(self.factory.destroy(slot))
            return
        except BaseException:
            await _finish_even_if_cancelled(self.parking.discard(slot))
            raise
        if self._closing:
            await _finish_even_if_cancelled(self.parking.discard(slot))
            return
        self._free.append((kind, slot))
        if slot.parked is not None:
            self._cost[kind.rootfs] = max(parked_memory_bytes(slot.parked), 1)

    async def _wait_quiet(self) -> None:
        deadline = time.monotonic() + WarmPool.busy_wait_s
        while self.busy() and not self._closing and time.monotonic() < deadline:
            await asyncio.sleep(WarmPool.busy_poll_s)

    async def stop_building(self) -> None:
        """Lets the sandbox being parked finish, for at most ``WarmPool.close_wait_s``, and parks no more."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), WarmPool.close_wait_s)
            except TimeoutError:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self) -> None:
        await self.stop_building()
        while self._free:
            await self.parking.discard(self._free.pop()[1])


@dataclass(frozen=True)
class ImagePoolConfig:
    """The per-image pools' bounds (``HostAgentSettings``: ``pool_memory_pct``, ``pool_kind_max``).
    ``budget_bytes`` 0 parks nothing but the default pool."""

    budget_bytes: int = 0
    per_kind_max: int = 4


class SlotPool:
    """A runtime's one door to its slots: the warm pool, the parking in it (where the runtime parks),
    the per-image pools (``ImagePools``) and the slots on disk that no sandbox owns."""

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
        self._parks = parks
        self._busy = busy
        self._parking = Parking(factory, runtime, pool_rootfs)
        self.warm = WarmPool(factory, size, disk_mib, busy=busy, parker=self._parking if parks else None)
        self.images: ImagePools | None = None
        #: The disk the last create asked for (``take``, ``take_snapshot``); the pool's until one did.
        self.last_disk_mib = disk_mib
        #: Slots stripped by ``retire``, by the sandbox they served, waiting for ``recycle``.
        self._retired: dict[str, Slot] = {}

    def configure_images(self, config: ImagePoolConfig) -> None:
        """Turns the per-image pools on (before ``start``), where this runtime parks and has a pool."""
        if not self._parks or self.warm.size <= 0 or config.budget_bytes <= 0:
            self.images = None
            return
        self.images = ImagePools(
            self.factory,
            self._parking,
            Demand(per_kind_max=config.per_kind_max),
            budget_bytes=config.budget_bytes,
            busy=self._busy,
            held_elsewhere=self._warm_budgeted_bytes,
        )

    @property
    def slots_dir(self) -> Path:
        return self.factory.slots_dir

    @property
    def free_count(self) -> int:
        """The default pool's free slots (what the host's ``warm_slots`` says)."""
        return self.warm.free_count

    @property
    def parked_count(self) -> int:
        """The default pool's parked sandboxes, of the pool image (the host's ``parked_slots``)."""
        return self.warm.parked_count

    @property
    def images_count(self) -> int:
        """The per-image pools' parked sandboxes (the ``images`` kind of ``paddock_host_pool_slots``)."""
        return self.images.count if self.images is not None else 0

    def _warm_held_bytes(self) -> int:
        return sum(parked_memory_bytes(slot.parked) for slot in self.warm._free if slot.parked is not None)

    def _warm_budgeted_bytes(self) -> int:
        return sum(budgeted_bytes(slot.parked) for slot in self.warm._free if slot.parked is not None)

    def held_bytes(self) -> int:
        """Host memory the parked sandboxes hold now (the default pool's and the per-image pools')."""
        return self._warm_held_bytes() + (self.images.held_bytes() if self.images is not None else 0)

    def start(self) -> None:
        self.warm.start()
        if self.images is not None:
            self.images.start()

    async def close(self) -> None:
        # Both pools stop building side by side, so that what each has under way gets one wait: one
        # after the other, a loaded host's stop could wait ``close_wait_s`` twice, past what a service
        # manager (or the tests) gives a stop before killing it, which leaves the parked slots behind.
        await asyncio.gather(
            self.warm.stop_building(), *([self.images.stop_building()] if self.images is not None else [])
        )
        if self.images is not None:
            await self.images.close()
        while self._retired:
            await self.factory.destroy(self._retired.popitem()[1])
        await self.warm.close()

    async def take(self, disk_mib: int, rootfs: Path) -> Taken:
        """A slot for a create of the image at ``rootfs``: one with a sandbox of that image parked in
        it (handed over: the slot no longer records it), else a plain one. A parked slot whose disk is
        smaller than ``disk_mib`` is grown here (XFS, online). A create the default pool does not serve
        counts toward its kind's demand (``ImagePools``)."""
        key = image_key(rootfs)
        self.last_disk_mib = disk_mib
        slot: Slot | None = None
        warm = True
        default_parks = any(
            candidate.parked is not None and candidate.parked.rootfs == key for candidate in self.warm._free
        )
        if self.images is not None and not (default_parks and disk_mib >= self.warm.disk_mib):
            # Not what the default pool parks: counted, and claimed from the per-image pools if there.
            self.images.demand.record(Kind(rootfs, disk_mib))
            self.images.wake()
            slot = self.images.take(key, disk_mib)
        if slot is None:
            slot, warm = await self.warm.take(disk_mib, key if self.warm.parked_count else None)
        if slot.parked is not None and slot.disk_mib < disk_mib and slot.disk.fs == "xfs":
            try:
                await self._grow(slot, disk_mib)
            except DriverError as exc:
                log.warning("pool_grow_on_claim_failed", slot=slot.id, error=str(exc))
                await self._parking.discard(slot)
                slot, warm = await self.warm.take(disk_mib, None)
        parked, slot.parked = slot.parked, None
        return Taken(slot, parked, warm)

    def expect_snapshot_boots(self, rootfs: Path, snapshot: Path, disk_mib: int, fs: Filesystem) -> None:
        """A snapshot was taken (its disk image ``snapshot``, of the image at ``rootfs``): counted as one
        create of it on a disk of ``disk_mib``, so that a sandbox is parked on a clone of it, grown to
        that size, within the pools' memory budget, before the first boot from it asks (and
        forgotten, as any kind, minutes after the last). Nothing where the per-image pools are off."""
        if self.images is not None:
            self.images.demand.record(Kind(rootfs, disk_mib, snapshot, fs))
            self.images.wake()

    async def take_snapshot(
        self, rootfs: Path, snapshot: Path, fs: Filesystem, disk_mib: int
    ) -> Taken | None:
        """A slot with a sandbox parked on a clone of the snapshot ``snapshot`` (handed over, as ``take``
        does) on a disk of ``disk_mib``, else on the largest smaller one, grown here; None when there
        is none (the create then boots one). Counted either way toward that snapshot's demand at
        ``disk_mib``, so the next ones find a disk of their size parked."""
        self.last_disk_mib = disk_mib
        if self.images is None:
            return None
        self.images.demand.record(Kind(rootfs, disk_mib, snapshot, fs))
        self.images.wake()
        slot = self.images.take(snapshot_key(rootfs, snapshot), disk_mib)
        if slot is None:
            return None
        if slot.disk_mib < disk_mib:
            try:
                if slot.disk.fs != "xfs":
                    raise DriverError(f"a {slot.disk.fs} disk is not grown on claim")
                await asyncio.to_thread(grow_xfs, slot.disk, disk_mib, home=False)
                slot.disk_mib = disk_mib
            except DriverError as exc:
                log.warning("pool_grow_on_claim_failed", slot=slot.id, error=str(exc))
                await self._parking.discard(slot)
                return None
        parked, slot.parked = slot.parked, None
        return Taken(slot, parked, True)

    async def _grow(self, slot: Slot, disk_mib: int) -> None:
        """Grows a claimed slot's disk (a create of a size parked itself has none to grow). The grown
        superblock is not written home here (``grow_xfs(home=False)``): the freeze that would do it cost
        35-45 ms of the create's ~60; the first copy of the disk pays it instead, if it comes first."""
        await asyncio.to_thread(grow_xfs, slot.disk, disk_mib, home=False)
        slot.disk_mib = disk_mib

    async def take_for_fork(self) -> Slot:
        return await self.warm.take_for_fork()

    async def destroy(self, slot: Slot) -> None:
        """Removes every part of a slot whose container is gone."""
        await self.factory.destroy(slot)

    async def retire(self, slot: Slot, owner: str) -> None:
        """The first half of a destroy that may recycle the slot's network: everything of the slot
        but its network goes now (``SlotFactory.strip``); ``recycle(owner)`` decides, once the
        sandbox's egress rules are gone too, whether the network serves the next slot."""
        await self.factory.strip(slot)
        self._retired[owner] = slot

    async def recycle(self, owner: str) -> None:
        """The second half: the retired slot's network goes to the next slot built, if it is
        pristine, else it is destroyed. A slot retired and never recycled is destroyed at ``close``."""
        slot = self._retired.pop(owner, None)
        if slot is not None:
            await self.factory.recycle(slot)

    async def reclaim(self, owned: set[str], kept_images: set[str]) -> None:
        """Removes the slots (warm, parked or half-made) whose id is not in ``owned``, stopping what is
        parked in them, and the loop devices of the slots' images but those in ``kept_images``."""
        for slot in self.factory.load_all():
            if slot.id not in owned:
                log.info("reclaiming_orphan_slot", slot=slot.id, parked=slot.parked is not None)
                await self._parking.discard(slot)
        for device in await rootdisks.detach_stray_loops(self.factory.slots_dir, kept_images):
            log.info("detached_stray_loop", device=device)
