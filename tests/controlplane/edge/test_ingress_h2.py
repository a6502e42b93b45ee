"""HTTP/2 on the ingress's TLS listener, against a scripted app on 127.0.0.1 (the router is the seam).

The proxy is started by its own ``start()`` with a test certificate, so ALPN is what clients meet; the
clients are httpx (``http2=True``, verifying the certificate) and a raw ``h2`` client where a test
needs to see streams and frames. Real sandboxes: tests/network/test_ingress.py.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest

from paddock_controlplane.edge.ingress.http2 import H2ClientConnection
from paddock_controlplane.edge.ingress.proxy import IngressProxy
from tests.controlplane.edge.test_ingress_protocol import (
    DOMAIN,
    SANDBOX,
    LoopbackRouter,
    services_for,
    start_app,
)
from tests.network.ingress_support import make_certificate
from tests.ports import free_port


async def echo_app(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive HTTP/1.1 app: answers ``<method> <path> host=… proto=… body=<bytes> conn=<port>``."""
    peer = writer.get_extra_info("peername")[1]
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *fields = head.split("\r\n")
            headers = {k.lower(): v for k, _, v in (f.partition(": ") for f in fields if f)}
            body = b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding") == "chunked":
                while size := int((await reader.readline()).strip(), 16):
                    body += await reader.readexactly(size)
                    await reader.readexactly(2)
                await reader.readline()
            method, path, _ = line.split(" ")
            if path.startswith("/slow"):
                await asyncio.sleep(0.3)
            if path.startswith("/big"):
                size = int(path.split("/")[2])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                for offset in range(0, size, 1 << 16):
                    writer.write(bytes([offset >> 16 & 0xFF]) * min(1 << 16, size - offset))
                    await writer.drain()
                continue
            if path.startswith("/sleep"):
                await asyncio.sleep(2.5)
            text = (
                f"{method} {path} host={headers.get('host')} proto={headers.get('x-forwarded-proto')}"
                f" cookie={headers.get('cookie')} body={len(body)} conn={peer}"
            ).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-App: yes\r\n\r\n%s" % (len(text), text))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


class Edge:
    def __init__(self, port: int, ca: Path, app_port: int) -> None:
        self.port, self.ca, self.app_port = port, ca, app_port

    @property
    def host(self) -> str:
        return f"{self.app_port}-{SANDBOX}.{DOMAIN}"

    def tls(self, alpn: list[str]) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.set_alpn_protocols(alpn)
        return context

    def client(self, *, http2: bool = True) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{self.port}",
            verify=self.tls(["h2", "http/1.1"] if http2 else ["http/1.1"]),
            http2=http2,
            http1=not http2,
            timeout=10,
        )

    async def get(self, client: httpx.AsyncClient, path: str, host: str | None = None) -> httpx.Response:
        host = host or self.host
        return await client.get(path, headers={"Host": host}, extensions={"sni_hostname": host})


def tls_services(tmp_path: Path, **settings: Any) -> tuple[Any, Path]:
    """Services whose proxy ``start()`` opens the TLS listener alone, on a free port, with a test
    certificate made in ``tmp_path``; and that certificate, for the clients to trust."""
    cert, key = make_certificate(tmp_path)
    services = services_for(
        ingress_tls_port=free_port(),
        ingress_tls_cert_file=cert,
        ingress_tls_key_file=key,
        ingress_host="127.0.0.1",
        **settings,
    )
    return services, cert


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[Edge]:
    services, cert = tls_services(tmp_path, ingress_idle_timeout_s=1)
    proxy = IngressProxy(services, LoopbackRouter(), h2=H2ClientConnection)  # type: ignore[arg-type]
    opened = await proxy.start()
    server, app_port = await start_app(echo_app)
    try:
        async with server:
            yield Edge(opened[0][2], cert, app_port)
    finally:
        await proxy.stop()


async def test_an_h2_client_gets_the_apps_answer_and_many_streams_share_one_connection(edge: Edge) -> None:
    async with edge.client() as client:
        first = await edge.get(client, "/hello")
        assert first.http_version == "HTTP/2"
        assert first.status_code == 200 and first.headers["x-app"] == "yes"
        assert first.text.startswith(f"GET /hello host={edge.host} proto=https ")
        answers = await asyncio.gather(*(edge.get(client, f"/slow/{i}") for i in range(20)))
    for i, answer in enumerate(answers):
        assert answer.http_version == "HTTP/2" and answer.status_code == 200
        assert answer.text.startswith(f"GET /slow/{i} ")
    # 20 streams ran at once (each app answer takes 0.3 s), so several upstream connections served them
    assert len({a.text.split("conn=")[1] for a in answers}) > 1


async def test_a_masked_sandbox_app_gets_the_mask_as_its_host_over_h2_and_http_1_1(edge: Edge) -> None:
    """E2B's ``maskRequestHost``: the app sees the mask, with its port, in ``Host`` (the client's stays
    in ``X-Forwarded-Host``); a sandbox without one sees the client's."""
    masked = f"{edge.app_port}-sb-mask{SANDBOX[7:]}.{DOMAIN}"
    for http2 in (True, False):
        async with edge.client(http2=http2) as client:
            answer = await edge.get(client, "/hello", host=masked)
            assert answer.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
            assert answer.text.startswith(f"GET /hello host={edge.app_port}-app.example.test "), answer.text
            plain = await edge.get(client, "/hello")
            assert plain.text.startswith(f"GET /hello host={edge.host} "), plain.text


async def test_sequential_h2_requests_reuse_one_upstream_connection(edge: Edge) -> None:
    async with edge.client() as client:
        answers = [await edge.get(client, "/hello") for _ in range(5)]
    assert len({a.text.split("conn=")[1] for a in answers}) == 1


async def test_request_bodies_and_cookies_over_h2(edge: Edge) -> None:
    async with edge.client() as client:
        sized = await client.post(
            "/echo",
            content=b"x" * 300_000,
            headers={"Host": edge.host},
            extensions={"sni_hostname": edge.host},
        )

        async def pieces() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"y" * 50_000

        streamed = await client.post(
            "/echo", content=pieces(), headers={"Host": edge.host}, extensions={"sni_hostname": edge.host}
        )
        cookies = await client.get(
            "/c",
            headers=[("Host", edge.host), ("Cookie", "a=1"), ("Cookie", "b=2")],
            extensions={"sni_hostname": edge.host},
        )
    assert sized.status_code == 200 and "body=300000 " in sized.text  # larger than the stream window
    assert streamed.status_code == 200 and "body=500000 " in streamed.text  # no length: chunked upstream
    assert "cookie=a=1; b=2 " in cookies.text


async def test_the_proxys_own_pages_are_the_same_over_h2(edge: Edge) -> None:
    async with edge.client() as h2c, edge.client(http2=False) as h1c:
        for host in (f"{edge.app_port}-sb-off{SANDBOX[6:]}.{DOMAIN}", f"nonsense.{DOMAIN}"):
            over_h2, over_h1 = await edge.get(h2c, "/", host), await edge.get(h1c, "/", host)
            assert over_h2.http_version == "HTTP/2" and over_h1.http_version == "HTTP/1.1"
            assert over_h2.status_code == over_h1.status_code == 404
            assert over_h2.headers["x-paddock-ingress-error"] == over_h1.headers["x-paddock-ingress-error"]
            assert over_h2.json() == over_h1.json()
        closed_port = await edge.get(h2c, "/", f"{free_port()}-{SANDBOX}.{DOMAIN}")
    assert closed_port.status_code == 502
    assert closed_port.headers["x-paddock-ingress-error"] == "NOTHING_LISTENING"


async def test_http_1_1_over_tls_is_unchanged(edge: Edge) -> None:
    async with edge.client(http2=False) as client:
        answers = [await edge.get(client, "/hello") for _ in range(3)]
    assert all(a.http_version == "HTTP/1.1" and a.status_code == 200 for a in answers)
    assert answers[0].text.startswith(f"GET /hello host={edge.host} proto=https ")


@dataclass
class Answer:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    ended: bool = False
    reset: int | None = None


class RawH2:
    """A bare ``h2`` client on one TLS connection, to see each stream's answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.conn.initiate_connection()
        self.responses: dict[int, Answer] = {}
        self.settings_received = False
        self.terminated: object = None

    @classmethod
    async def open(cls, edge: Edge) -> RawH2:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", edge.port, ssl=edge.tls(["h2"]), server_hostname=edge.host
        )
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        client = cls(reader, writer)
        await client.flush()
        return client

    async def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    def request(self, host: str, path: str, extra: list[tuple[bytes, bytes]] = ()) -> int:  # type: ignore[assignment]
        stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (b":method", b"GET"),
            (b":scheme", b"https"),
            (b":authority", host.encode()),
            (b":path", path.encode()),
        ]
        self.conn.send_headers(stream_id, headers + list(extra), end_stream=True)
        self.responses[stream_id] = Answer()
        return stream_id

    def receive(self, data: bytes) -> None:
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                self.responses[event.stream_id].headers = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                self.responses[event.stream_id].body += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.responses[event.stream_id].ended = True
            elif isinstance(event, h2.events.StreamReset):
                self.responses[event.stream_id].reset = event.error_code
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                self.settings_received = True
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.terminated = event.error_code

    async def until_settings(self) -> None:
        async with asyncio.timeout(10):
            while not self.settings_received:
                data = await self.reader.read(65536)
                assert data, "the proxy closed the connection"
                self.receive(data)
                await self.flush()

    async def until_done(self, streams: list[int], timeout_s: float = 10) -> None:
        async with asyncio.timeout(timeout_s):
            while not all(self.responses[s].ended or self.responses[s].reset is not None for s in streams):
                data = await self.reader.read(65536)
                assert data, "the proxy closed the connection"
                self.receive(data)
                await self.flush()


async def test_idleness_counts_from_the_clients_preface_not_from_the_handshake(edge: Edge) -> None:
    """A client slow to send its preface after the handshake (a busy machine: run 52 saw a GOAWAY with
    last stream 0 at a first request) has its first request served. Idle timeout 1 s in this fixture;
    the proxy counted it from the handshake and said GOAWAY as soon as the preface came."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", edge.port, ssl=edge.tls(["h2"]), server_hostname=edge.host
    )
    await asyncio.sleep(1.3)
    client = RawH2(reader, writer)
    await client.flush()  # the preface
    await asyncio.sleep(0.3)
    stream = client.request(edge.host, "/hello")
    await client.flush()
    await client.until_done([stream], timeout_s=10)
    assert client.terminated is None and client.responses[stream].headers[b":status"] == b"200"
    writer.close()


async def test_a_body_that_came_with_its_headers_in_one_read_reaches_the_app(edge: Edge) -> None:
    """HEADERS without a length, then DATA with END_STREAM, in one write (as E2B's SDK sends a Connect
    call): the stream has ended by the time the proxy reads the request, and its body must still go
    to the app. The proxy sent it without one (a Connect server saw an empty request)."""
    client = await RawH2.open(edge)
    await client.until_settings()
    stream_id = client.conn.get_next_available_stream_id()
    headers = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", edge.host.encode())]
    client.conn.send_headers(stream_id, [*headers, (b":path", b"/echo")])
    client.conn.send_data(stream_id, b"z" * 1234, end_stream=True)
    client.responses[stream_id] = Answer()
    await client.flush()  # all three frames in one write
    await client.until_done([stream_id])
    answer = client.responses[stream_id]
    assert answer.headers.get(b":status") == b"200", answer
    assert b"POST /echo " in answer.body and b" body=1234 " in answer.body, answer.body
    client.writer.close()


async def test_oversized_headers_get_431_on_their_stream_and_the_others_go_on(edge: Edge) -> None:
    client = await RawH2.open(edge)
    before = client.request(edge.host, "/before")
    big = client.request(edge.host, "/big", [(b"x-big", b"a" * 70_000)])
    after = client.request(edge.host, "/after")
    await client.flush()
    await client.until_done([before, big, after])
    refused = client.responses[big]
    assert refused.headers[b":status"] == b"431"
    assert refused.headers[b"x-paddock-ingress-error"] == b"REQUEST_HEAD_TOO_LARGE"
    for stream, path in ((before, "/before"), (after, "/after")):
        assert client.responses[stream].headers[b":status"] == b"200"
        assert client.responses[stream].body.startswith(f"GET {path} ".encode())
    # the connection is still good for another request
    again = client.request(edge.host, "/again")
    await client.flush()
    await client.until_done([again])
    assert client.responses[again].body.startswith(b"GET /again ")
    client.writer.close()


async def test_a_hundred_concurrent_streams_are_served_and_rapid_resets_end_the_connection(
    edge: Edge,
) -> None:
    client = await RawH2.open(edge)
    await client.until_settings()
    assert client.conn.remote_settings.max_concurrent_streams == 100
    assert client.conn.remote_settings.max_header_list_size == 64 * 1024
    streams = [client.request(edge.host, f"/slow/{i}") for i in range(100)]
    await client.flush()
    await client.until_done(streams, timeout_s=30)
    for i, stream in enumerate(streams):
        assert client.responses[stream].headers[b":status"] == b"200"
        assert client.responses[stream].body.startswith(f"GET /slow/{i} ".encode())
    # "rapid reset": opening streams and cancelling them at once costs the proxy a task and a dial
    # each, so past a budget the connection ends
    for _ in range(5):
        for _ in range(60):
            stream = client.request(edge.host, "/slow/reset")
            client.conn.reset_stream(stream)
        try:
            await client.flush()
        except ConnectionError:
            break  # the proxy has given up on this connection (its GOAWAY is read below)
        await asyncio.sleep(0.1)
    async with asyncio.timeout(10):
        while not client.terminated:
            data = await client.reader.read(65536)
            if not data:
                break
            client.receive(data)
    assert client.terminated == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    client.writer.close()


async def test_a_large_response_arrives_whole_through_the_clients_windows(edge: Edge) -> None:
    size = 3 * 1024 * 1024 + 5  # many times the client's 64 KiB default windows
    async with edge.client() as client:
        answer = await edge.get(client, f"/big/{size}")
    assert answer.http_version == "HTTP/2" and answer.status_code == 200
    expected = b"".join(bytes([o >> 16 & 0xFF]) * min(1 << 16, size - o) for o in range(0, size, 1 << 16))
    assert answer.content == expected


async def test_a_long_request_outlives_the_idle_timeout_and_an_idle_connection_is_closed(edge: Edge) -> None:
    """Idle timeout 1 s in this fixture: a 2.5 s request is not cut, and 1 s after it the proxy says GOAWAY."""
    client = await RawH2.open(edge)
    stream = client.request(edge.host, "/sleep")
    await client.flush()
    await client.until_done([stream], timeout_s=10)
    assert client.responses[stream].headers[b":status"] == b"200"
    ended = asyncio.get_running_loop().time()
    async with asyncio.timeout(5):
        while client.terminated is None:
            data = await client.reader.read(65536)
            assert data, "closed without a GOAWAY"
            client.receive(data)
    assert client.terminated == h2.errors.ErrorCodes.NO_ERROR
    assert 0.7 < asyncio.get_running_loop().time() - ended < 3
    client.writer.close()
