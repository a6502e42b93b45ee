"""How the per-image pools size themselves (drivers/runtime/pool.py): ``Demand`` turns creates per image
into parked sandboxes wanted, and ``ImagePools`` parks them within its memory budget, busiest image
first. Unit seams (a stand-in factory and parking) beside the live tests in test_pools_images.py."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from paddock_hostagent.drivers.runtime import pool as pool_module
from paddock_hostagent.drivers.runtime.pool import Demand, ImagePools, Kind, Parking, SlotFactory, image_key

MIB = 1 << 20


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_demand_parks_one_per_image_asked_for_more_as_it_is_busier_and_forgets_it() -> None:
    clock = _Clock()
    demand = Demand(per_kind_max=4, clock=clock)
    devbox = Kind(Path("/images/devbox_1/rootfs"), 10240)
    template = Kind(Path("/images/tpl_x/rootfs"), 2048)
    assert demand.targets() == {}
    demand.record(devbox)
    assert demand.targets() == {devbox: 1}
    for _ in range(30):  # 10 creates/s for 3 s
        clock.now += 0.1
        demand.record(template)
    targets = demand.targets()
    assert list(targets) == [template, devbox]  # busiest first
    assert targets[template] == 4  # bounded by per_kind_max
    clock.now += 30  # the burst is over: back to one, kept while the kind was asked for lately
    assert demand.targets()[template] == 1
    clock.now += 240  # one create four minutes ago: forgotten; thirty, not yet
    assert demand.targets() == {template: 1}
    clock.now += 600  # nor they, fourteen minutes on
    assert demand.targets() == {}


class _Factory:
    def __init__(self) -> None:
        self.destroyed: list[str] = []

    async def build(self, disk_mib: int, *, with_disk: bool = True) -> Any:
        await asyncio.sleep(0)
        return SimpleNamespace(id=secrets.token_hex(4), disk_mib=disk_mib, parked=None)

    async def destroy(self, slot: Any) -> None:
        self.destroyed.append(slot.id)


class _Parking:
    def __init__(self, factory: _Factory) -> None:
        self.factory = factory
        self.parked: list[Path] = []

    async def park_image(self, slot: Any, rootfs: Path) -> None:
        slot.parked = SimpleNamespace(rootfs=image_key(rootfs), cgroups_path=f"/parked-{slot.id}")
        self.parked.append(rootfs)

    async def discard(self, slot: Any) -> None:
        await self.factory.destroy(slot)


async def _until(predicate: Any, what: str) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    assert predicate(), what


async def test_image_pools_park_the_busiest_images_within_the_memory_budget(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Each parked sandbox holds 100 MiB (its cgroup, stood in for); a budget of 250 MiB, 100 of which the
    default pool holds, leaves room for one: the busier image gets it, the other none."""
    monkeypatch.setattr(pool_module, "parked_memory_bytes", lambda parked: 100 * MIB)
    busy, quiet = tmp_path / "busy", tmp_path / "quiet"
    busy.mkdir()
    quiet.mkdir()
    factory = _Factory()
    parking = _Parking(factory)
    demand = Demand(per_kind_max=4)
    pools = ImagePools(
        cast(SlotFactory, factory),
        cast(Parking, parking),
        demand,
        budget_bytes=250 * MIB,
        busy=lambda: False,
        held_elsewhere=lambda: 100 * MIB,
    )
    pools.tick_s = 0.02
    for _ in range(5):
        demand.record(Kind(busy, 1024))
    demand.record(Kind(quiet, 1024))
    pools.start()
    try:
        await _until(lambda: pools.count == 1, "nothing was parked")
        await asyncio.sleep(0.1)
        assert parking.parked == [busy] and pools.held_bytes() == 100 * MIB
        slot = pools.take(image_key(busy), 2048)
        assert slot is not None and slot.disk_mib == 1024  # to be grown on claim
        assert pools.take(image_key(quiet), 10240) is None
        await _until(lambda: pools.count == 1, "the claimed one was not replaced")
    finally:
        await pools.close()
    assert pools.count == 0 and len(factory.destroyed) == 1  # what was left parked is stopped


async def test_each_parked_sandbox_counts_at_least_the_kernels_share(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """An idle parked sandbox's cgroup holds ~0.5 MiB; the budget counts it at PARKED_FLOOR_BYTES (16 MiB:
    its disk's mount, loop device and network namespace are in no cgroup). 80 MiB admits five of a busy
    image wanting eight, not all eight: the first counted at DEFAULT_COST_BYTES (64 MiB, nothing
    measured yet), then 16 MiB each."""
    monkeypatch.setattr(pool_module, "parked_memory_bytes", lambda parked: MIB // 2)
    image = tmp_path / "image"
    image.mkdir()
    factory = _Factory()
    demand = Demand(per_kind_max=8)
    pools = ImagePools(
        cast(SlotFactory, factory),
        cast(Parking, _Parking(factory)),
        demand,
        budget_bytes=80 * MIB,
        busy=lambda: False,
    )
    pools.tick_s = 0.02
    for _ in range(100):  # ~14 creates/s
        demand.record(Kind(image, 1024))
    assert demand.targets() == {Kind(image, 1024): 8}
    pools.start()
    try:
        await _until(lambda: pools.count == 5, "the pool did not park five")
        await asyncio.sleep(0.15)
        assert pools.count == 5 and pools.held_bytes() == 5 * MIB // 2
    finally:
        await pools.close()


async def test_image_pools_neither_park_nor_stop_while_a_create_is_claiming(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """While ``busy`` (a create, fork or boot in flight, its claim included) the pools hold off parking
    one and stopping one, for at most ``busy_wait_s``; once it is quiet they go on. Before, a stop did
    not wait, and a create of a kind not parked yet had its claim share the CPU with the parking it
    had just asked for."""
    monkeypatch.setattr(pool_module, "parked_memory_bytes", lambda parked: MIB)
    monkeypatch.setattr(pool_module.WarmPool, "busy_wait_s", 30.0)
    image = tmp_path / "image"
    image.mkdir()
    factory = _Factory()
    parking = _Parking(factory)
    demand = Demand(per_kind_max=4)
    busy = {"now": True}
    pools = ImagePools(
        cast(SlotFactory, factory),
        cast(Parking, parking),
        demand,
        budget_bytes=1024 * MIB,
        busy=lambda: busy["now"],
    )
    pools.tick_s = 0.02
    demand.record(Kind(image, 1024))
    pools.start()
    try:
        await asyncio.sleep(0.3)
        assert parking.parked == [], "it parked while a create was claiming"
        busy["now"] = False
        await _until(lambda: pools.count == 1, "nothing was parked once quiet")

        busy["now"] = True
        monkeypatch.setattr(demand, "targets", lambda: {})  # no longer wanted
        pools.wake()
        await asyncio.sleep(0.3)
        assert pools.count == 1 and factory.destroyed == [], "it stopped one while a create was claiming"
        busy["now"] = False
        await _until(lambda: factory.destroyed != [], "the unwanted one was not stopped once quiet")
        assert pools.count == 0
    finally:
        await pools.close()
