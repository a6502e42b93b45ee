"""The audit trail on the control plane (docs/audit.md), on both database engines: what is recorded for
API calls, commands, files and processes, the reading route's pages, filters and refusals, JSON lines,
secrets never kept, retention, and the bounded queue.

The host is the unit seam (``FakeHostLink``); tests/network/test_audit_live.py records a real sandbox's
commands, files and refused egress on crun.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, func, insert, select

from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import audit
from paddock_controlplane.records.audit import AuditEvent
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_controlplane.workers.audit_writer import AuditWriter
from paddock_core.db import transaction
from paddock_core.timeutil import utcnow
from paddock_hostagent.schemas import EgressAttempt, EgressAttempts
from tests.conftest import LiveServer
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, fake_hosts
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink

pytestmark = pytest.mark.db

SECRET = "hunter2-8f3a9c-do-not-log"


@dataclass
class Audited:
    cp: ControlPlane
    services: Services
    host: FakeHostLink
    key: str

    async def client(self) -> httpx.AsyncClient:
        _, key = await self.cp.new_user("pro")
        return httpx.AsyncClient(base_url=self.cp.url, headers={"X-Api-Key": key}, timeout=30)


@pytest.fixture
async def audited(
    cp_settings: ControlPlaneSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Audited]:
    settings = cp_settings.model_copy(
        update={
            "audit_prune_interval_s": 0.2,
            "audit_max_events_per_sandbox": 40,
            "audit_flush_interval_s": 0.1,
        }
    )
    await migrate(settings)
    link = fake_hosts(monkeypatch)
    app = create_app(settings)
    async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        beat = await http.post(
            "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {HOST_TOKEN}"}
        )
        assert beat.status_code == 200
        cp = ControlPlane(url=server.url, settings=settings, http=http)
        _, key = await cp.new_user("pro")
        http.headers["X-Api-Key"] = key
        yield Audited(cp, app.state.services, link, key)


async def new_sandbox(http: httpx.AsyncClient, **body: Any) -> str:
    created = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", **body})
    assert created.status_code == 200, created.text
    return str(created.json()["data"]["id"])


async def trail(http: httpx.AsyncClient, sid: str, **params: Any) -> list[dict[str, Any]]:
    resp = await http.get(f"/v1/sandboxes/{sid}/audit", params=params)
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["data"]["items"]
    return items


async def test_calls_commands_and_files_are_listed_in_order_with_their_caller(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    ran = await http.post(
        f"/v1/sandboxes/{sid}/exec",
        json={"cmd": "echo", "args": ["hello", "world"], "cwd": "/tmp", "user": "root"},
    )
    assert ran.status_code == 200, ran.text
    put = await http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/a.txt"}, content=b"12345")
    assert put.status_code == 200, put.text
    got = await http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/a.txt"})
    assert got.content == b"12345"
    started = await http.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "sleep", "args": ["5"]})
    assert started.status_code == 200, started.text

    events = await trail(http, sid)
    assert [(e["kind"], e.get("route") or e.get("direction") or e.get("argv")) for e in events] == [
        ("api", "/v1/sandboxes/{sandbox_id}/exec"),
        ("command", ["echo", "hello", "world"]),
        ("api", "/v1/sandboxes/{sandbox_id}/files"),
        ("file", "write"),
        ("api", "/v1/sandboxes/{sandbox_id}/files"),
        ("file", "read"),
        ("api", "/v1/sandboxes/{sandbox_id}/processes"),
        ("process", ["sleep", "5"]),
    ]
    command = events[1]
    assert command["cwd"] == "/tmp" and command["user"] == "root" and command["exit_code"] == 0
    assert command["duration_ms"] >= 0
    assert events[3]["path"] == "/tmp/a.txt" and events[3]["bytes"] == 5
    assert events[5]["path"] == "/tmp/a.txt" and events[5]["bytes"] == 5
    api_call = events[0]
    assert api_call["method"] == "POST" and api_call["status"] == 200
    assert len(api_call["input_sha256"]) == 64
    # Who: the key's id, the same on every event of the request; never the key itself.
    actors = {e.get("actor") for e in events}
    assert len(actors) == 1 and next(iter(actors)).startswith("key_")
    times = [e["at"] for e in events]
    assert times == sorted(times)


async def test_a_failed_call_is_recorded_with_its_status(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    bad = await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "ls", "cwd": "relative"})
    assert bad.status_code == 400
    events = await trail(http, sid)
    assert [(e["kind"], e["status"]) for e in events] == [("api", 400)]


async def test_env_values_and_secrets_appear_nowhere_in_the_export(audited: Audited) -> None:
    http = audited.cp.http
    declared = {"SANDBOX_SECRET": SECRET, "API_TOKEN": "unset", "PASSWORD": "unset", "K": "unset"}
    sid = await new_sandbox(http, envs=declared)
    # The value is set in env and the command refers to it by name, as an agent passing a secret should.
    ran = await http.post(
        f"/v1/sandboxes/{sid}/exec",
        json={
            "cmd": "bash",
            "args": ["-c", 'curl -H "Authorization: $API_TOKEN" x'],
            "env": {"API_TOKEN": SECRET},
        },
    )
    assert ran.status_code == 200, ran.text
    streamed = await http.post(
        f"/v1/sandboxes/{sid}/exec", json={"cmd": "env", "env": {"PASSWORD": SECRET}, "stream": True}
    )
    assert streamed.status_code == 200
    await http.post(
        f"/v1/sandboxes/{sid}/processes", json={"cmd": "sleep", "args": ["1"], "env": {"K": SECRET}}
    )
    await http.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["example.test"]})
    export = await http.get(f"/v1/sandboxes/{sid}/audit", params={"format": "jsonl"})
    assert export.status_code == 200
    assert export.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in export.text.splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds.count("command") == 2 and kinds.count("process") == 1, kinds
    assert SECRET not in export.text
    assert audited.key not in export.text
    streamed_command = [line for line in lines if line["kind"] == "command"][1]
    assert streamed_command["stream"] is True and streamed_command["exit_code"] == 3
    # The digest is of the inputs with the env's values taken out: the same call with another secret
    # hashes alike, so it says what was asked without being a way to test guesses of the value.
    digests = {
        line["input_sha256"] for line in lines if line["kind"] == "api" and line["route"].endswith("/exec")
    }
    again = await http.post(
        f"/v1/sandboxes/{sid}/exec",
        json={
            "cmd": "bash",
            "args": ["-c", 'curl -H "Authorization: $API_TOKEN" x'],
            "env": {"API_TOKEN": "other"},
        },
    )
    assert again.status_code == 200
    latest = (await trail(http, sid, kind="api"))[-1]
    assert latest["input_sha256"] in digests


async def test_pages_follow_cursors_and_filters_narrow(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    for n in range(5):
        assert (
            await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": [str(n)]})
        ).status_code == 200
    everything = await trail(http, sid, limit=1000)
    assert len(everything) == 10
    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = (await http.get(f"/v1/sandboxes/{sid}/audit", params=params)).json()["data"]
        pages += body["items"]
        assert body["pagination"]["count"] == len(body["items"]) <= 3
        cursor = body["pagination"]["next_cursor"]
        if cursor is None:
            break
    assert [e["id"] for e in pages] == [e["id"] for e in everything]
    commands = await trail(http, sid, kind="command")
    assert [e["argv"] for e in commands] == [["echo", str(n)] for n in range(5)]
    both = await trail(http, sid, kind="api,command")
    assert len(both) == 10
    middle = everything[4]["at"]
    since = await trail(http, sid, since=middle)
    until = await trail(http, sid, until=middle)
    assert [e["id"] for e in until + since] == [e["id"] for e in everything]
    ndjson = await http.get(
        f"/v1/sandboxes/{sid}/audit", params={"kind": "command"}, headers={"Accept": "application/x-ndjson"}
    )
    assert [json.loads(line)["argv"] for line in ndjson.text.splitlines()] == [e["argv"] for e in commands]


async def test_newest_first_pages_run_backwards_through_the_same_events(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    for n in range(4):
        assert (
            await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": [str(n)]})
        ).status_code == 200
    everything = await trail(http, sid, limit=1000)
    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"order": "newest", "limit": 3, **({"cursor": cursor} if cursor else {})}
        body = (await http.get(f"/v1/sandboxes/{sid}/audit", params=params)).json()["data"]
        pages += body["items"]
        cursor = body["pagination"]["next_cursor"]
        if cursor is None:
            break
    assert len(everything) == 8
    assert [e["id"] for e in pages] == [e["id"] for e in reversed(everything)]
    newest_command = await trail(http, sid, kind="command", order="newest", limit=1)
    assert [e["argv"] for e in newest_command] == [["echo", "3"]]
    export = await http.get(f"/v1/sandboxes/{sid}/audit", params={"order": "newest", "format": "jsonl"})
    assert export.status_code == 400 and "order" in export.json()["data"], export.text


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("kind", "shell"),
        ("order", "latest"),
        ("since", "yesterday"),
        ("until", "2026-01-01T00:00:00"),  # no zone
        ("limit", "0"),
        ("limit", "ten"),
        ("cursor", "not-a-cursor"),
        ("format", "xml"),
    ],
)
async def test_bad_parameters_are_a_400_naming_them(audited: Audited, param: str, value: str) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    resp = await http.get(f"/v1/sandboxes/{sid}/audit", params={param: value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["status"] == "fail" and param in resp.json()["data"], resp.text


async def test_only_the_owner_reads_it_even_after_the_sandbox_is_gone(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": ["x"]})
    async with await audited.client() as other:
        assert (await other.get(f"/v1/sandboxes/{sid}/audit")).status_code == 404
        assert (await http.delete(f"/v1/sandboxes/{sid}")).status_code == 200
        assert [e["kind"] for e in await trail(http, sid, kind="command")] == ["command"]
        # The destroyed sandbox's row is purged (retention_destroyed_h): the trail is still its owner's.
        async with transaction(audited.services.sessions) as session:
            await session.execute(delete(Sandbox).where(Sandbox.id == sid))
        assert [e["kind"] for e in await trail(http, sid, kind="command")] == ["command"]
        assert (await other.get(f"/v1/sandboxes/{sid}/audit")).status_code == 404


async def test_an_access_token_cannot_read_the_trail(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    token = (await http.post(f"/v1/sandboxes/{sid}/access-token", json={})).json()["data"]["token"]
    resp = await http.get(f"/v1/sandboxes/{sid}/audit", headers={"X-Api-Key": token})
    assert resp.status_code == 403, resp.text
    # What the token did is recorded under the token's id, not the owner's key.
    ran = await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "id"}, headers={"X-Api-Key": token})
    assert ran.status_code == 200
    command = (await trail(http, sid, kind="command"))[-1]
    assert command["actor"].startswith("sat_") and token not in json.dumps(command)


async def test_retention_prunes_by_age_and_keeps_each_sandboxs_newest(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    old = utcnow() - dt.timedelta(days=8)
    async with transaction(audited.services.sessions) as session:
        user_id = await session.scalar(select(Sandbox.user_id).where(Sandbox.id == sid))
        await session.execute(
            insert(AuditEvent),
            [
                {
                    "sandbox_id": sid,
                    "user_id": user_id,
                    "at": old,
                    "kind": "api",
                    "actor": None,
                    "detail": {"old": True},
                }
            ],
        )
    for n in range(25):  # 50 events, over the cap of 40
        assert (
            await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": [str(n)]})
        ).status_code == 200
    await audited.services.audit.flush_now()
    for _ in range(100):
        async with audited.services.sessions() as session:
            count = await session.scalar(
                select(func.count()).select_from(AuditEvent).where(AuditEvent.sandbox_id == sid)
            )
        if count == 40:
            break
        await asyncio.sleep(0.1)
    assert count == 40
    kept = await trail(http, sid, limit=1000)
    assert not any(e.get("old") for e in kept)
    assert kept[-1]["kind"] == "command" and kept[-1]["argv"] == ["echo", "24"], "the newest are kept"


async def test_a_read_waits_for_the_flush_already_under_way(
    audited: Audited, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's loop may have taken the queue and not yet committed it when a read comes: the
    read still sees the call made before it (CI caught an empty export on PostgreSQL)."""
    writer = audited.services.audit.flusher.__self__  # type: ignore[union-attr]
    taken, release = asyncio.Event(), asyncio.Event()
    real = writer._insert

    async def held_back(events: list[audit.Pending]) -> None:
        taken.set()
        await release.wait()  # the loop holds the events and has not written them yet
        await real(events)

    http = audited.cp.http
    sid = await new_sandbox(http)
    await audited.services.audit.flush_now()
    monkeypatch.setattr(writer, "_insert", held_back)
    try:
        ran = await http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo", "args": ["held"]})
        assert ran.status_code == 200
        await asyncio.wait_for(taken.wait(), 10)
        assert len(audited.services.audit) == 0, "the loop has the events"
        reading = asyncio.create_task(trail(http, sid, kind="command"))
        await asyncio.sleep(0.5)
        assert not reading.done(), "the read waits for the write under way"
    finally:
        release.set()
    commands = await asyncio.wait_for(reading, 10)
    assert [c["argv"] for c in commands] == [["echo", "held"]]


def test_a_full_queue_counts_what_it_drops_and_leaves_a_marker() -> None:
    log = audit.AuditLog(capacity=3)
    for n in range(5):
        log.record("sbx_a", "usr_a", "command", {"argv": [str(n)]})
    log.record("sbx_b", "usr_b", "command", {"argv": ["b"]})
    taken = log.take()
    assert [e.detail.get("argv") for e in taken[:3]] == [["0"], ["1"], ["2"]]
    markers = {(e.sandbox_id, e.detail["dropped"]) for e in taken[3:] if e.kind == "dropped"}
    assert markers == {("sbx_a", 2), ("sbx_b", 1)}
    assert log.dropped_total == 3
    assert log.take() == [], "the counts start again after a marker"


def test_inputs_are_hashed_without_secret_fields() -> None:
    body = json.dumps(
        {"cmd": "x", "env": {"A": SECRET}, "secret_access_key": SECRET, "nested": [{"token": SECRET}]}
    )
    other = json.dumps({"cmd": "x", "env": {"A": "z"}, "secret_access_key": "z", "nested": [{"token": "z"}]})
    assert audit.input_digest([], body.encode(), len(body), True) == audit.input_digest(
        [], other.encode(), len(other), True
    )
    changed = json.dumps({"cmd": "y", "env": {"A": SECRET}})
    assert audit.input_digest([], changed.encode(), 1, True) != audit.input_digest([], body.encode(), 1, True)
    assert audit.redacted({"env": {"A": SECRET}, "path": "/p"}) == {"env": {"A": "<redacted>"}, "path": "/p"}
    long = audit.argv_detail("x" * 5000, ["y"])
    assert long["truncated"] is True and sum(map(len, long["argv"])) <= audit.MAX_COMMAND_CHARS


async def test_a_files_bytes_are_counted_never_hashed(audited: Audited) -> None:
    http = audited.cp.http
    sid = await new_sandbox(http)
    for content in (b'{"password": "one"}', b'{"password": "two"}'):
        put = await http.put(
            f"/v1/sandboxes/{sid}/files",
            params={"path": "/tmp/c.json"},
            content=content,
            headers={"Content-Type": "application/json"},
        )
        assert put.status_code == 200, put.text
    calls = await trail(http, sid, kind="api")
    assert [c["input_bytes"] for c in calls] == [19, 19]
    assert calls[0]["input_sha256"] == calls[1]["input_sha256"], "the digest is of the path and size only"


async def test_egress_attempts_polled_by_two_control_planes_are_recorded_once(
    audited: Audited, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hosts' answers are the unit seam here (tests/network/test_audit_live.py has the real ones)."""
    http = audited.cp.http
    sid = await new_sandbox(http)
    now = time.time()
    attempts = [
        EgressAttempt(
            seq=n,
            sandbox_id=sid,
            at=now,
            verdict="refused",
            address="198.18.0.9",
            protocol="tcp",
            port=80 + n,
            packets=1,
        )
        for n in (1, 2, 3)
    ] + [
        EgressAttempt(
            seq=4,
            sandbox_id="sb-not-ours",
            at=now,
            verdict="allowed",
            address="198.18.0.9",
            protocol="tcp",
            port=1,
            packets=1,
        )
    ]
    answered: list[tuple[str, int]] = []

    class Client:
        async def egress_attempts(self, epoch: str, after: int, limit: int = 1000) -> EgressAttempts:
            answered.append((epoch, after))
            start = after if epoch == "run-1" else 0
            return EgressAttempts(epoch="run-1", next=4, lost=0, attempts=attempts[start:])

    async def for_host(services: object, host_id: str | None) -> SimpleNamespace:
        return SimpleNamespace(client=Client())

    monkeypatch.setattr(hostlink, "for_host", for_host)
    first, second = AuditWriter(audited.services), AuditWriter(audited.services)
    # Both read the cursor before either records: the second must find the first's rows under the lock.
    await asyncio.gather(first.poll_host(HOST_BEAT["id"]), second.poll_host(HOST_BEAT["id"]))
    await first.poll_host(HOST_BEAT["id"])
    assert answered[-1] == ("run-1", 4), "the next poll asks from where the last one stopped"
    egress = await trail(http, sid, kind="egress")
    assert [(e["verdict"], e["port"]) for e in egress] == [("refused", 81), ("refused", 82), ("refused", 83)]
