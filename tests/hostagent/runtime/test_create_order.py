"""The order of a create's steps in ``OciRuntime.create`` (drivers/runtime/oci.py): its slot is taken
while counted as a boot in flight (the pools' ``busy``), and the egress hook's nftables batch starts
before the claim of a parked sandbox, so the two run side by side (the claim is synchronous, on the
loop; the batch runs in a thread). A unit seam: the runtime's own steps are stood in for, the pools and
the hook recorded; the live creates are in test_parked_pool.py and test_pools_images.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from paddock_hostagent.drivers.runtime import oci
from paddock_hostagent.drivers.runtime.oci import OciRuntime
from paddock_hostagent.drivers.runtime.pool import Taken


def _runtime(pool: object) -> OciRuntime:
    """An ``OciRuntime`` with no host behind it: only what ``create`` reads before its own steps."""
    runtime = OciRuntime.__new__(OciRuntime)
    runtime._booting = 0
    runtime.pool = cast(Any, pool)
    runtime.options = cast(Any, SimpleNamespace(runtime="crun"))
    return runtime


class _Claimed(Exception):
    pass


async def test_a_creates_claim_counts_as_a_boot_in_flight() -> None:
    """``OciRuntime.create`` takes its slot (a grow on claim included) while counted in ``_booting``,
    which is the pools' ``busy``; the count is back to none whatever the take did."""
    seen: list[int] = []

    class _Pool:
        async def take(self, disk_mib: int, rootfs: Path) -> Any:
            seen.append(runtime._booting)
            raise _Claimed

    runtime = _runtime(_Pool())
    spec = SimpleNamespace(shape=SimpleNamespace(disk_mib=4096), rootfs=Path("/images/debian"))
    with pytest.raises(_Claimed):
        await runtime.create(cast(Any, spec))
    assert seen == [1] and runtime._booting == 0


async def test_the_egress_hook_starts_before_a_parked_sandbox_is_claimed(monkeypatch: Any) -> None:
    order: list[str] = []
    slot = SimpleNamespace(disk_mib=2048, parked=None)
    parked = SimpleNamespace(cgroups_path="/parked", container_id="c1", init_pid=1, init_ticks=1)

    class _Pool:
        async def take(self, disk_mib: int, rootfs: Any) -> Taken:
            return Taken(cast(Any, slot), cast(Any, parked), True)

    async def hook(record: Any) -> None:
        order.append("hook started")
        await asyncio.sleep(0.01)  # the batch, in its thread
        order.append("hook done")

    async def started(record: Any, handle: Any, *, start_paused: bool) -> None:
        order.append("started")

    runtime = _runtime(_Pool())
    monkeypatch.setattr(oci._Handle, "of_parked", classmethod(lambda cls, *args: SimpleNamespace()))
    monkeypatch.setattr(runtime, "_record", lambda spec, handle: SimpleNamespace(id="sb-1"))
    monkeypatch.setattr(runtime, "_claim", lambda spec, handle: order.append("claim"))
    monkeypatch.setattr(runtime, "_started", started)
    spec = SimpleNamespace(id="sb-1", shape=SimpleNamespace(disk_mib=2048), rootfs="/images/debian")

    await runtime.create(cast(Any, spec), on_network=hook)

    assert order == ["hook started", "claim", "started", "hook done"], order
