"""Per-second billing, credit exhaustion and idle auto-pause, with the control plane's clock moved by hand.

The host is the fake seam (these are the control plane's rules); tests/integration shows the same
lifecycle on real sandboxes.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from paddock_controlplane.records.models import CreditEntry
from paddock_controlplane.records.snapshots import READY as SNAPSHOT_READY
from paddock_controlplane.records.snapshots import Snapshot
from paddock_controlplane.records.volumes import READY as VOLUME_READY
from paddock_controlplane.records.volumes import Volume
from paddock_controlplane.resources import accounts
from paddock_controlplane.workers import reconciler
from paddock_core.db import make_engine, make_sessionmaker
from paddock_core.ids import new_id
from tests.controlplane.conftest import Clocked, user_client
from tests.controlplane.fakehost import HOST_BEAT

pytestmark = pytest.mark.db

# s-1vcpu-1gb: 1 vCPU at 0.0504 USD/h + 1 GiB at 0.0162 USD/h, 100 credits per USD.
PER_SECOND_MICRO = 1400 + 450
HOST = str(HOST_BEAT["id"])


async def test_running_time_is_billed_per_second_and_paused_time_is_free(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    async with http:
        start = await clocked.balance(user_id)
        assert start == 500 * accounts.MICRO
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        clocked.clock.advance(3600)
        assert (await http.post(f"/v1/sandboxes/{sid}/pause")).status_code == 200
        # One hour of 1 vCPU + 1 GiB: 0.0666 USD = 6.66 credits, to the micro-credit.
        assert start - await clocked.balance(user_id) == 6_660_000
        clocked.clock.advance(1000)
        await clocked.reconcile(reconciler.billing_pass)
        assert start - await clocked.balance(user_id) == 6_660_000, "nothing is charged while paused"
        assert (await http.post(f"/v1/sandboxes/{sid}/resume")).status_code == 200
        clocked.clock.advance(10)
        await clocked.reconcile(reconciler.billing_pass)
        assert start - await clocked.balance(user_id) == 6_660_000 + 10 * PER_SECOND_MICRO
        clocked.clock.advance(5)
        await http.delete(f"/v1/sandboxes/{sid}")
        assert start - await clocked.balance(user_id) == 6_660_000 + 15 * PER_SECOND_MICRO
        assert (await http.get("/v1/whoami")).json()["data"]["stats"]["running"] == 0
    # Every charge is a line of the ledger, named after the sandbox: they add up to the balance's fall.
    engine = make_engine(clocked.cp.settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            lines = (await session.scalars(select(CreditEntry).where(CreditEntry.user_id == user_id))).all()
    finally:
        await engine.dispose()
    charges = [line for line in lines if line.kind == "compute"]
    assert len(charges) >= 3 and {line.ref for line in charges} == {sid}
    assert -sum(line.amount_micro for line in charges) == 6_660_000 + 15 * PER_SECOND_MICRO
    assert all(line.created_at is not None for line in charges)


async def test_a_quota_shape_pays_for_its_share_of_a_cpu(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    async with http:
        start = await clocked.balance(user_id)
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-0.25vcpu-512mb"})).json()["data"]["id"]
        clocked.clock.advance(100)
        await http.post(f"/v1/sandboxes/{sid}/pause")
        # A quarter of a vCPU (350/s) and half a GiB (225/s).
        assert start - await clocked.balance(user_id) == 100 * (350 + 225)


async def test_running_out_of_credit_pauses_sandboxes_and_blocks_resume(clocked: Clocked) -> None:
    _, http = await user_client(clocked, credits=1)  # 1 credit lasts 540 s on s-1vcpu-1gb
    async with http:
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        clocked.clock.advance(500)
        await clocked.reconcile(reconciler.billing_pass)
        assert (await http.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "running"
        assert ("pause", sid) not in clocked.host.calls
        clocked.clock.advance(100)
        await clocked.reconcile(reconciler.billing_pass)
        await clocked.status(http, sid, "paused")
        refused = await http.post(f"/v1/sandboxes/{sid}/resume")
        assert refused.status_code == 402, refused.text
        create = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert create.status_code == 402, create.text


async def test_an_idle_sandbox_pauses_itself_and_activity_postpones_it(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        body = {"shape": "s-1vcpu-256mb", "auto_pause_after_seconds": 60}
        sid = (await http.post("/v1/sandboxes", json=body)).json()["data"]["id"]
        busy = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]
        clocked.clock.advance(50)
        assert (await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})).status_code == 200
        clocked.clock.advance(30)  # 80 s after creation, 30 s after the last command
        await clocked.reconcile(reconciler.idle_pass)
        # the clock stands still until the next advance, so no pass (ours or the loop's) pauses it now
        assert (await http.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "running"
        assert ("pause", sid) not in clocked.host.calls
        clocked.clock.advance(31)
        await clocked.reconcile(reconciler.idle_pass)
        await clocked.status(http, sid, "paused")
        assert (await http.get(f"/v1/sandboxes/{busy}")).json()["data"]["status"] == "running", (
            "no timeout set: never auto-paused"
        )


async def _keep(clocked: Clocked, *rows: Snapshot | Volume) -> None:
    engine = make_engine(clocked.cp.settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            session.add_all(rows)
    finally:
        await engine.dispose()


def _volume(user_id: str, name: str, size_mib: int, status: str, now: dt.datetime) -> Volume:
    return Volume(
        id=new_id("vol_"),
        user_id=user_id,
        name=name,
        status=status,
        host_id=HOST,
        size_mib=size_mib,
        created_at=now,
    )


async def test_kept_snapshots_and_volumes_are_billed_by_the_gib_month(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    await http.aclose()
    start, now = await clocked.balance(user_id), clocked.clock()
    volume = _volume(user_id, "data", 1024, VOLUME_READY, now)
    snapshot = Snapshot(
        id=new_id("snap_"), user_id=user_id, name="s", status=SNAPSHOT_READY, host_id=HOST, source_sandbox_id="x",
        image="debian:13", disk_mib=1024, size_bytes=512 << 20, created_at=now,
    )  # fmt: skip
    being_made = _volume(user_id, "later", 4096, "creating", now)  # not kept yet: not billed
    await _keep(clocked, volume, snapshot, being_made)
    # A month (30 days) of 1 GiB of volume and 0.5 GiB of snapshot at 0.10 USD per GiB-month: 15 credits.
    clocked.clock.advance(30 * 86_400)
    await clocked.reconcile(reconciler.storage_billing_pass)
    assert start - await clocked.balance(user_id) == 15 * accounts.MICRO
    # The next pass charges only what was kept since: an hour more.
    clocked.clock.advance(3600)
    await clocked.reconcile(reconciler.storage_billing_pass)
    hour = (1024 * 3600 * 10_000_000) // (1024 * 2_592_000) + (512 * 3600 * 10_000_000) // (1024 * 2_592_000)
    assert start - await clocked.balance(user_id) == 15 * accounts.MICRO + hour
    engine = make_engine(clocked.cp.settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            lines = (
                await session.scalars(
                    select(CreditEntry).where(CreditEntry.user_id == user_id, CreditEntry.kind == "storage")
                )
            ).all()
    finally:
        await engine.dispose()
    assert {line.ref for line in lines} == {volume.id, snapshot.id}
    assert -sum(line.amount_micro for line in lines) == 15 * accounts.MICRO + hour


async def test_storage_that_empties_an_account_pauses_its_sandboxes(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked, credits=1)
    async with http:
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        await _keep(clocked, _volume(user_id, "big", 100 * 1024, VOLUME_READY, clocked.clock()))
        # 100 GiB kept: 10 credits a month, so 1 credit lasts three days.
        clocked.clock.advance(60)
        await clocked.reconcile(reconciler.storage_billing_pass)
        assert (await http.get(f"/v1/sandboxes/{sid}")).json()["data"]["status"] == "running"
        clocked.clock.advance(4 * 86_400)
        await clocked.reconcile(reconciler.storage_billing_pass)
        await clocked.status(http, sid, "paused")
        assert await clocked.balance(user_id) < 0
