"""Creates of one account sent at once are admitted together (issue #36, ``lifecycle._admit_group``):
one account's creates take turns on its lock, so on PostgreSQL they topped out at one over the time a
create held it (~80/s). Together they hold it once per group. What users must still see: every create
its own name and its own answer, the caps exact, no host given more memory than it has, and a bad
request refused alone."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from paddock_controlplane.records.models import Sandbox
from paddock_core import tls
from tests.controlplane.conftest import HOST_TOKEN, Clocked, user_client
from tests.controlplane.fakehost import HOST_BEAT
from tests.controlplane.sandboxes.test_create_round_trips import Statements
from tests.controlplane.sandboxes.test_sandboxes_rules import fail_data

pytestmark = pytest.mark.db

ONE_GIB = {"shape": "s-1vcpu-1gb"}


async def at_once(api: httpx.AsyncClient, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    return list(await asyncio.gather(*(api.post("/v1/sandboxes", json=body) for body in bodies)))


def account_locks(statements: Statements) -> int:
    return sum(1 for _, s in statements.seen if s.startswith("UPDATE users SET lock_version"))


async def test_creates_sent_at_once_take_their_account_lock_fewer_times_each_with_its_own_name(
    clocked: Clocked,
) -> None:
    owner, api = await user_client(clocked)
    statements = Statements(clocked)
    try:
        async with api:
            answers = await at_once(api, [ONE_GIB] * 12)
    finally:
        statements.close()
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers if a.status_code != 200]
    views = [a.json()["data"] for a in answers]
    assert len({v["id"] for v in views}) == 12
    assert len({v["name"] for v in views}) == 12, sorted(v["name"] for v in views)
    assert {v["status"] for v in views} == {"running"}
    # One at a time, each create took the lock: 12. Together, the ones that arrived while a group was
    # being admitted waited for the next group.
    assert account_locks(statements) < 12, account_locks(statements)
    async with clocked.services.sessions() as session:
        rows = (await session.scalars(select(Sandbox.name).where(Sandbox.user_id == owner))).all()
    assert sorted(rows) == sorted(v["name"] for v in views)


async def test_a_group_never_places_more_on_a_host_than_it_has(clocked: Clocked) -> None:
    # Two hosts with room for three 1 GiB sandboxes each.
    headers = {"Authorization": f"Bearer {HOST_TOKEN}"}
    for beat in (
        {**HOST_BEAT, "free_mib": 3 * 1024, "total_mib": 3 * 1024},
        {**HOST_BEAT, "id": "host-test-2", "url": "http://127.0.0.1:10", "free_mib": 3072, "total_mib": 3072},
    ):
        answer = await clocked.cp.http.post("/internal/v1/hosts/heartbeat", json=beat, headers=headers)
        assert answer.status_code == 200, answer.text
    owner, api = await user_client(clocked)
    async with api:
        answers = await at_once(api, [ONE_GIB] * 8)
    codes = Counter(a.status_code for a in answers)
    assert codes == {200: 6, 503: 2}, [a.text for a in answers]
    async with clocked.services.sessions() as session:
        hosts = (await session.scalars(select(Sandbox.host_id).where(Sandbox.user_id == owner))).all()
    assert Counter(hosts) == {"host-test-1": 3, "host-test-2": 3}, hosts
    refused = next(a for a in answers if a.status_code == 503)
    assert "no host has 1024 MiB free" in refused.text, refused.text


async def test_the_concurrent_cap_holds_for_creates_sent_at_once(clocked: Clocked) -> None:
    _, api = await user_client(clocked)  # the pro plan: 20 live at most
    async with api:
        for _ in range(18):
            made = await api.post("/v1/sandboxes", json=ONE_GIB)
            assert made.status_code == 200, made.text
        # Two more fit. Those that wait for a group are counted with the ones before them in it. From a
        # new client, as in the tests above: the six then arrive together, not one TLS handshake apart.
        async with httpx.AsyncClient(
            base_url=clocked.cp.url, headers=api.headers, timeout=30, verify=tls.client_context()
        ) as burst:
            answers = await at_once(burst, [ONE_GIB] * 6)
        listed = (await api.get("/v1/sandboxes", params={"limit": 100})).json()["data"]["data"]
    codes = Counter(a.status_code for a in answers)
    assert codes == {200: 2, 403: 4}, codes
    refusal = fail_data(next(a for a in answers if a.status_code == 403))
    assert refusal["code"] == "QUOTA_EXCEEDED", refusal
    assert "concurrent sandbox cap reached: limit 20" in refusal["message"], refusal
    assert len(listed) == 20


async def test_a_bad_create_among_others_is_refused_alone(clocked: Clocked) -> None:
    owner, api = await user_client(clocked)
    bodies = [
        ONE_GIB,
        {**ONE_GIB, "rootfs": "no-such-image:1"},
        {**ONE_GIB, "name": "twin"},
        ONE_GIB,
        {**ONE_GIB, "name": "twin"},
        {"shape": "s-8vcpu-16gb"},  # larger than the pro plan allows
        ONE_GIB,
    ]
    async with api:
        answers = await at_once(api, bodies)
    codes = [a.status_code for a in answers]
    assert codes[0] == codes[3] == codes[6] == 200, [a.text for a in answers]
    assert codes[1] == 400 and "rootfs" in answers[1].text, answers[1].text
    assert sorted((codes[2], codes[4])) == [200, 409], (answers[2].text, answers[4].text)
    assert "a sandbox named 'twin' already exists" in (answers[2].text + answers[4].text)
    assert codes[5] == 403 and fail_data(answers[5])["code"] == "PLAN_LIMIT", answers[5].text
    async with clocked.services.sessions() as session:
        names = (await session.scalars(select(Sandbox.name).where(Sandbox.user_id == owner))).all()
    assert len(names) == 4 and names.count("twin") == 1, names
