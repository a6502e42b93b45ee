"""A fork's path to ``running`` (§11.9): what the control plane does before and after the host's fork,
and in what order, since the host's fork is what a client waiting for ``running`` waits on."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, select

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox, WebhookDelivery
from paddock_controlplane.records.schemas.sandboxes import ForkSandboxRequest
from paddock_controlplane.sandboxes import lifecycle
from paddock_controlplane.settings import ControlPlaneSettings
from tests.controlplane.conftest import Clocked, user_client


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # Webhook deliveries go to a closed loopback port; the tests read the outbox, not a receiver.
    return cp_settings.model_copy(update={"webhook_allow_private_targets": True})


async def test_a_fork_has_asked_its_host_by_the_time_it_answers_forking(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    async with http:
        source = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]
        clocked.host.boot_delay_s = 0.2
        clocked.host.calls.clear()

        child = await lifecycle.fork(clocked.services, user_id, source, ForkSandboxRequest())

        # The answer is ``forking`` (the contract's answer); it is made once the host has answered the
        # fork, so that a host without room makes it a 503 (below).
        assert child.status == "forking"
        assert clocked.host.calls == [("fork", child.id)]
        view = await clocked.status(http, child.id, "running")
        assert view["forked_from"] == source


async def _fork_events(clocked: Clocked) -> list[str]:
    """The payloads of the ``sandbox.fork`` deliveries in the outbox."""
    async with clocked.services.sessions() as session:
        rows = await session.scalars(
            select(WebhookDelivery.payload).where(WebhookDelivery.event_action == "sandbox.fork")
        )
        return [str(payload) for payload in rows]


async def test_a_fork_its_host_has_no_room_for_answers_503_and_records_nothing(
    clocked: Clocked, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's 507 (no room for the child's disk or memory) comes only when its fork answers: the
    fork waits for it and answers as a create does, 503 with ``Retry-After`` saying why, and leaves no
    child (no row, no name, no event) where it used to leave one that ended ``failed``."""
    _user_id, http = await user_client(clocked)
    async with http:
        hook = await http.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"})
        assert hook.status_code == 200, hook.text
        source = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]
        refusals: list[str] = []
        roomy = clocked.host.fork

        async def full(source_row: Sandbox, child: Sandbox, **options: Any) -> hostlink.Booted:
            if refusals:  # room again
                return await roomy(source_row, child, **options)
            refusals.append(child.id)
            raise hostlink.CapacityError("the host's disk has 312 MiB free, 10240 MiB requested")

        monkeypatch.setattr(clocked.host, "fork", full)
        refused = await http.post(f"/v1/sandboxes/{source}/fork", json={})

        assert refused.status_code == 503, refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 30
        body = refused.json()
        assert body["status"] == "error" and body["message"].startswith("no host with capacity"), body
        assert "10240 MiB requested" in body["message"]
        assert len(refusals) == 1, "the host was asked"
        listed = (await http.get("/v1/sandboxes", params={"limit": 100})).json()["data"]["data"]
        assert [view["id"] for view in listed] == [source]
        gone = await http.get(f"/v1/sandboxes/{refusals[0]}")
        assert gone.status_code == 404, gone.text
        assert await _fork_events(clocked) == []

        # Room again: the same request forks, and its event is written once.
        forked = await http.post(f"/v1/sandboxes/{source}/fork", json={})
        assert forked.status_code == 200, forked.text
        child = forked.json()["data"]
        assert child["status"] == "forking"
        await clocked.status(http, child["id"], "running")
        events = await _fork_events(clocked)
        assert len(events) == 1 and child["id"] in events[0] and source in events[0]


async def test_a_fork_that_fails_otherwise_still_ends_failed_with_its_event(clocked: Clocked) -> None:
    """Any other failure of the host's fork is the child's: it exists, ends ``failed`` saying why, and
    its ``sandbox.fork`` was written, as before."""
    _user_id, http = await user_client(clocked)
    async with http:
        hook = await http.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"})
        assert hook.status_code == 200, hook.text
        source = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]

        async def broken(source_row: Sandbox, child: Sandbox, **_: Any) -> hostlink.Booted:
            raise hostlink.HostError("mount exited with 117: Structure needs cleaning")

        clocked.host.fork = broken  # type: ignore[method-assign]
        forked = await http.post(f"/v1/sandboxes/{source}/fork", json={})
        assert forked.status_code == 200, forked.text
        view = await clocked.status(http, forked.json()["data"]["id"], "failed")
        assert "Structure needs cleaning" in view["status_reason"]
        assert len(await _fork_events(clocked)) == 1


async def test_a_fork_its_host_tier_refuses_is_a_409_and_leaves_no_child(clocked: Clocked) -> None:
    """A tier refusal (the host's 409 ``unsupported_on_tier``) made nothing on the host: the fork answers
    that 409 in the host's words, and no child is left ``forking`` for ever."""
    _user_id, http = await user_client(clocked)
    async with http:
        source = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]

        async def refusing(source_row: Sandbox, child: Sandbox, **_: Any) -> hostlink.Booted:
            raise hostlink.TierRefusedError(
                "fork of a sandbox holding a volume is not supported on the vm tier"
            )

        clocked.host.fork = refusing  # type: ignore[method-assign]
        refused = await http.post(f"/v1/sandboxes/{source}/fork", json={})
        assert refused.status_code == 409, refused.text
        assert "vm tier" in refused.text, refused.text
        listed = (await http.get("/v1/sandboxes", params={"limit": 100})).json()["data"]["data"]
        assert [view["id"] for view in listed] == [source]
        assert await _fork_events(clocked) == []


async def test_a_forks_event_is_written_in_the_transaction_that_records_it_running(clocked: Clocked) -> None:
    """After the host's fork, the answer waits for one transaction: the child's ``running`` and its
    ``sandbox.fork`` together. The event had a transaction of its own after the outcome, ~0.5 ms more
    before every fork's answer."""
    _user_id, http = await user_client(clocked)
    engine = clocked.services.engine.sync_engine
    seen: list[tuple[int, str]] = []

    def statement(conn: Any, cursor: Any, text: str, *_: Any) -> None:
        seen.append((id(conn), " ".join(text.split())))

    def commit(conn: Any) -> None:
        seen.append((id(conn), "COMMIT"))

    async with http:
        hook = await http.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"})
        assert hook.status_code == 200, hook.text
        source = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})).json()["data"]["id"]
        event.listen(engine, "before_cursor_execute", statement)
        event.listen(engine, "commit", commit)
        try:
            forked = await http.post(f"/v1/sandboxes/{source}/fork", json={})
            assert forked.status_code == 200, forked.text
            answered = len(seen)
        finally:
            event.remove(engine, "before_cursor_execute", statement)
            event.remove(engine, "commit", commit)
        await clocked.status(http, forked.json()["data"]["id"], "running")

    # Each connection's statements before the answer, cut into transactions at their commits.
    transactions: dict[int, list[list[str]]] = {}
    for conn, text in seen[:answered]:
        ongoing = transactions.setdefault(conn, [[]])
        if text == "COMMIT":
            ongoing.append([])
        else:
            ongoing[-1].append(text)
    written = [
        t for ts in transactions.values() for t in ts if any("INSERT INTO webhook_deliveries" in s for s in t)
    ]
    assert len(written) == 1, written  # the fork's event, once
    assert any(s.startswith("UPDATE sandboxes SET status=") and "running_at" in s for s in written[0]), (
        written
    )
