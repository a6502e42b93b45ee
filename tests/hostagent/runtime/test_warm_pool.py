"""The warm pool's refill: slots are built between bursts of boots, not during them."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from paddock_hostagent.drivers.runtime.pool import ImagePools, SlotFactory, SlotPool, WarmPool
from paddock_hostagent.drivers.storage import mounts, rootdisks


class _Factory:
    """Builds stand-in slots and records when."""

    def __init__(self) -> None:
        self.built: list[float] = []
        self.slots: list[_StandIn] = []
        self.destroyed = 0
        self.destroyed_ids: list[str] = []

    async def build(self, disk_mib: int, *, with_disk: bool = True) -> Any:
        await asyncio.sleep(0)
        self.built.append(asyncio.get_running_loop().time())
        self.slots.append(_StandIn(disk_mib))
        return self.slots[-1]

    async def destroy(self, slot: Any) -> None:
        self.destroyed += 1
        self.destroyed_ids.append(slot.id)

    async def close(self) -> None:
        pass


class _StandIn:
    def __init__(self, disk_mib: int) -> None:
        self.disk_mib = disk_mib
        self.id = secrets.token_hex(4)
        self.disk = SimpleNamespace(mount_dir=Path("/nonexistent") / self.id)  # nothing to unmount
        self.parked: Any = None


def _pool(factory: _Factory, size: int, busy: list[bool], parker: Any = None) -> WarmPool:
    pool = WarmPool(cast(SlotFactory, factory), size, 1024, busy=lambda: busy[0], parker=parker)
    pool.refill_delay_s = 0.0
    pool.busy_poll_s = 0.01
    return pool


async def test_the_pool_refills_once_the_boots_in_flight_are_done() -> None:
    factory, busy = _Factory(), [True]
    pool = _pool(factory, 3, busy)
    pool.busy_wait_s = 30.0
    pool.start()
    await asyncio.sleep(0.2)
    assert factory.built == []  # boots in flight: the refill holds off
    busy[0] = False
    await pool.wait_full(timeout_s=5)
    assert pool.free_count == 3
    slot, warm = await pool.take(1024)
    assert warm and slot.disk_mib == 1024
    await pool.close()
    assert factory.destroyed == 3 - 1  # the free slots; the taken one is its sandbox's


async def test_a_steady_stream_of_boots_still_gets_its_slots() -> None:
    factory, busy = _Factory(), [True]
    pool = _pool(factory, 2, busy)
    pool.busy_wait_s = 0.1
    started = asyncio.get_running_loop().time()
    pool.start()
    await pool.wait_full(timeout_s=5)
    assert pool.free_count == 2
    assert factory.built[0] - started >= 0.1  # it waited for a pause first, then built anyway
    await pool.close()


async def test_an_empty_pool_builds_on_demand() -> None:
    factory = _Factory()
    pool = _pool(factory, 0, [False])
    slot, warm = await pool.take(2048)
    assert not warm and slot.disk_mib == 2048


async def test_a_full_pool_readies_one_slot_for_a_fork_and_creates_take_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork no longer waits for its warm slot's disk to unmount: the pool did it ahead, on one slot.
    A create takes a mounted slot while there is one, and mounts the readied one again otherwise."""
    unmounted: list[Path] = []
    mounted: list[Path] = []

    async def attach(disk: Any) -> None:
        mounted.append(disk.mount_dir)

    monkeypatch.setattr(mounts, "unmount", unmounted.append)
    monkeypatch.setattr(rootdisks, "attach", attach)
    factory = _Factory()
    pool = _pool(factory, 3, [False])
    pool.start()
    deadline = asyncio.get_running_loop().time() + 5
    while not (unmounted and pool.free_count == 3):
        assert asyncio.get_running_loop().time() < deadline, "the pool readied no slot for a fork"
        await asyncio.sleep(0.01)
    assert len(unmounted) == 1
    created, _ = await pool.take(1024)
    assert created.disk.mount_dir not in unmounted and mounted == []
    forked = await pool.take_for_fork()
    assert forked.disk.mount_dir == unmounted[0]
    # Refilled and readied again; then creates take every free slot, the readied one last.
    deadline = asyncio.get_running_loop().time() + 5
    while not (len(unmounted) == 2 and pool.free_count == 3):
        assert asyncio.get_running_loop().time() < deadline, "the pool did not ready another slot"
        await asyncio.sleep(0.01)
    taken = [(await pool.take(1024))[0] for _ in range(3)]
    assert [slot.disk.mount_dir for slot in taken][-1] == unmounted[1]
    assert mounted == [unmounted[1]]
    await pool.close()


class _Parker:
    """Parks stand-in sandboxes of ``rootfs`` once it is set (as the host agent does once its pool
    image is on the host); ``failing`` makes the next park raise."""

    def __init__(self, rootfs: str | None) -> None:
        self.rootfs = rootfs
        self.failing = False
        self.discarded: list[str] = []

    async def park(self, slot: Any) -> bool:
        await asyncio.sleep(0)
        if self.failing:
            self.failing = False
            raise RuntimeError("crun failed")
        if self.rootfs is None:
            return False
        slot.parked = SimpleNamespace(rootfs=self.rootfs)
        return True

    async def discard(self, slot: Any) -> None:
        self.discarded.append(slot.id)


async def _until(condition: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


@pytest.fixture
def no_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    async def attach(disk: Any) -> None:
        pass

    monkeypatch.setattr(mounts, "unmount", lambda path: None)
    monkeypatch.setattr(rootdisks, "attach", attach)


async def test_creates_of_the_pool_image_claim_parked_slots_and_nothing_else_does(no_mounts: None) -> None:
    parker = _Parker("/images/debian/rootfs")
    pool = _pool(_Factory(), 3, [False], parker)
    pool.start()
    await _until(lambda: pool.free_count == 3 and pool.parked_count == 2, "the pool parked no sandboxes")
    other, _ = await pool.take(1024, "/images/template/rootfs")
    assert other.parked is None  # another image: the plain slot (the one readied for a fork)
    await _until(lambda: pool.free_count == 3, "the pool did not refill")
    forked = await pool.take_for_fork()
    assert forked.parked is None  # a fork never gets a parked slot: its disk holds what that one wrote
    claimed, warm = await pool.take(1024, "/images/debian/rootfs")
    assert warm and claimed.parked is not None and claimed.parked.rootfs == "/images/debian/rootfs"
    await pool.close()
    assert len(parker.discarded) == pool.size - 1 - 1  # what was left parked is stopped, not just dropped


async def test_slots_built_before_the_pool_image_arrived_are_parked_later(no_mounts: None) -> None:
    parker = _Parker(None)
    pool = _pool(_Factory(), 3, [False], parker)
    pool.start()
    await _until(lambda: pool.free_count == 3, "the pool did not fill")
    assert pool.parked_count == 0
    parker.rootfs = "/images/debian/rootfs"
    await pool.take(1024, "/images/debian/rootfs")  # any take wakes the refill
    await _until(lambda: pool.parked_count == 2, "the plain slots were not parked once the image was there")
    await pool.close()


async def test_a_slot_whose_parking_failed_is_destroyed_and_the_pool_goes_on(no_mounts: None) -> None:
    parker = _Parker("/images/debian/rootfs")
    parker.failing = True
    factory = _Factory()
    pool = _pool(factory, 3, [False], parker)
    pool.park_retry_s = 0.0
    pool.start()
    await _until(lambda: pool.free_count == 3 and pool.parked_count == 2, "the pool did not recover")
    assert factory.destroyed == 1 and len(factory.built) == 4
    assert pool.last_error is None or "crun failed" in pool.last_error
    await pool.close()


async def test_a_drained_pool_with_a_parker_readies_a_slot_for_forks_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork can use no parked slot: once a burst has drained the pool, the first slot refilled is the
    one readied for forks, and the next ones are parked for creates."""
    unmounted: list[Path] = []

    async def attach(disk: Any) -> None:
        pass

    monkeypatch.setattr(mounts, "unmount", unmounted.append)
    monkeypatch.setattr(rootdisks, "attach", attach)
    factory = _Factory()
    pool = _pool(factory, 3, [False], _Parker("/images/debian/rootfs"))
    pool.start()
    await _until(lambda: pool.free_count == 3 and pool.parked_count == 2, "the pool did not fill")
    for _ in range(3):
        await pool.take(1024, "/images/debian/rootfs")
    await _until(lambda: pool.free_count >= 1, "the pool did not refill")
    first = pool._free[0]
    assert first.parked is None and first.disk.mount_dir == unmounted[-1]
    forked = await pool.take_for_fork()
    assert forked is first  # the fork took the readied slot, not one built on demand
    await pool.close()


class _EndlessParker(_Parker):
    """A parking whose boot does not end (a guest agent that never answers, a host too loaded)."""

    def __init__(self) -> None:
        super().__init__("/images/debian/rootfs")
        self.parking: list[Any] = []

    async def park(self, slot: Any) -> bool:
        self.parking.append(slot)
        slot.parked = SimpleNamespace(rootfs=self.rootfs)  # recorded before the boot, as the driver does
        try:
            await asyncio.Event().wait()
        except BaseException:
            slot.parked = None  # the driver stops the half-booted container on the way out
            raise
        return True


async def test_a_stop_that_outlasts_a_parking_removes_the_slot_being_parked(no_mounts: None) -> None:
    """An agent stopped while a sandbox is being parked: its pool's close waits ``close_wait_s`` for the
    parking, then cancels it; the slot it was parking in is removed with the others, not left behind."""
    factory = _Factory()
    parker = _EndlessParker()
    pool = _pool(factory, 3, [False], parker)
    pool.close_wait_s = 0.2
    pool.start()
    await _until(lambda: parker.parking, "no parking began")
    await pool.close()
    assert pool.free_count == 0
    assert sorted(factory.destroyed_ids + parker.discarded) == sorted(slot.id for slot in factory.slots)
    assert parker.parking[0].id in factory.destroyed_ids


async def test_a_runtimes_pools_stop_building_side_by_side(no_mounts: None) -> None:
    """An agent stopped while both its default pool and its per-image pools are parking: each waits
    ``close_wait_s`` for what it has under way, and the two waits overlap. One after the other, a loaded
    CI box's agent stop outlasted the 60 s it was given, was killed and left its parked slots behind."""
    factory = _Factory()
    slots = SlotPool(
        cast(SlotFactory, factory),
        3,
        1024,
        runtime=cast(Any, None),
        busy=lambda: False,
        parks=False,
        pool_rootfs=None,
    )
    parkers = [_EndlessParker(), _EndlessParker()]
    slots.warm, images = (_pool(factory, 2, [False], parker) for parker in parkers)
    slots.images = cast(ImagePools, images)  # a pool with the same stop as the per-image pools'
    for pool in (slots.warm, images):
        pool.close_wait_s = 1.0
        pool.start()
    await _until(lambda: all(parker.parking for parker in parkers), "no parking began")
    started = asyncio.get_running_loop().time()
    await slots.close()
    assert asyncio.get_running_loop().time() - started < 1.8  # one wait, not two
    assert sorted(factory.destroyed_ids + parkers[0].discarded + parkers[1].discarded) == sorted(
        slot.id for slot in factory.slots
    )
