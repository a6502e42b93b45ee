"""Request bodies are refused at their cap while they are read, before anything buffers them whole
(``paddock_core.bodylimit``): the control plane stops reading, answers 413 in the envelope naming the
field, and closes the connection, lingering so that a client still sending reads the answer
(``serving.LINGER_S``). Against the control plane served as ``paddock controlplane`` serves it
(``serving.config``) on 127.0.0.1, with fake hosts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.edge.api.routes import bodies
from paddock_controlplane.sandboxes import commands
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core import bodylimit, serving
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fail_data, fake_host

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db

MIB = 1 << 20


@pytest.fixture
async def controlplane(cp_settings: ControlPlaneSettings) -> AsyncIterator[ControlPlane]:
    """conftest's control plane, served with the services' own uvicorn settings."""
    await migrate(cp_settings)
    server = uvicorn.Server(serving.config(create_app(cp_settings), "127.0.0.1", 0))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server exited during start-up"
            await asyncio.sleep(0.01)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            yield ControlPlane(url=url, settings=cp_settings, http=http)
    finally:
        server.should_exit = True
        await task


async def body(head: bytes, size: int, tail: bytes = b"") -> AsyncIterator[bytes]:
    """``head``, ``size`` bytes of ``a`` a MiB at a time, ``tail``: never held whole."""
    yield head
    piece = b"a" * MIB
    for _ in range(size // MIB):
        yield piece
    yield tail


async def test_an_exec_body_past_its_cap_is_413_naming_stdin_and_the_client_reads_it(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    """The client is still sending 224 MiB past the cap when the answer is written: the server
    half-closes and drops the rest, so the answer reaches it instead of a reset."""
    created = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    sid = created.json()["data"]["id"]
    answer = await api.post(
        f"/v1/sandboxes/{sid}/exec",
        content=body(b'{"cmd":"cat","stdin":"', 256 * MIB, b'"}'),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 413, answer.text
    assert answer.headers["connection"] == "close"
    assert "stdin" in fail_data(answer)
    # The next request, on a new connection, is served.
    assert (await api.get(f"/v1/sandboxes/{sid}")).status_code == 200


async def test_a_declared_length_past_the_cap_is_refused_before_the_body(api: httpx.AsyncClient) -> None:
    answer = await api.post(
        "/v1/sandboxes",
        content=body(b"{", 64 * MIB, b"}"),
        headers={"Content-Type": "application/json", "Content-Length": str(64 * MIB + 2)},
    )
    assert answer.status_code == 413, answer.text
    assert fail_data(answer)["body"] == f"is over the {bodies.MAX_BODY_BYTES}-byte limit"


async def test_stdin_over_its_limit_within_the_body_cap_is_413_naming_stdin(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    created = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    sid = created.json()["data"]["id"]
    over = "é" * (commands.MAX_EXEC_STDIN_BYTES // 2 + 1)  # 2 bytes each in UTF-8
    answer = await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "cat", "stdin": over})
    assert answer.status_code == 413, answer.text
    assert fail_data(answer)["stdin"].startswith(f"is over {commands.MAX_EXEC_STDIN_BYTES} bytes")


async def test_a_body_that_stops_coming_is_408_and_a_slow_honest_upload_goes_through(
    controlplane: ControlPlane, api: httpx.AsyncClient
) -> None:
    """A client sends a request's head and then its body a byte at a time: past the grace
    (``bodylimit.BODY_GRACE_S``, 20 s) it must keep ``BODY_MIN_BYTES_PER_S`` (16 KiB/s), so it gets a
    408 in the envelope and the connection closes (on the old code nothing ended it). Meanwhile an
    upload streamed at three times that rate for longer than the grace is stored whole."""
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    port = int(controlplane.url.rsplit(":", 1)[1])
    rate, seconds = 3 * bodylimit.BODY_MIN_BYTES_PER_S, bodylimit.BODY_GRACE_S + 6

    async def trickle() -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (
            f"PUT /v1/sandboxes/{sid}/files?path=/root/trickled HTTP/1.1\r\nHost: cp\r\n"
            f"X-Api-Key: {api.headers['X-Api-Key']}\r\nContent-Length: 100000\r\n\r\n"
        )
        writer.write(head.encode())
        started = asyncio.get_running_loop().time()

        async def drip() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    writer.write(b"x")
                    await writer.drain()
                    await asyncio.sleep(1)

        dripping = asyncio.create_task(drip())
        try:
            async with asyncio.timeout(bodylimit.BODY_GRACE_S + 10):
                answer = await reader.read()  # the whole answer, up to the server's close
        finally:
            dripping.cancel()
            writer.close()
        return asyncio.get_running_loop().time() - started, answer

    async def slow_upload() -> AsyncIterator[bytes]:
        for _ in range(int(seconds * 4)):
            yield b"u" * (rate // 4)
            await asyncio.sleep(0.25)

    async def upload() -> httpx.Response:
        return await api.put(
            f"/v1/sandboxes/{sid}/files", params={"path": "/root/slow"}, content=slow_upload(), timeout=90
        )

    (took_s, answer), uploaded = await asyncio.gather(trickle(), upload())
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout", answer[:300]
    assert b'"REQUEST_TIMEOUT"' in rest and b"bytes/s" in rest, rest
    assert bodylimit.BODY_GRACE_S - 1 < took_s < bodylimit.BODY_GRACE_S + 5, took_s
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["data"]["size"] == int(seconds * 4) * (rate // 4)


async def test_only_the_wait_for_the_client_counts_against_its_body_rate() -> None:
    """An app that works before it reads the body (a paused sandbox resumed before an upload) does not
    make its client slow: here the grace is 1 s and the rate 1 MiB/s, the app starts reading after 6 s,
    and a body sent at once is read whole (counted from the head instead, the first read that had to
    wait for the socket was past its deadline: a 408)."""

    async def app(scope: dict, receive: Any, send: Any) -> None:  # type: ignore[type-arg]
        await asyncio.sleep(6)
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})

    limited = bodylimit.BodyLimit(
        app,
        default_bytes=64 * MIB,
        refuse=lambda limit, field: ValueError(field),
        render=lambda exc: app,  # never reached: nothing is over its cap
    )
    limited.grace_s, limited.min_bytes_per_s = 1.0, MIB  # loopback sends far faster than 1 MiB/s
    server = uvicorn.Server(serving.config(limited, "127.0.0.1", 0))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.put(url + "/upload", content=b"b" * (4 * MIB))
        assert answer.status_code == 200 and answer.text == str(4 * MIB), answer.text
    finally:
        server.should_exit = True
        await task
