"""The SDK against a real control plane on 127.0.0.1 (host seam faked; see tests/controlplane)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import paddock
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink

pytestmark = pytest.mark.db


async def test_async_client_drives_a_sandbox(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    _, key = await controlplane.new_user()
    async with paddock.AsyncClient(controlplane.url, key) as client:
        assert (await client.whoami())["stats"]["total"] == 0
        assert len(await client.shapes()) == 11
        async with await client.sandboxes.create("s-1vcpu-1gb", envs={"A": "1"}) as sb:
            assert sb.info.status == "running"
            result = await sb.run("echo", ["hi"])
            assert result.ok and result.stdout == "echo hi\n"
            frames = [f async for f in sb.stream("x")]
            assert frames[0] == {"hb": True} and frames[-1] == {"exit_code": 3}
            await sb.write_file("/tmp/x", b"\x00\x01")
            assert await sb.read_file("/tmp/x") == b"\x00\x01"
            assert (await sb.pause()).status == "paused"
            assert (await sb.resume()).status == "running"
            child = await sb.fork()
            assert (await child.wait_until("running")).forked_from == sb.id
        assert (await client.sandboxes.get(sb.id)).info.status in ("destroying", "destroyed")
        listed = await client.sandboxes.list()
        assert {s.id for s in listed} == {sb.id, child.id}


async def test_errors_are_typed(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    _, key = await controlplane.new_user()
    async with paddock.AsyncClient(controlplane.url, "pdk_wrong") as client:
        with pytest.raises(paddock.AuthenticationError) as auth:
            await client.whoami()
        assert auth.value.status == 401 and auth.value.code == "UNAUTHORIZED" and auth.value.request_id
    async with paddock.AsyncClient(controlplane.url, key) as client:
        with pytest.raises(paddock.NotFoundError):
            await client.sandboxes.get("sb-nope")
        with pytest.raises(paddock.ValidationError) as bad:
            await client.sandboxes.create("s-1vcpu-1gb", egress=["ok.com", "bad host"])
        assert "egress[1]" in bad.value.fields


async def test_sync_client_in_a_thread(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    user_id, key = await controlplane.new_user()

    def work() -> tuple[str, str, str]:
        with paddock.Client(controlplane.url, key) as client:
            with client.sandboxes.create("s-1vcpu-1gb") as sb:
                out = sb.run("echo", ["sync"]).stdout
            return client.whoami()["user_id"], out, client.sandboxes.get(sb.id).info.status

    who, out, status = await asyncio.to_thread(work)
    assert who == user_id and out == "echo sync\n" and status in ("destroying", "destroyed")


def test_retries_honour_retry_after_on_503_and_never_retry_400() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            return httpx.Response(
                503, headers={"Retry-After": "0"}, json={"status": "error", "message": "busy", "code": 503}
            )
        return httpx.Response(200, json={"status": "success", "data": {"user_id": "u", "stats": {}}})

    with paddock.Client("http://test", "k", transport=httpx.MockTransport(handler)) as client:
        assert client.whoami()["user_id"] == "u"
    assert calls == ["GET", "GET"]

    calls.clear()

    def bad(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        return httpx.Response(
            400, json={"status": "fail", "data": {"code": "VALIDATION_FAILED", "message": "no"}}
        )

    with (
        paddock.Client("http://test", "k", transport=httpx.MockTransport(bad)) as client,
        pytest.raises(paddock.ValidationError),
    ):
        client.request("POST", "v1/sandboxes", json={})
    assert calls == ["POST"]


class _ChunkRecorder(httpx.BaseTransport):
    """Records each request's headers and body chunks as the transport receives them (httpx's
    MockTransport joins the chunks before its handler sees them)."""

    def __init__(self, answers: list[httpx.Response]) -> None:
        self.answers = answers
        self.seen: list[tuple[str | None, str | None, list[bytes]]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        chunks = [bytes(chunk) for chunk in request.stream]  # type: ignore[union-attr]
        headers = request.headers
        self.seen.append((headers.get("content-length"), headers.get("transfer-encoding"), chunks))
        return self.answers.pop(0)


def test_a_bytes_upload_goes_out_with_its_length_in_slices_and_again_when_retried() -> None:
    """Bytes are sent in 1 MiB slices (httpx's sync transport copies what is left of one big body
    after every send: about half a second of CPU for 100 MB) under their Content-Length, and a retried
    PUT sends them whole again."""
    data = bytes(range(256)) * (3 * 4096 + 7)  # a little over 3 MiB
    transport = _ChunkRecorder(
        [
            httpx.Response(503, headers={"Retry-After": "0"}, json={"status": "error", "message": "busy"}),
            httpx.Response(200, json={"status": "success", "data": {"path": "/x", "size": len(data)}}),
        ]
    )
    with paddock.Client("http://test", "k", transport=transport) as client:
        sandbox = paddock.Sandbox(client, paddock.SandboxInfo.from_api({"id": "sb-1", "status": "running"}))
        assert sandbox.files.write("/x", data) == len(data)
    seen = transport.seen
    assert [(length, chunked) for length, chunked, _ in seen] == [(str(len(data)), None)] * 2
    assert all(b"".join(chunks) == data for _, _, chunks in seen)
    assert all(max(map(len, chunks)) <= 1 << 20 for _, _, chunks in seen)


def test_wait_until_long_polls_and_still_polls_a_server_that_answers_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK asks for ``wait_for``; a server that ignores it (answers at once) is polled with the
    backoff, never in a tight loop."""
    seen: list[dict[str, str]] = []
    slept: list[float] = []
    view = {"id": "sb-1", "status": "forking", "shape": "s-1vcpu-1gb"}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.url.params))
        status = "running" if len(seen) >= 3 else "forking"
        return httpx.Response(200, json={"status": "success", "data": {**view, "status": status}})

    # "At once" is judged by the clock; on a loaded machine even a mock answer can take longer than the
    # SDK's threshold, so the threshold is widened here and the sleeps are recorded instead of timed.
    monkeypatch.setattr(paddock._base, "LONG_POLL_QUICK_S", 60.0)
    monkeypatch.setattr(paddock._blocking, "sleep", slept.append)
    with paddock.Client("http://test", "k", transport=httpx.MockTransport(handler)) as client:
        sandbox = paddock.Sandbox(client, paddock.SandboxInfo.from_api(view))
        assert sandbox.wait_until("running").status == "running"
    assert len(seen) == 3 and all(p["wait_for"] == "running" and int(p["wait_ms"]) > 0 for p in seen)
    # two quick answers, each followed by a backoff sleep of at least the 100 ms poll interval
    assert len(slept) == 2 and all(seconds >= 0.09 for seconds in slept), slept


def test_sdk_imports_without_server_dependencies() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules.update({m: None for m in "
        "['fastapi','sqlalchemy','uvicorn','structlog','pydantic_settings','paddock_core']});"
        "import paddock; print(paddock.Client.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Client"


async def test_a_sandboxs_audit_trail_pages_through_the_sdk(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    """``sandbox.audit()`` follows the trail's cursors page after page, oldest or newest first, by kind;
    it outlives the sandbox; a sandbox's access token may not read it."""
    _, key = await controlplane.new_user()
    async with paddock.AsyncClient(controlplane.url, key) as client:
        sb = await client.sandboxes.create("s-1vcpu-1gb")
        for word in ("one", "two", "three", "four", "five"):
            assert (await sb.run("echo", [word])).ok
        token = (await sb.create_access_token()).token
        assert token is not None
        async with paddock.AsyncClient(controlplane.url, token) as delegated:
            with pytest.raises(paddock.PermissionDeniedError):
                await anext((await delegated.sandboxes.get(sb.id)).audit())
        await sb.destroy()

        commands = [event async for event in sb.audit(kinds=["command"], page_size=2)]
        assert [event.detail["argv"] for event in commands] == [
            ["echo", word] for word in ("one", "two", "three", "four", "five")
        ]
        assert {(event.kind, event.sandbox_id, event.detail["exit_code"]) for event in commands} == {
            ("command", sb.id, 0)
        }
        assert all(event.actor and event.actor.startswith("key_") for event in commands)
        newest = [event async for event in sb.audit(kinds=["command"], newest_first=True, page_size=3)]
        assert [event.id for event in newest] == [event.id for event in reversed(commands)]
        everything = [event async for event in sb.audit(page_size=4)]
        assert {"api", "command"} <= {event.kind for event in everything}
        assert [event.id for event in everything] == sorted(event.id for event in everything)
        later = [event async for event in sb.audit(kinds=["command"], since=commands[3].at)]
        assert [event.id for event in later] == [event.id for event in commands[3:]]
