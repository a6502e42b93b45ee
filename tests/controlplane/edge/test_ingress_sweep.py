"""The ingress's sweep, against scripted apps on 127.0.0.1: what a client on an open connection sees when
the sandbox behind it is destroyed or its ingress is turned off (proxy module docstring).

The unit seam is the router, whose sandbox the test closes at will; tests/network/test_ingress.py has the
same with a real sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from paddock_controlplane.edge.ingress import proxy as proxy_module
from paddock_controlplane.edge.ingress.http2 import H2ClientConnection
from paddock_controlplane.edge.ingress.proxy import IngressProxy
from paddock_controlplane.edge.ingress.routing import IngressError, Route
from tests.controlplane.edge.test_ingress_h2 import Edge, echo_app, tls_services
from tests.controlplane.edge.test_ingress_protocol import DOMAIN, SANDBOX, services_for, start_app

SWEEP_S = 0.05
GONE = IngressError(404, "SANDBOX_NOT_FOUND", f"no sandbox {SANDBOX}")
OFF = IngressError(404, "INGRESS_DISABLED", "ingress is not enabled for this sandbox")


class ClosableRouter:
    """One running sandbox at 127.0.0.1 until the test sets ``closed`` (the refusal it then gets)."""

    def __init__(self) -> None:
        self.closed: IngressError | None = None

    async def resolve(self, sandbox_id: str, *, live_view: bool = False) -> Route:
        if self.closed is not None:
            raise self.closed
        return Route(sandbox_id, "u", "running", "127.0.0.1", True)

    async def refusal(self, key: str) -> IngressError | None:
        return self.closed


@pytest.fixture
async def proxy(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[int, ClosableRouter]]:
    monkeypatch.setattr(proxy_module, "SWEEP_S", SWEEP_S)
    router = ClosableRouter()
    served = IngressProxy(services_for(ingress_idle_timeout_s=30), router)  # type: ignore[arg-type]
    server = await asyncio.start_server(served._plain, "127.0.0.1", 0)
    served.servers.append(server)
    served._sweeper = asyncio.create_task(served._sweep())
    try:
        yield server.sockets[0].getsockname()[1], router
    finally:
        await served.stop()


async def app(behaviour: bytes | None) -> tuple[asyncio.Server, int]:
    """An app that reads each request head and answers ``behaviour`` (None: never answers, keeps it open)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                if behaviour is None:
                    await asyncio.sleep(3600)
                writer.write(behaviour)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def request(app_port: int) -> bytes:
    return f"GET /x HTTP/1.1\r\nHost: {app_port}-{SANDBOX}.{DOMAIN}\r\n\r\n".encode()


async def ask(port: int, app_port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the proxy with a request for the app on it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request(app_port))
    return reader, writer


async def test_a_request_waiting_on_its_answer_gets_the_page_when_the_sandbox_closes(
    proxy: tuple[int, ClosableRouter],
) -> None:
    port, router = proxy
    server, app_port = await app(None)
    async with server:
        reader, writer = await ask(port, app_port)
        await asyncio.sleep(4 * SWEEP_S)  # through the proxy, waiting on the app
        router.closed = OFF
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 404 Not Found\r\n"), answer
    assert b"\r\nX-Paddock-Ingress-Error: INGRESS_DISABLED\r\n" in answer


async def test_an_answer_under_way_is_cut_without_a_page_after_it(proxy: tuple[int, ClosableRouter]) -> None:
    port, router = proxy
    server, app_port = await app(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
    async with server:
        reader, writer = await ask(port, app_port)
        head = await asyncio.wait_for(reader.readuntil(b"part"), 5)
        router.closed = GONE
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest == b""  # closed short of its Content-Length, with nothing appended


async def test_an_idle_keep_alive_connection_stays_and_its_next_request_gets_the_page(
    proxy: tuple[int, ClosableRouter],
) -> None:
    port, router = proxy
    server, app_port = await app(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    async with server:
        reader, writer = await ask(port, app_port)
        first = await asyncio.wait_for(reader.readuntil(b"ok"), 5)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        router.closed = GONE
        await asyncio.sleep(6 * SWEEP_S)  # several sweeps
        writer.write(request(app_port))
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 404 Not Found\r\n"), answer
    assert b"\r\nX-Paddock-Ingress-Error: SANDBOX_NOT_FOUND\r\n" in answer


async def test_an_h2_stream_waiting_on_its_answer_gets_the_page_when_the_sandbox_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same over HTTP/2: the stream is answered with the page, not reset."""
    monkeypatch.setattr(proxy_module, "SWEEP_S", SWEEP_S)
    services, cert = tls_services(tmp_path)
    router = ClosableRouter()
    served = IngressProxy(services, router, h2=H2ClientConnection)  # type: ignore[arg-type]
    opened = await served.start()
    server, app_port = await start_app(echo_app)
    try:
        async with server:
            edge = Edge(opened[0][2], cert, app_port)
            async with edge.client() as client:
                waiting = asyncio.create_task(edge.get(client, "/sleep"))  # the app answers in 2.5 s
                await asyncio.sleep(10 * SWEEP_S)
                router.closed = GONE
                answer = await asyncio.wait_for(waiting, 2)
    finally:
        await served.stop()
    assert answer.http_version == "HTTP/2"
    assert answer.status_code == 404 and answer.headers["x-paddock-ingress-error"] == "SANDBOX_NOT_FOUND"
