"""Request bodies are refused at their cap while they are read, before anything buffers them whole
(``paddock_core.bodylimit``): the control plane stops reading, answers 413 in the envelope naming the
field, and closes the connection, lingering so that a client still sending reads the answer
(``serving.LINGER_S``). Against the control plane served as ``paddock controlplane`` serves it
(``serving.config``) on 127.0.0.1, with fake hosts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from paddock_controlplane import commands
from paddock_controlplane.api.routes import bodies
from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core import serving
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.test_sandboxes_rules import api, fail_data, fake_host

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
