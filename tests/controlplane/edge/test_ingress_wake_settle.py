"""The ingress proxy right after a wake: a thawed app that refuses or drops the first connections.

Against scripted apps on 127.0.0.1 (the seam of tests/controlplane/edge/test_ingress_protocol.py): the router
says which sandbox was woken lately (``Route.settle_until``). Within that window the proxy tries the app
again until it answers; outside it a refused connect is a 502 at once and an unanswered request is sent
three times in all (``UNANSWERED_TRIES``). The real wake (gVisor, four requests racing a resume) is
tests/network/test_ingress.py::test_a_paused_sandbox_resumes_on_its_first_request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from paddock_controlplane.edge.ingress.proxy import IngressProxy
from paddock_controlplane.edge.ingress.routing import IngressError, Route
from tests.controlplane.edge.test_ingress_protocol import services_for
from tests.ports import free_port

WOKEN = "sb-01wokenwokenwokenwokenwoke"
ASLEEP_NEVER = "sb-01plainplainplainplainplai"
DOMAIN = "sandbox.localhost"
WINDOW_S = 1.5
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"


class WakeRouter:
    """Every sandbox runs at 127.0.0.1; ``WOKEN`` was woken just now (its window is ``WINDOW_S``)."""

    def __init__(self) -> None:
        self.woke_at = time.monotonic()

    async def resolve(self, sandbox_id: str, *, live_view: bool = False) -> Route:
        settle_until = self.woke_at + WINDOW_S if sandbox_id == WOKEN else 0.0
        return Route(sandbox_id, "u", "running", "127.0.0.1", True, settle_until=settle_until)

    async def refusal(self, key: str) -> IngressError | None:
        return None


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[int, WakeRouter]]:
    router = WakeRouter()
    ingress = IngressProxy(services_for(), router)  # type: ignore[arg-type]
    server = await asyncio.start_server(ingress._plain, "127.0.0.1", 0)
    ingress.servers.append(server)
    try:
        yield server.sockets[0].getsockname()[1], router
    finally:
        await ingress.stop()


async def get(proxy_port: int, sandbox_id: str, app_port: int) -> tuple[int, dict[str, str], bytes]:
    """One GET through the proxy: (status, lower-cased headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(f"GET /hello HTTP/1.1\r\nHost: {app_port}-{sandbox_id}.{DOMAIN}\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


async def dropping_app(drops: int) -> tuple[asyncio.Server, list[int]]:
    """An app that closes its first ``drops`` connections without answering, then answers each GET."""
    seen = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen[0] += 1
        if seen[0] > drops:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(ANSWER)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


def closed_port() -> int:
    """A loopback port nothing listens on (bound for a moment to pick it, then released)."""
    return free_port()


async def test_a_woken_app_that_drops_the_first_requests_is_tried_until_it_answers(
    proxy: tuple[int, WakeRouter],
) -> None:
    proxy_port, _ = proxy
    server, seen = await dropping_app(drops=4)
    async with server:
        status, _, body = await get(proxy_port, WOKEN, server.sockets[0].getsockname()[1])
    assert (status, body) == (200, b"hello")
    assert seen[0] == 5  # four dropped, the fifth answered


async def test_without_a_wake_an_app_that_drops_two_requests_answers_the_third(
    proxy: tuple[int, WakeRouter],
) -> None:
    """gVisor's early EAGAIN can drop a fresh connection twice in a row on a loaded host."""
    proxy_port, _ = proxy
    server, seen = await dropping_app(drops=2)
    async with server:
        status, _, body = await get(proxy_port, ASLEEP_NEVER, server.sockets[0].getsockname()[1])
    assert (status, body) == (200, b"hello")
    assert seen[0] == 3


async def test_without_a_wake_an_unanswered_request_is_sent_three_times_then_502(
    proxy: tuple[int, WakeRouter],
) -> None:
    proxy_port, _ = proxy
    server, seen = await dropping_app(drops=4)
    async with server:
        status, headers, body = await get(proxy_port, ASLEEP_NEVER, server.sockets[0].getsockname()[1])
    assert status == 502
    assert headers["x-paddock-ingress-error"] == "EMPTY_UPSTREAM_RESPONSE"
    assert json.loads(body)["message"] == "the sandbox closed the connection without a response"
    assert seen[0] == 3


async def test_a_woken_app_that_listens_late_is_waited_for(proxy: tuple[int, WakeRouter]) -> None:
    proxy_port, _ = proxy
    port = closed_port()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    async def listen_late() -> asyncio.Server:
        await asyncio.sleep(0.4)
        return await asyncio.start_server(answer, "127.0.0.1", port, reuse_address=True)

    late = asyncio.create_task(listen_late())
    status, _, body = await get(proxy_port, WOKEN, port)
    server = await late
    server.close()
    await server.wait_closed()
    assert (status, body) == (200, b"hello")


async def test_nothing_listening_is_a_502_at_once_without_a_wake_and_at_the_windows_end_after_one(
    proxy: tuple[int, WakeRouter],
) -> None:
    proxy_port, router = proxy
    port = closed_port()
    started = time.monotonic()
    status, headers, _ = await get(proxy_port, ASLEEP_NEVER, port)
    assert (status, headers["x-paddock-ingress-error"]) == (502, "NOTHING_LISTENING")
    assert time.monotonic() - started < 0.5

    router.woke_at = time.monotonic()
    status, headers, body = await get(proxy_port, WOKEN, port)
    waited = time.monotonic() - router.woke_at
    assert (status, headers["x-paddock-ingress-error"]) == (502, "NOTHING_LISTENING")
    assert json.loads(body)["message"] == f"nothing is listening on port {port} in the sandbox"
    assert WINDOW_S - 0.1 <= waited < WINDOW_S + 1.0, waited  # bounded by the window
