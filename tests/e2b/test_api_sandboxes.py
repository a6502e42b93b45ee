"""The unmodified ``e2b`` SDK (sync), configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY,
drives Paddock's E2B API against a live platform: create, get_info, list with metadata and state
filters, set_timeout (a short one makes the sandbox go), pause and connect (resume), kill, and the
errors the SDK decides on. Every test fails on the code before the E2B API (nothing listened)."""

from __future__ import annotations

import datetime as dt
import secrets
import time

import httpx
import pytest
from e2b.api.client.api.sandboxes import get_unstable_sandboxes_sandbox_id_record
from e2b.api.client.models import SandboxRecord
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig

from e2b import (
    AuthenticationException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)
from tests.e2b.conftest import E2bPlatform, exported

pytestmark = [pytest.mark.root, pytest.mark.slow]


def paddock_status(env: E2bPlatform, sandbox_id: str) -> str:
    """The sandbox as Paddock's own API sees it."""
    with env.platform.http(env.api_key) as http:
        return str(http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]["status"])


def test_create_get_info_list_by_metadata_and_kill(e2b_env: E2bPlatform) -> None:
    tag = secrets.token_hex(4)
    sandbox = Sandbox.create(metadata={"suite": tag, "role": "one"}, timeout=120)
    other = Sandbox.create(metadata={"suite": tag, "role": "two"})
    try:
        assert paddock_status(e2b_env, sandbox.sandbox_id) == "running"  # a real Paddock sandbox
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.template_id == "base"
        assert info.metadata == {"suite": tag, "role": "one"}
        assert info.state == SandboxState.RUNNING
        left = (info.end_at - dt.datetime.now(dt.UTC)).total_seconds()
        assert 90 < left <= 121, left  # E2B's timeout: seconds until the sandbox is killed

        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "role": "one"})).next_items()
        assert [item.sandbox_id for item in listed] == [sandbox.sandbox_id]
        both = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
        assert {item.sandbox_id for item in both} == {sandbox.sandbox_id, other.sandbox_id}
        assert Sandbox.list(query=SandboxQuery(metadata={"suite": "nobody"})).next_items() == []

        assert sandbox.kill() is True
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sandbox.sandbox_id)
        assert Sandbox.kill(sandbox.sandbox_id) is False  # a second kill: the SDK's "not found"
        assert paddock_status(e2b_env, sandbox.sandbox_id) in ("destroying", "destroyed")
        assert [
            item.sandbox_id for item in Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
        ] == [other.sandbox_id]
    finally:
        Sandbox.kill(sandbox.sandbox_id)
        Sandbox.kill(other.sandbox_id)


def test_list_pages_with_next_token(e2b_env: E2bPlatform) -> None:
    tag = secrets.token_hex(4)
    made = [Sandbox.create(metadata={"pages": tag}) for _ in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"pages": tag}), limit=2)
        first = paginator.next_items()
        assert len(first) == 2 and paginator.has_next  # x-next-token came with a full page
        second = paginator.next_items()
        assert len(second) == 1 and not paginator.has_next
        assert {item.sandbox_id for item in first + second} == {sandbox.sandbox_id for sandbox in made}
    finally:
        for sandbox in made:
            sandbox.kill()


def test_set_timeout_makes_the_sandbox_go(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(timeout=300)
    try:
        sandbox.set_timeout(2)
        left = (sandbox.get_info().end_at - dt.datetime.now(dt.UTC)).total_seconds()
        assert left <= 3, left
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                Sandbox.get_info(sandbox.sandbox_id)
            except NotFoundException:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the sandbox outlived its timeout by 30 s")
        assert paddock_status(e2b_env, sandbox.sandbox_id) in ("destroying", "destroyed")
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_pause_then_connect_resumes(e2b_env: E2bPlatform) -> None:
    tag = secrets.token_hex(4)
    sandbox = Sandbox.create(metadata={"pause": tag}, timeout=120)
    try:
        assert sandbox.pause() is True
        assert paddock_status(e2b_env, sandbox.sandbox_id) == "paused"
        info = Sandbox.get_info(sandbox.sandbox_id)
        assert info.state == SandboxState.PAUSED
        paused = Sandbox.list(
            query=SandboxQuery(metadata={"pause": tag}, state=[SandboxState.PAUSED])
        ).next_items()
        assert [item.sandbox_id for item in paused] == [sandbox.sandbox_id]
        running = Sandbox.list(query=SandboxQuery(metadata={"pause": tag}, state=[SandboxState.RUNNING]))
        assert running.next_items() == []
        assert Sandbox.pause(sandbox.sandbox_id) is False  # already paused: the SDK's 409

        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60)
        assert resumed.sandbox_id == sandbox.sandbox_id
        assert paddock_status(e2b_env, sandbox.sandbox_id) == "running"
        info = Sandbox.get_info(sandbox.sandbox_id)
        assert info.state == SandboxState.RUNNING
        left = (info.end_at - dt.datetime.now(dt.UTC)).total_seconds()
        assert 30 < left <= 61, left  # the lifetime starts again from the connect
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_errors_are_the_sdks_own(e2b_env: E2bPlatform) -> None:
    with pytest.raises(NotFoundException):
        Sandbox.get_info("sb-01jnosuchsandbox000000000000")
    with pytest.raises(NotFoundException):
        Sandbox.connect("sb-01jnosuchsandbox000000000000")
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="pk_not_a_key")
    with pytest.raises(Exception, match="no-such-template"):
        Sandbox.create("no-such-template")
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
        for method, path in (("GET", "/secrets"),):
            answer = http.request(method, path)
            assert answer.status_code == 501, (path, answer.text)
            assert answer.json()["code"] == 501 and path in answer.json()["message"]
        bad = http.get("/v2/sandboxes", params={"state": "sleeping"})
        assert bad.status_code == 400 and bad.json() == {"code": 400, "message": bad.json()["message"]}
        assert "state" in bad.json()["message"]
        bad = http.post("/v2/sandboxes", json={"templateID": "base", "timeout": "soon"})
        assert bad.status_code == 400 and "timeout" in bad.json()["message"]
        bad = http.post("/v2/sandboxes", json={"templateID": "base", "metadata": {"k": "v" * 5000}})
        assert bad.status_code == 400 and "metadata.k" in bad.json()["message"]
        # A rule the sandbox would not obey (a header rule, which needs an egress proxy Paddock has
        # not) is refused, not ignored, and nothing is made.
        before = Sandbox.list().next_items()
        refused = http.post(
            "/v2/sandboxes",
            json={
                "templateID": "base",
                "network": {"rules": {"example.test": [{"transform": {"headers": {}}}]}},
            },
        )
        assert refused.status_code == 501 and "network" in refused.json()["message"]
        assert len(Sandbox.list().next_items()) == len(before)


def test_an_authorization_header_carries_the_key_without_an_api_key(e2b_env: E2bPlatform) -> None:
    """SDK 2.64 sends the caller's own ``Authorization`` (``headers=``) in place of an API key when it has
    none, as E2B's CLI sends ``E2B_ACCESS_TOKEN``: a Paddock key as a Bearer token is the caller. A bad
    one, or another scheme, is the SDK's AuthenticationException. Before, every such call was a 401."""
    key = e2b_env.api_key
    with exported({"E2B_API_URL": e2b_env.api_url, "E2B_SANDBOX_URL": e2b_env.sandbox_url}):
        sandbox = Sandbox.create(timeout=60, headers={"Authorization": f"Bearer {key}"})
        try:
            assert sandbox.commands.run("echo bearer").stdout == "bearer\n"
            listed = Sandbox.list(headers={"Authorization": f"Bearer {key}"}).next_items()
            assert sandbox.sandbox_id in [info.sandbox_id for info in listed]
            # X-API-Key wins when both are sent: another account's Bearer token changes nothing.
            other = e2b_env.platform.api_key()
            with httpx.Client(base_url=e2b_env.api_url) as http:
                both = {"X-API-Key": key, "Authorization": f"Bearer {other}"}
                mine = http.get("/v2/sandboxes", headers=both)
                theirs = http.get("/v2/sandboxes", headers={"Authorization": f"Bearer {other}"})
                nothing = http.get("/v2/sandboxes")
            assert sandbox.sandbox_id in [entry["sandboxID"] for entry in mine.json()], mine.text
            assert theirs.status_code == 200 and theirs.json() == []
            assert nothing.status_code == 401 and "E2B_API_KEY" in nothing.json()["message"], nothing.text
        finally:
            sandbox.kill()
        for header in (f"Bearer {key}x", f"Basic {key}", "Bearer"):
            with pytest.raises(AuthenticationException):
                Sandbox.list(headers={"Authorization": header}).next_items()


def test_a_sandboxs_record_outlives_it(e2b_env: E2bPlatform) -> None:
    """SDK 2.64's generated client reads a sandbox's ``SandboxRecord`` (``GET /unstable/sandboxes/{id}/
    record``) while it runs and after it was killed, when E2B's other views answer 404 for it; another
    account and an unknown id get 404. Before, the route was a 501."""
    api = get_api_client(ConnectionConfig())
    sandbox = Sandbox.create(timeout=60)
    sandbox_id = sandbox.sandbox_id
    try:
        running = get_unstable_sandboxes_sandbox_id_record.sync_detailed(sandbox_id, client=api)
        assert running.status_code == 200, running.content
        assert isinstance(running.parsed, SandboxRecord)
        seen = running.parsed
        assert (seen.sandbox_id, seen.template_id, seen.alias) == (sandbox_id, "base", "base")
        assert (seen.cpu_count, seen.memory_mb, seen.disk_size_mb) == (2, 2048, 10240)
        assert seen.stopped_at is None and seen.retention_expired is False
        assert seen.domain == sandbox.get_info().sandbox_domain
    finally:
        sandbox.kill()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox_id)
    ended = get_unstable_sandboxes_sandbox_id_record.sync_detailed(sandbox_id, client=api).parsed
    assert isinstance(ended, SandboxRecord) and isinstance(ended.stopped_at, dt.datetime)
    assert ended.started_at <= ended.stopped_at <= dt.datetime.now(dt.UTC)
    # Its metrics (a day) and its events (the trail's 7 days) are still kept.
    assert (ended.retention_expired, ended.events_retention_expired) == (False, False)

    other = get_api_client(ConnectionConfig(api_key=e2b_env.platform.api_key()))
    theirs = get_unstable_sandboxes_sandbox_id_record.sync_detailed(sandbox_id, client=other)
    unknown = get_unstable_sandboxes_sandbox_id_record.sync_detailed("sb-01jnosuchsandbox0000000", client=api)
    assert (theirs.status_code, unknown.status_code) == (404, 404)


def test_fork_copies_the_disk_and_the_metadata(e2b_env: E2bPlatform) -> None:
    tag = secrets.token_hex(4)
    source = Sandbox.create(metadata={"fork": tag}, timeout=120)
    children: list[Sandbox] = []
    try:
        with e2b_env.platform.http(e2b_env.api_key) as http:
            wrote = http.post(
                f"/v1/sandboxes/{source.sandbox_id}/exec",
                json={"cmd": "sh", "args": ["-c", "echo from-the-source > /root/mark; sync"]},
            )
            assert wrote.status_code == 200, wrote.text
        made = Sandbox.fork(source.sandbox_id, count=2, timeout=60)
        children = [child for child in made if isinstance(child, Sandbox)]
        assert len(children) == 2, made
        listed = Sandbox.list(query=SandboxQuery(metadata={"fork": tag})).next_items()
        assert {item.sandbox_id for item in listed} == {source.sandbox_id, *(c.sandbox_id for c in children)}
        with e2b_env.platform.http(e2b_env.api_key) as http:
            for child in children:
                info = child.get_info()
                assert info.state == SandboxState.RUNNING and info.template_id == "base"
                assert (info.end_at - dt.datetime.now(dt.UTC)).total_seconds() <= 61
                read = http.post(
                    f"/v1/sandboxes/{child.sandbox_id}/exec", json={"cmd": "cat", "args": ["/root/mark"]}
                )
                assert read.json()["data"]["result"]["stdout"] == "from-the-source\n"
        with pytest.raises(NotFoundException):
            Sandbox.fork("sb-01jnosuchsandbox000000000000")
    finally:
        for sandbox in (source, *children):
            Sandbox.kill(sandbox.sandbox_id)


def test_bad_input_is_a_4xx_naming_the_field_never_a_500(e2b_env: E2bPlatform) -> None:
    missing = "sb-01jnosuchsandbox000000000000"
    cases: list[tuple[str, str, dict[str, object], str]] = [
        ("POST", "/v2/sandboxes", {"content": b"{not json"}, "body"),
        ("POST", "/v2/sandboxes", {"json": {"templateID": ""}}, "templateID"),
        ("POST", "/v2/sandboxes", {"json": {"templateID": "base", "timeout": 999999}}, "timeout"),
        ("POST", "/v2/sandboxes", {"json": {"templateID": "base", "envVars": {"1x": "y"}}}, "envVars"),
        ("POST", f"/sandboxes/{missing}/timeout", {"json": {"timeout": -5}}, "timeout"),
        ("POST", f"/sandboxes/{missing}/timeout", {"json": {}}, "timeout"),
        ("POST", f"/sandboxes/{missing}/refreshes", {"content": b"nope"}, "body"),
        ("POST", f"/sandboxes/{missing}/connect", {"json": {"timeout": "soon"}}, "timeout"),
        ("POST", f"/sandboxes/{missing}/fork", {"json": {"count": 0}}, "count"),
        ("GET", "/v2/sandboxes", {"params": {"limit": "many"}}, "limit"),
        ("GET", "/v2/sandboxes", {"params": {"nextToken": "../../etc"}}, "nextToken"),
        ("GET", "/v2/sandboxes", {"params": {"startedAfter": "yesterday"}}, "startedAfter"),
        ("GET", "/v2/sandboxes", {"params": {"order": "sideways"}}, "order"),
        ("POST", "/v3/templates", {"json": {"name": "../x"}}, "name"),
    ]
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
        for method, path, options, field in cases:
            answer = http.request(method, path, **options)  # type: ignore[arg-type]
            assert answer.status_code == 400, (path, options, answer.status_code, answer.text)
            body = answer.json()
            assert body["code"] == 400 and field in body["message"], (path, options, body)
        assert http.get(f"/sandboxes/{missing}").status_code == 404
        assert http.get("/sandboxes/has%20a%20space").status_code == 404
        built = http.post("/v3/templates", json={"name": f"bad-steps-{secrets.token_hex(3)}"}).json()
        steps = {"fromTemplate": "base", "steps": [{"type": "EXPOSE", "args": ["80"]}]}
        start = http.post(f"/v2/templates/{built['templateID']}/builds/{built['buildID']}", json=steps)
        assert start.status_code == 501 and "EXPOSE" in start.json()["message"]
        status = http.get(
            f"/templates/{built['templateID']}/builds/{built['buildID']}/status", params={"logsOffset": "-1"}
        )
        assert status.status_code == 400 and "logsOffset" in status.json()["message"]
        assert http.get("/v2/sandboxes", headers={"X-API-Key": "pk_wrong"}).status_code == 401


def test_on_timeout_pause_pauses_instead_of_killing(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        deadline = time.monotonic() + 30
        while Sandbox.get_info(sandbox.sandbox_id).state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "the sandbox was not paused 30 s after its timeout"
            time.sleep(0.5)
        assert paddock_status(e2b_env, sandbox.sandbox_id) == "paused"
        time.sleep(3)  # paused, its clock has stopped: nothing kills it
        assert paddock_status(e2b_env, sandbox.sandbox_id) == "paused"
        Sandbox.connect(sandbox.sandbox_id, timeout=120)
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
    finally:
        Sandbox.kill(sandbox.sandbox_id)
