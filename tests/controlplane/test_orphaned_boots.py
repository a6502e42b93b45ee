"""A create or fork whose control plane died before its host answered: the reconciler ends it ``failed``
once no live process could still record it, and destroys what the host started.

The dead process is simulated by moving a booted row back to ``creating``/``forking`` (the state a
process leaves when it dies between its two transactions) and the clock past the boot deadline;
tests/multihost shows it with a control plane really SIGKILLed mid-create.
"""

from __future__ import annotations

from sqlalchemy import update

from paddock_controlplane import reconciler
from paddock_controlplane.models import Sandbox
from paddock_core.db import transaction
from tests.controlplane.conftest import Clocked, user_client


async def _left_in(clocked: Clocked, sandbox_id: str, status: str, **values: object) -> None:
    async with transaction(clocked.services.sessions) as session:
        await session.execute(update(Sandbox).where(Sandbox.id == sandbox_id).values(status=status, **values))


async def test_a_boot_no_process_will_record_ends_failed_and_is_destroyed_on_its_host(
    clocked: Clocked,
) -> None:
    _, http = await user_client(clocked)
    async with http:
        ids = []
        for _ in range(3):
            made = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})
            assert made.status_code == 200, made.text
            ids.append(made.json()["data"]["id"])
        created, forked, young = ids
        await _left_in(clocked, created, "creating")
        await _left_in(clocked, forked, "forking")
        deadline_s = clocked.services.settings.boot_timeout_s + reconciler.ORPHAN_AFTER_S
        clocked.clock.advance(deadline_s + 1)
        await _left_in(clocked, young, "creating", created_at=clocked.clock())
        clocked.host.calls.clear()

        await clocked.reconcile(reconciler.orphaned_boots_pass)

        for sandbox_id in (created, forked):
            view = (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]
            assert view["status"] == "failed", view
            assert view["status_reason"] == reconciler.ORPHANED_BOOT_REASON
        assert sorted(c for c in clocked.host.calls if c[0] == "destroy") == sorted(
            [("destroy", created), ("destroy", forked)]
        )
        # Within its deadline a boot may still be recorded by the process that runs it: left alone.
        assert (await http.get(f"/v1/sandboxes/{young}")).json()["data"]["status"] == "creating"


async def test_a_template_boot_is_given_its_image_fetch_as_well(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        made = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})
        sandbox_id = made.json()["data"]["id"]
        await _left_in(clocked, sandbox_id, "creating", rootfs="tpl_0123456789abcdef")
        clocked.clock.advance(clocked.services.settings.boot_timeout_s + reconciler.ORPHAN_AFTER_S + 1)
        await clocked.reconcile(reconciler.orphaned_boots_pass)
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "creating"
        clocked.clock.advance(reconciler.IMAGE_FETCH_BOUND_S)
        await clocked.reconcile(reconciler.orphaned_boots_pass)
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["status"] == "failed"
