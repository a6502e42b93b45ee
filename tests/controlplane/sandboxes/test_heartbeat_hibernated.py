"""A host's hibernated sandboxes as a summary in its heartbeat (``paddock_core/heartbeat.py``): a beat
that leaves them out, with a digest the control plane holds too, leaves them as they are (before, a
host of 10,000 hibernated sandboxes listed every one in every beat, 1.1 MiB and ~1.3 s of the control
plane's time); a digest that differs (the host lost one, or the host comes back from the dead) makes
the control plane ask for one beat that lists them, and that beat settles each as a listed beat always
did."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import update

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.sandboxes import host_reports
from paddock_core.db import transaction
from paddock_core.heartbeat import ids_digest
from tests.controlplane.conftest import HOST_TOKEN, Clocked, user_client
from tests.controlplane.fakehost import HOST_BEAT

pytestmark = pytest.mark.db


def beat(
    running: list[str], hibernated: list[str] | None, *, listed: bool, held: list[str]
) -> dict[str, Any]:
    """A heartbeat of the test host: ``running`` reported running, ``held`` its hibernated sandboxes
    (summarised), listed as ``paused`` too when ``listed``; no summary at all when ``hibernated`` is None."""
    reports = [{"id": i, "status": "running", "oom_kills": 0, "last_activity_at": 1.0} for i in running]
    if listed:
        reports += [{"id": i, "status": "paused", "oom_kills": 0, "last_activity_at": 1.0} for i in held]
    body: dict[str, Any] = {**HOST_BEAT, "sandboxes": reports}
    if hibernated is not None:
        body["hibernated"] = {"count": len(hibernated), "digest": ids_digest(hibernated), "listed": listed}
    return body


async def send(clocked: Clocked, body: dict[str, Any]) -> dict[str, Any]:
    answer = await clocked.cp.http.post(
        "/internal/v1/hosts/heartbeat", json=body, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def hibernate_rows(clocked: Clocked, ids: list[str], **values: Any) -> None:
    """As a hibernation the host committed leaves the rows (the fake host does not hibernate)."""
    async with transaction(clocked.services.sessions) as session:
        await session.execute(
            update(Sandbox)
            .where(Sandbox.id.in_(ids))
            .values(status="paused", hibernated=True, paused_at=clocked.clock(), **values)
        )


async def statuses(api: httpx.AsyncClient, ids: list[str]) -> dict[str, str]:
    return {i: (await api.get(f"/v1/sandboxes/{i}")).json()["data"]["status"] for i in ids}


async def made(api: httpx.AsyncClient, count: int) -> list[str]:
    return [
        (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        for _ in range(count)
    ]


async def test_hibernated_sandboxes_left_out_of_a_beat_with_their_digest_stay_paused(
    clocked: Clocked,
) -> None:
    _, api = await user_client(clocked)
    async with api:
        live, *asleep = await made(api, 3)
        await hibernate_rows(clocked, asleep)
        clocked.clock.advance(host_reports.REPORT_GRACE_S + 1)
        answer = await send(clocked, beat([live], asleep, listed=False, held=asleep))
        assert answer["hibernated_summary"] == "ok"
        assert await statuses(api, [live, *asleep]) == {live: "running", **dict.fromkeys(asleep, "paused")}
        # The same beat again is answered from the digest kept, and still changes nothing.
        assert (await send(clocked, beat([live], asleep, listed=False, held=asleep)))[
            "hibernated_summary"
        ] == "ok"
        # An agent that sends no summary lists them all, as before, and is answered nothing new.
        old = await send(clocked, beat([live], None, listed=True, held=asleep))
        assert "hibernated_summary" not in old
        assert await statuses(api, [live, *asleep]) == {live: "running", **dict.fromkeys(asleep, "paused")}


async def test_a_digest_that_differs_asks_for_a_listed_beat_which_finds_the_one_the_host_lost(
    clocked: Clocked,
) -> None:
    _, api = await user_client(clocked)
    async with api:
        live, kept, lost = await made(api, 3)
        await hibernate_rows(clocked, [kept, lost])
        clocked.clock.advance(host_reports.REPORT_GRACE_S + 1)
        # The host holds only one of them now: a summary alone decides nothing, it asks for the list.
        assert (await send(clocked, beat([live], [kept], listed=False, held=[kept])))[
            "hibernated_summary"
        ] == "full"
        assert await statuses(api, [kept, lost]) == {kept: "paused", lost: "paused"}
        listed = await send(clocked, beat([live], [kept], listed=True, held=[kept]))
        assert listed["hibernated_summary"] == "full"  # the digest read before this beat's fold
        assert await statuses(api, [live, kept, lost]) == {live: "running", kept: "paused", lost: "error"}
        assert (await send(clocked, beat([live], [kept], listed=False, held=[kept])))[
            "hibernated_summary"
        ] == "ok"


async def test_hibernated_sandboxes_of_a_host_that_comes_back_from_the_dead_are_paused_again(
    clocked: Clocked,
) -> None:
    _, api = await user_client(clocked)
    async with api:
        asleep = await made(api, 2)
        await hibernate_rows(clocked, asleep)
        clocked.clock.advance(host_reports.REPORT_GRACE_S + 1)
        assert (await send(clocked, beat([], asleep, listed=False, held=asleep)))[
            "hibernated_summary"
        ] == "ok"
        async with transaction(clocked.services.sessions) as session:  # as the dead-host pass leaves them
            await session.execute(
                update(Sandbox)
                .where(Sandbox.id.in_(asleep))
                .values(status="error", status_reason=host_reports.HOST_DEAD_REASON)
            )
        # The host's digest is the one trusted a moment ago, but its rows need their reports to revive.
        assert (await send(clocked, beat([], asleep, listed=False, held=asleep)))[
            "hibernated_summary"
        ] == "full"
        assert await statuses(api, asleep) == dict.fromkeys(asleep, "error")
        await send(clocked, beat([], asleep, listed=True, held=asleep))
        assert await statuses(api, asleep) == dict.fromkeys(asleep, "paused")
        assert (await send(clocked, beat([], asleep, listed=False, held=asleep)))[
            "hibernated_summary"
        ] == "ok"
