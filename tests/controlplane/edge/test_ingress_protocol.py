"""HTTP/1.1 corners of the ingress proxy, against scripted upstream apps on 127.0.0.1.

The unit seam is the router: it answers every sandbox with address 127.0.0.1, so the proxy dials a local
asyncio server that plays the app. Routing, waking and real sandboxes are covered end to end in
tests/network/test_ingress.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from paddock_controlplane.edge.ingress import proxy as proxy_module
from paddock_controlplane.edge.ingress.proxy import IngressProxy
from paddock_controlplane.edge.ingress.routing import IngressError, Route, parse_host
from paddock_controlplane.records.app_ports import PLAIN_PORTS, AppPorts
from paddock_controlplane.records.services import Activity
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.timeutil import utcnow

SANDBOX = "sb-01testtesttesttesttesttest"
DOMAIN = "sandbox.localhost"

App = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


#: The ``maskRequestHost`` (E2B's) of the ``sb-mask…`` sandboxes of :class:`LoopbackRouter`.
HOST_MASK = "${PORT}-app.example.test"


class LoopbackRouter:
    """Every sandbox is running, ingress on, at 127.0.0.1 — except ``sb-off…`` (ingress off); the apps
    of ``sb-mask…`` get :data:`HOST_MASK` as their ``Host``."""

    async def resolve(self, sandbox_id: str, *, live_view: bool = False) -> Route:
        if sandbox_id.startswith("sb-off"):
            raise IngressError(404, "INGRESS_DISABLED", "ingress is not enabled for this sandbox")
        ports = AppPorts(HOST_MASK) if sandbox_id.startswith("sb-mask") else PLAIN_PORTS
        return Route(sandbox_id, "u", "running", "127.0.0.1", True, ports=ports)

    async def refusal(self, key: str) -> IngressError | None:
        if key.startswith("sb-off"):
            return IngressError(404, "INGRESS_DISABLED", "ingress is not enabled for this sandbox")
        return None


def services_for(**settings: Any) -> Any:
    """What the proxy reads of the control plane's services (its settings, activity and clock), with
    these settings over the tests' own: DOMAIN, no listener opened by ``start()``, 5 s idle."""
    fields = {"ingress_port": 0, "ingress_domain": DOMAIN, "data_dir": "/tmp/unused", **settings}
    fields.setdefault("ingress_idle_timeout_s", 5)
    return SimpleNamespace(settings=ControlPlaneSettings(**fields), activity=Activity(), clock=utcnow)


@pytest.fixture
async def proxy_port() -> AsyncIterator[int]:
    proxy = IngressProxy(services_for(), LoopbackRouter())  # type: ignore[arg-type]
    server = await asyncio.start_server(proxy._plain, "127.0.0.1", 0)
    proxy.servers.append(server)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        await proxy.stop()


async def start_app(handler: App) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def read_head(reader: asyncio.StreamReader) -> str:
    return (await reader.readuntil(b"\r\n\r\n")).decode()


async def talk(
    proxy_port: int, app_port: int, raw: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(raw.replace(b"HOST", f"{app_port}-{SANDBOX}.{DOMAIN}".encode()))
    await writer.drain()
    return reader, writer


def handler_from(answers: list[bytes], requests: list[str] | None = None) -> App:
    """An app that answers each request head (bodies must be absent) with the next canned answer."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            try:
                head = await read_head(reader)
            except asyncio.IncompleteReadError:
                break
            if requests is not None:
                requests.append(head)
            writer.write(answer)
            await writer.drain()
        writer.close()

    return handle


async def test_head_204_and_304_have_no_body_and_keep_the_connection(proxy_port: int) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",  # to HEAD: no body follows
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ]
    server, app_port = await start_app(handler_from(answers))
    async with server:
        reader, writer = await talk(proxy_port, app_port, b"HEAD / HTTP/1.1\r\nHost: HOST\r\n\r\n")
        assert (await read_head(reader)).startswith("HTTP/1.1 200 OK")
        for expected in ("204", "304", "200"):
            writer.write(f"GET / HTTP/1.1\r\nHost: {app_port}-{SANDBOX}.{DOMAIN}\r\n\r\n".encode())
            assert (await read_head(reader)).startswith(f"HTTP/1.1 {expected}")
        assert await reader.readexactly(2) == b"ok"
        writer.close()


async def test_chunked_with_trailers_and_a_close_delimited_body(proxy_port: int) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: yes\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\nuntil the end",
    ]
    server, app_port = await start_app(handler_from(answers))
    async with server:
        reader, writer = await talk(
            proxy_port,
            app_port,
            b"GET /a HTTP/1.1\r\nHost: HOST\r\n\r\nGET /b HTTP/1.1\r\nHost: HOST\r\n\r\n",
        )
        data = await asyncio.wait_for(reader.read(), 10)  # pipelined; the second body ends at close
        writer.close()
    assert data.count(b"HTTP/1.") == 2
    # the body is re-framed from what the parser decoded: chunk extensions go, data and trailers stay
    assert b"3\r\nabc\r\n0\r\nX-Trailer: yes\r\n\r\nHTTP/1.0 200 OK" in data
    assert data.endswith(b"until the end")


async def test_expect_100_continue_reaches_the_client_before_the_body(proxy_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await reader.readexactly(5)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" + body.upper())
        await writer.drain()
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        reader, writer = await talk(
            proxy_port,
            app_port,
            b"POST / HTTP/1.1\r\nHost: HOST\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
        )
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 100 Continue")
        writer.write(b"hello")
        assert (await read_head(reader)).startswith("HTTP/1.1 200 OK")
        assert await reader.readexactly(5) == b"HELLO"
        writer.close()


async def test_an_app_that_closed_an_idle_connection_is_redialled(proxy_port: int) -> None:
    seen: list[str] = []
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server, app_port = await start_app(handler_from([answer], seen))  # one request per connection
    async with server:
        reader, writer = await talk(proxy_port, app_port, b"GET / HTTP/1.1\r\nHost: HOST\r\n\r\n")
        for _ in range(3):
            assert (await read_head(reader)).startswith("HTTP/1.1 200 OK")
            assert await reader.readexactly(2) == b"ok"
            writer.write(f"GET / HTTP/1.1\r\nHost: {app_port}-{SANDBOX}.{DOMAIN}\r\n\r\n".encode())
        assert (await read_head(reader)).startswith("HTTP/1.1 200 OK")
        writer.close()
    assert len(seen) == 4


async def test_a_get_that_meets_a_closing_keep_alive_connection_is_sent_again(proxy_port: int) -> None:
    """The app's keep-alive timer fires just as the next request arrives: it closes without an answer."""
    connections: list[int] = []
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await read_head(reader)
        writer.write(answer)
        await writer.drain()
        if len(connections) == 1:
            await read_head(reader)  # the second request: dropped unanswered
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        request = f"GET / HTTP/1.1\r\nHost: {app_port}-{SANDBOX}.{DOMAIN}\r\n\r\n".encode()
        reader, writer = await talk(proxy_port, app_port, request)
        assert (await read_head(reader)).startswith("HTTP/1.1 200 OK")
        assert await reader.readexactly(2) == b"ok"
        writer.write(request)
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 200 OK")
        writer.close()
    assert len(connections) == 2


async def test_a_get_an_app_drops_unanswered_on_a_fresh_connection_is_sent_once_more(proxy_port: int) -> None:
    """An app that closes a new connection without answering (gVisor 2022's blocking read, which fails
    before the request arrives) is asked again once for an idempotent request, never for a POST."""
    connections: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_head(reader)
        connections.append(head.split(" ", 1)[0])
        if len(connections) % 2 == 1:  # every other connection is dropped unanswered
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        reader, writer = await talk(proxy_port, app_port, b"GET / HTTP/1.1\r\nHost: HOST\r\n\r\n")
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 200 OK")
        assert await reader.readexactly(2) == b"ok"
        writer.close()
        assert connections == ["GET", "GET"]
        reader, writer = await talk(
            proxy_port, app_port, b"POST / HTTP/1.1\r\nHost: HOST\r\nContent-Length: 2\r\n\r\nhi"
        )
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert data.startswith(b"HTTP/1.1 502 Bad Gateway"), data
    assert connections == ["GET", "GET", "POST"], "a POST is never sent twice"


async def test_absolute_form_targets_and_forwarded_headers(proxy_port: int) -> None:
    seen: list[str] = []
    server, app_port = await start_app(handler_from([b"HTTP/1.1 204 No Content\r\n\r\n"], seen))
    async with server:
        reader, writer = await talk(
            proxy_port,
            app_port,
            b"GET http://HOST/x?y=1 HTTP/1.1\r\nHost: ignored.example\r\nX-Forwarded-Proto: https\r\n\r\n",
        )
        assert (await read_head(reader)).startswith("HTTP/1.1 204")
        writer.close()
    [head] = seen
    assert head.startswith("GET /x?y=1 HTTP/1.1\r\n")
    assert "X-Forwarded-For: 127.0.0.1\r\n" in head
    assert "X-Forwarded-Proto: http\r\n" in head and "https" not in head


@pytest.mark.parametrize(
    ("answer", "code"),
    [(b"garbage\r\n\r\n", "BAD_UPSTREAM_RESPONSE"), (b"", "EMPTY_UPSTREAM_RESPONSE")],
)
async def test_a_broken_app_gets_a_502_page(proxy_port: int, answer: bytes, code: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        reader, writer = await talk(proxy_port, app_port, b"GET / HTTP/1.1\r\nHost: HOST\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert data.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert f"X-Paddock-Ingress-Error: {code}".encode() in data


async def test_a_disabled_sandbox_gets_404_and_an_html_page_for_browsers(proxy_port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(f"GET / HTTP/1.1\r\nHost: 80-sb-off1.{DOMAIN}\r\nAccept: text/html\r\n\r\n".encode())
    data: Any = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 404 Not Found")
    assert b"X-Paddock-Ingress-Error: INGRESS_DISABLED" in data and b"<h1>404 Not Found</h1>" in data


@pytest.mark.parametrize(
    ("authority", "expected"),
    [
        (f"3000-{SANDBOX}.{DOMAIN}", (SANDBOX, 3000)),
        (f"3000-{SANDBOX}.{DOMAIN}:8088", (SANDBOX, 3000)),
        (f"3000-{SANDBOX.upper()}.SANDBOX.LOCALHOST.", (SANDBOX, 3000)),
        (f"0-{SANDBOX}.{DOMAIN}", None),
        (f"65536-{SANDBOX}.{DOMAIN}", None),
        (f"{SANDBOX}.{DOMAIN}", None),
        (f"3000.{SANDBOX}.{DOMAIN}", None),
        (f"x.3000-{SANDBOX}.{DOMAIN}", None),
        (f"3000-{SANDBOX}.evil.example", None),
        (f"3000-{SANDBOX}.{DOMAIN}.evil.example", None),
        (DOMAIN, None),
        ("[::1]:8088", None),
    ],
)
def test_host_names(authority: str, expected: tuple[str, int] | None) -> None:
    target = parse_host(authority, DOMAIN)
    assert (target and (target.sandbox_id, target.port)) == expected


async def test_an_http_1_0_client_is_closed_on_unless_the_app_keeps_it(proxy_port: int) -> None:
    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"] * 2
    server, app_port = await start_app(handler_from(answers))
    async with server:
        reader, writer = await talk(
            proxy_port, app_port, b"GET / HTTP/1.0\r\nHost: HOST\r\nConnection: keep-alive\r\n\r\n"
        )
        data = await asyncio.wait_for(reader.read(), 5)  # ends: the proxy closed after the answer
        writer.close()
    assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"ok")


async def closed_after(reader: asyncio.StreamReader, limit_s: float) -> float:
    """Seconds until the proxy closes the connection (fails past ``limit_s``)."""
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(limit_s):
        assert await reader.read() == b"", "the proxy answered a request that never arrived whole"
    return asyncio.get_running_loop().time() - started


async def test_a_request_head_must_arrive_within_the_head_bound_an_idle_connection_may_stay_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request's head has serving.HEADER_TIMEOUT_S (here 1 s) from its first byte, or from the
    connection's start for its first request; between requests a connection may stay idle for
    ingress_idle_timeout_s (here 4 s). The old code gave a half-sent head the whole idle time."""
    monkeypatch.setattr(proxy_module, "HEADER_TIMEOUT_S", 1.0)
    settings = ControlPlaneSettings(
        ingress_port=0, ingress_domain=DOMAIN, data_dir="/tmp/unused", ingress_idle_timeout_s=4
    )
    services = SimpleNamespace(settings=settings, activity=Activity(), clock=utcnow)
    proxy = IngressProxy(services, LoopbackRouter())  # type: ignore[arg-type]
    server = await asyncio.start_server(proxy._plain, "127.0.0.1", 0)
    proxy.servers.append(server)
    port = server.sockets[0].getsockname()[1]
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    app, app_port = await start_app(handler_from([answer] * 3))
    try:
        async with app:
            half = b"GET / HT"
            reader, writer = await talk(port, app_port, half)  # a new connection's half request line
            assert await closed_after(reader, 3) < 2
            writer.close()
            silent, silent_writer = await asyncio.open_connection("127.0.0.1", port)  # nothing sent
            assert await closed_after(silent, 3) < 2
            silent_writer.close()

            reader, writer = await talk(port, app_port, b"GET / HTTP/1.1\r\nHost: HOST\r\n\r\n")
            assert (await read_head(reader)).startswith("HTTP/1.1 200 OK")
            assert await reader.readexactly(2) == b"ok"
            await asyncio.sleep(2)  # idle past the head bound, within the idle one: kept
            writer.write(f"GET / HTTP/1.1\r\nHost: {app_port}-{SANDBOX}.{DOMAIN}\r\n\r\n".encode())
            assert (await read_head(reader)).startswith("HTTP/1.1 200 OK")
            assert await reader.readexactly(2) == b"ok"
            writer.write(half)  # then half of a third request: the head bound, not the idle one
            assert await closed_after(reader, 3.5) < 2
            writer.close()

            idle, idle_writer = await talk(port, app_port, b"GET / HTTP/1.1\r\nHost: HOST\r\n\r\n")
            assert (await read_head(idle)).startswith("HTTP/1.1 200 OK")
            assert await idle.readexactly(2) == b"ok"
            assert 3 < await closed_after(idle, 8) < 6  # idle after an answer: ingress_idle_timeout_s
            idle_writer.close()
    finally:
        await proxy.stop()
