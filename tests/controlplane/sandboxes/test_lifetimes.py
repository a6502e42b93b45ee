"""A sandbox's lifetime (``timeout_s``, ``on_timeout``, ``end_at``), its metadata labels and the
account's credits on whoami (issue #32), with the control plane's clock moved by hand.

The host is the fake seam (these are the control plane's rules); tests/sdk/test_live_ergonomics*.py
shows the same on real sandboxes.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from sqlalchemy import select

from paddock_controlplane.records.models import WebhookDelivery
from paddock_controlplane.sandboxes import lifecycle
from paddock_core.db import make_engine, make_sessionmaker
from tests.controlplane.conftest import Clocked, user_client

pytestmark = pytest.mark.db


def _at(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


async def _deliveries(clocked: Clocked, action: str) -> list[dict[str, object]]:
    engine = make_engine(clocked.cp.settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            rows = await session.scalars(
                select(WebhookDelivery).where(WebhookDelivery.event_action == action)
            )
            return [json.loads(row.payload) for row in rows]
    finally:
        await engine.dispose()


async def test_a_sandbox_is_destroyed_when_its_timeout_passes_and_an_extended_one_is_not(
    clocked: Clocked,
) -> None:
    user_id, http = await user_client(clocked)
    await clocked.subscribe(user_id, "sandbox.timeout")
    async with http:
        created = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "timeout_s": 5})).json()[
            "data"
        ]
        short, kept = created["id"], None
        assert created["timeout_s"] == 5 and created["on_timeout"] == "destroy"
        start = _at(created["created_at"])
        assert _at(created["end_at"]) - start == dt.timedelta(seconds=5)
        kept = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "timeout_s": 5})).json()[
            "data"
        ]["id"]
        extended = await http.post(f"/v1/sandboxes/{kept}/timeout", json={"timeout_s": 600})
        assert extended.status_code == 200, extended.text
        assert _at(extended.json()["data"]["end_at"]) == clocked.clock() + dt.timedelta(seconds=600)

        clocked.clock.advance(4)
        await clocked.reconcile(lifecycle.expire_pass)
        assert (await http.get(f"/v1/sandboxes/{short}")).json()["data"]["status"] == "running"
        clocked.clock.advance(2)
        await clocked.reconcile(lifecycle.expire_pass)
        gone = await clocked.status(http, short, "destroyed")
        assert "end_at" not in gone
        assert (await http.get(f"/v1/sandboxes/{kept}")).json()["data"]["status"] == "running"
        events = await _deliveries(clocked, "sandbox.timeout")
        assert [event["data"]["sandbox_id"] for event in events] == [short]  # type: ignore[index]
        assert events[0]["data"]["on_timeout"] == "destroy"  # type: ignore[index]

        # Shortened to 1 s, then passed: gone too. 0 takes a lifetime away.
        assert (await http.post(f"/v1/sandboxes/{kept}/timeout", json={"timeout_s": 1})).status_code == 200
        clocked.clock.advance(2)
        await clocked.reconcile(lifecycle.expire_pass)
        await clocked.status(http, kept, "destroyed")
        again = await http.post(f"/v1/sandboxes/{kept}/timeout", json={"timeout_s": 10})
        assert again.status_code == 409, again.text


async def test_on_timeout_pause_pauses_and_clears_end_at(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        body = {"shape": "s-1vcpu-1gb", "timeout_s": 3, "on_timeout": "pause"}
        sid = (await http.post("/v1/sandboxes", json=body)).json()["data"]["id"]
        clocked.clock.advance(4)
        await clocked.reconcile(lifecycle.expire_pass)
        view = await clocked.status(http, sid, "paused")
        assert "end_at" not in view and view["on_timeout"] == "pause"
        none = await http.post(f"/v1/sandboxes/{sid}/timeout", json={"timeout_s": 0})
        assert none.status_code == 200 and "end_at" not in none.json()["data"]


async def test_bad_lifetimes_and_metadata_are_400s_naming_the_field(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        cases = [
            ({"timeout_s": -1}, "timeout_s"),
            ({"timeout_s": 86401}, "timeout_s"),
            ({"timeout_s": "5"}, "timeout_s"),
            ({"timeout_s": 5, "on_timeout": "explode"}, "on_timeout"),
            ({"on_timeout": "pause"}, "on_timeout"),
            ({"metadata": {"k": 1}}, "metadata"),
            ({"metadata": {f"k{i}": "v" for i in range(65)}}, "metadata"),
            ({"metadata": {"k": "v" * 4097}}, "metadata.k"),
            ({"metadata": {"": "v"}}, "metadata"),
        ]
        for extra, field in cases:
            answer = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", **extra})
            assert answer.status_code == 400, (extra, answer.text)
            assert field in answer.text, (extra, answer.text)


async def test_metadata_is_shown_filtered_on_and_inherited_by_a_fork(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        a = (
            await http.post(
                "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "metadata": {"team": "a", "env": "ci"}}
            )
        ).json()["data"]
        assert a["metadata"] == {"team": "a", "env": "ci"}
        b = (
            await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "metadata": {"team": "b"}})
        ).json()
        b_id = b["data"]["id"]
        plain = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]
        assert "metadata" not in plain

        def ids(answer: object) -> set[str]:
            return {item["id"] for item in answer.json()["data"]["data"]}  # type: ignore[attr-defined]

        assert ids(await http.get("/v1/sandboxes", params={"metadata.team": "a"})) == {a["id"]}
        assert ids(await http.get("/v1/sandboxes", params={"metadata.team": "b"})) == {b_id}
        assert ids(await http.get("/v1/sandboxes", params={"metadata.team": "a", "metadata.env": "ci"})) == {
            a["id"]
        }
        assert (
            ids(await http.get("/v1/sandboxes", params={"metadata.team": "a", "metadata.env": "x"})) == set()
        )
        assert ids(await http.get("/v1/sandboxes", params={"metadata.nope": "a"})) == set()
        assert len(ids(await http.get("/v1/sandboxes"))) == 3
        assert (await http.get(f"/v1/sandboxes/{a['id']}")).json()["data"]["metadata"] == {
            "team": "a",
            "env": "ci",
        }

        child = (await http.post(f"/v1/sandboxes/{a['id']}/fork")).json()["data"]
        assert child["metadata"] == {"team": "a", "env": "ci"}
        own = (await http.post(f"/v1/sandboxes/{a['id']}/fork", json={"metadata": {"team": "c"}})).json()[
            "data"
        ]
        assert own["metadata"] == {"team": "c"}
        timed = (await http.post(f"/v1/sandboxes/{a['id']}/fork", json={"timeout_s": 30})).json()["data"]
        assert timed["timeout_s"] == 30 and "end_at" in timed


async def test_whoami_shows_credits_left_and_spent(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        fresh = (await http.get("/v1/whoami")).json()["data"]
        assert fresh["credits"] == {"balance": 500.0, "spent": 0.0}
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        clocked.clock.advance(3600)
        assert (await http.post(f"/v1/sandboxes/{sid}/pause")).status_code == 200
        after = (await http.get("/v1/whoami")).json()["data"]
        assert after["credits"] == {"balance": 500.0 - 6.66, "spent": 6.66}


async def test_an_undeclared_exec_env_key_is_a_400_that_says_how_to_declare_it(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        body = {"shape": "s-1vcpu-1gb", "envs": {"MODE": "demo"}}
        sid = (await http.post("/v1/sandboxes", json=body)).json()["data"]["id"]
        refused = await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true", "env": {"NEW": "x"}})
        assert refused.status_code == 400, refused.text
        data = refused.json()["data"]
        assert "declare it at create" in data["env.NEW"] and "envs" in data["env.NEW"], data


async def test_exec_on_a_paused_sandbox_is_a_409_that_says_paused_and_how_to_resume(clocked: Clocked) -> None:
    """The documented choice (docs/limits.md): the API does not wake a paused sandbox for exec; the 409
    keeps the contract's words and says how to resume."""
    _, http = await user_client(clocked)
    async with http:
        sid = (await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
        assert (await http.post(f"/v1/sandboxes/{sid}/pause")).status_code == 200
        refused = await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
        assert refused.status_code == 409, refused.text
        message = refused.json()["data"]["message"]
        assert message.startswith("sandbox is not running") and "paused" in message
        assert f"/v1/sandboxes/{sid}/resume" in message
