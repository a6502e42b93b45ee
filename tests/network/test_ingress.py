"""Ingress as a user meets it: an HTTP app in a real sandbox, reached through ``ingress_url_template``.

One platform (control plane with the ingress proxy on plain HTTP and on HTTPS with a test certificate,
plus one real host agent) serves the module. The app is ``sandbox_app.pl`` (see ingress_support).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

import paddock
from paddock_controlplane.edge.ingress.proxy import SWEEP_S
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform
from tests.network.ingress_support import (
    APP_PORT,
    DOMAIN,
    create_sandbox,
    ingress_client,
    ingress_host,
    make_certificate,
    start_app,
    start_ingress_platform,
)
from tests.ports import free_port

__all__ = ["debian_image", "guest_binary_dir"]

pytestmark = [pytest.mark.root, pytest.mark.slow]


class Ingress:
    def __init__(self, platform: LivePlatform, port: int, tls_port: int, ca_file: Path) -> None:
        self.platform, self.port, self.tls_port, self.ca_file = platform, port, tls_port, ca_file
        self.key = platform.api_key()

    def http(self) -> httpx.Client:
        return self.platform.http(self.key)

    def client(self, sandbox_id: str, port: int = APP_PORT, **options: object) -> httpx.Client:
        return ingress_client(self.port, sandbox_id, port, **options)


@pytest.fixture(scope="module")
def ingress(
    debian_image: Path, guest_binary_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ingress]:
    cert_file, key_file = make_certificate(tmp_path_factory.mktemp("tls"))
    tls_port = free_port()
    platform, port = start_ingress_platform(
        guest_binary_dir,
        cp_env={
            "PADDOCK_CP_INGRESS_TLS_PORT": str(tls_port),
            "PADDOCK_CP_INGRESS_TLS_CERT_FILE": str(cert_file),
            "PADDOCK_CP_INGRESS_TLS_KEY_FILE": str(key_file),
            "PADDOCK_CP_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",  # a dead local URL, to list the events
        },
    )
    try:
        yield Ingress(platform, port, tls_port, cert_file)
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def app_sandbox(ingress: Ingress) -> Iterator[dict[str, object]]:
    """A running sandbox with ingress on and the app listening on port 8000."""
    with ingress.http() as http:
        sandbox = create_sandbox(http, ingress_enabled=True)
        start_app(http, str(sandbox["id"]))
        yield sandbox
        http.delete(f"/v1/sandboxes/{sandbox['id']}")


def _wait_for(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def test_the_ingress_url_works_with_curl(ingress: Ingress, app_sandbox: dict[str, object]) -> None:
    template = str(app_sandbox["ingress_url_template"])
    assert template == f"http://<port>-{app_sandbox['id']}.{DOMAIN}:{ingress.port}"
    url = template.replace("<port>", str(APP_PORT)) + "/hello"
    out = subprocess.run(["curl", "-si", "--max-time", "20", url], capture_output=True, text=True, check=True)
    status, _, rest = out.stdout.partition("\n")
    assert status == "HTTP/1.1 200 OK", out.stdout
    assert "hello from " in rest
    assert "X-Seen-Forwarded-For: 127.0.0.1" in rest  # the app learns who called
    # an app's own 404 is passed through untouched (not the proxy's page)
    with ingress.client(str(app_sandbox["id"])) as client:
        missing = client.get("/no-such-route")
    assert missing.status_code == 404 and missing.text == "app: no route\n"
    assert "x-paddock-ingress-error" not in missing.headers


def test_keep_alive_reuses_one_connection_to_the_app(
    ingress: Ingress, app_sandbox: dict[str, object], pause_s: float = 0.0
) -> None:
    """Five requests on one client connection reach the app on one upstream connection. ``pause_s``
    between them leaves the app's server waiting for the next request in a read (the gVisor tier's
    case: tests/integration/test_network_tiers.py)."""
    answers = []
    with ingress.client(str(app_sandbox["id"])) as client:
        for index in range(5):
            if index and pause_s:
                time.sleep(pause_s)
            answers.append(client.get("/hello"))
    assert all(a.status_code == 200 for a in answers)
    # the app prints the client port it saw: one upstream connection served all five
    assert len({a.text.split("conn=")[1] for a in answers}) == 1


def test_https_with_a_configured_certificate(ingress: Ingress, app_sandbox: dict[str, object]) -> None:
    url = f"https://{ingress_host(str(app_sandbox['id']))}:{ingress.tls_port}/hello"
    out = subprocess.run(
        ["curl", "-s", "--max-time", "20", "--cacert", str(ingress.ca_file), url],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello from ")


def _tls_client(ingress: Ingress, *, http2: bool) -> httpx.AsyncClient:
    """httpx on the TLS listener, verifying the test CA; requests name the sandbox host for SNI too."""
    return httpx.AsyncClient(
        base_url=f"https://127.0.0.1:{ingress.tls_port}",
        verify=str(ingress.ca_file),
        http2=http2,
        http1=not http2,
        timeout=30,
    )


def _get(client: httpx.AsyncClient, path: str, host: str) -> Coroutine[Any, Any, httpx.Response]:
    return client.get(path, headers={"Host": host}, extensions={"sni_hostname": host})


def test_curl_negotiates_http2_over_tls_and_http_1_1_still_works(
    ingress: Ingress, app_sandbox: dict[str, object]
) -> None:
    assert "HTTP2" in subprocess.run(["curl", "-V"], capture_output=True, text=True, check=True).stdout
    url = f"https://{ingress_host(str(app_sandbox['id']))}:{ingress.tls_port}/hello"
    for flag, status in (("--http2", "HTTP/2 200"), ("--http1.1", "HTTP/1.1 200 OK")):
        out = subprocess.run(
            ["curl", "-si", flag, "--max-time", "20", "--cacert", str(ingress.ca_file), url],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        head, _, body = out.stdout.replace("\r\n", "\n").partition("\n\n")
        assert head.splitlines()[0].strip() == status, out.stdout
        assert body.startswith("hello from "), out.stdout
        assert "x-seen-forwarded-for: 127.0.0.1" in head.lower()


def test_concurrent_http2_streams_each_get_their_answer(
    ingress: Ingress, app_sandbox: dict[str, object]
) -> None:
    host = ingress_host(str(app_sandbox["id"]))
    upload = os.urandom(1 << 20)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        async with _tls_client(ingress, http2=True) as client:
            streams = [_get(client, f"/stream?n={n}&ms=100", host) for n in range(1, 9)]
            posted = client.post(
                "/echo", content=upload, headers={"Host": host}, extensions={"sni_hostname": host}
            )
            *answers, echo = await asyncio.gather(*streams, posted)
            missing = await _get(client, "/", f"{APP_PORT}-sb-01nosuchsandbox0000000000.{DOMAIN}")
            return answers, echo, missing

    answers, echo, missing = asyncio.run(scenario())
    for n, answer in enumerate(answers, start=1):
        assert answer.http_version == "HTTP/2" and answer.status_code == 200
        assert answer.text == "".join(f"chunk {i}\n" for i in range(1, n + 1))
    assert echo.text.strip() == f"bytes={len(upload)} sum={sum(upload) % 2**32}"
    # a missing sandbox answers the same page as over HTTP/1.1
    with ingress.client("sb-01nosuchsandbox0000000000") as client:
        over_h1 = client.get("/")
    assert missing.http_version == "HTTP/2"
    assert missing.status_code == over_h1.status_code == 404
    assert missing.headers["x-paddock-ingress-error"] == over_h1.headers["x-paddock-ingress-error"]
    assert missing.json() == over_h1.json()


def test_oversized_headers_over_http2_are_refused_on_their_stream_only(
    ingress: Ingress, app_sandbox: dict[str, object]
) -> None:
    host = ingress_host(str(app_sandbox["id"]))

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with _tls_client(ingress, http2=True) as client:
            slow = _get(client, "/stream?n=3&ms=300", host)
            big = client.get(
                "/hello", headers={"Host": host, "X-Big": "a" * 70_000}, extensions={"sni_hostname": host}
            )
            first, refused = await asyncio.gather(slow, big)
            after = await _get(client, "/hello", host)
            return first, refused, after

    first, refused, after = asyncio.run(scenario())
    assert refused.http_version == "HTTP/2" and refused.status_code == 431
    assert refused.headers["x-paddock-ingress-error"] == "REQUEST_HEAD_TOO_LARGE"
    assert first.status_code == 200 and first.text == "chunk 1\nchunk 2\nchunk 3\n"
    assert after.status_code == 200 and after.text.startswith("hello from ")


def test_http2_wakes_a_paused_sandbox_and_a_stream_is_cut_when_ingress_is_turned_off(
    ingress: Ingress,
) -> None:
    with ingress.http() as http:
        sandbox_id = str(create_sandbox(http, ingress_enabled=True)["id"])
        start_app(http, sandbox_id)
        host = ingress_host(sandbox_id)
        paused = http.post(f"/v1/sandboxes/{sandbox_id}/pause")
        assert paused.status_code == 200, paused.text

        async def wake() -> list[httpx.Response]:
            async with _tls_client(ingress, http2=True) as client:
                return list(await asyncio.gather(*(_get(client, "/hello", host) for _ in range(4))))

        answers = asyncio.run(wake())
        assert [(a.http_version, a.status_code) for a in answers] == [("HTTP/2", 200)] * 4, [
            (a.status_code, a.headers.get("x-paddock-ingress-error")) for a in answers
        ]
        assert all(a.text.startswith("hello from ") for a in answers)
        assert http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]["status"] == "running"

        async def cut() -> tuple[list[str], BaseException | None]:
            lines: list[str] = []
            async with _tls_client(ingress, http2=True) as client:
                request = client.build_request(
                    "GET", "/stream?n=100&ms=200", headers={"Host": host}, extensions={"sni_hostname": host}
                )
                response = await client.send(request, stream=True)
                try:
                    async for line in response.aiter_lines():
                        lines.append(line)
                        if len(lines) == 2:
                            patched = await asyncio.to_thread(
                                http.patch, f"/v1/sandboxes/{sandbox_id}", json={"ingress_enabled": False}
                            )
                            assert patched.status_code == 200, patched.text
                except httpx.HTTPError as exc:
                    return lines, exc
                finally:
                    await response.aclose()
            return lines, None

        started = time.monotonic()
        lines, error = asyncio.run(cut())
        # the stream ends broken (reset) within seconds, not after the app's 100 chunks (20 s)
        assert error is not None and len(lines) < 30, (lines, error)
        assert time.monotonic() - started < 15
        http.delete(f"/v1/sandboxes/{sandbox_id}")


def test_latency_of_100_sequential_requests_http2_and_http_1_1(
    ingress: Ingress, app_sandbox: dict[str, object]
) -> None:
    """Both protocols serve 100 requests in a row on one TLS connection; the timings go to the log."""
    host = ingress_host(str(app_sandbox["id"]))

    async def run(http2: bool) -> tuple[float, list[httpx.Response]]:
        async with _tls_client(ingress, http2=http2) as client:
            await _get(client, "/hello", host)  # the handshake, not timed
            started = time.perf_counter()
            answers = [await _get(client, "/hello", host) for _ in range(100)]
            return time.perf_counter() - started, answers

    for http2, version in ((True, "HTTP/2"), (False, "HTTP/1.1")):
        elapsed, answers = asyncio.run(run(http2))
        assert all(a.http_version == version and a.text.startswith("hello from ") for a in answers)
        # one upstream connection served them all (reused between streams over HTTP/2 too)
        assert len({a.text.split("conn=")[1] for a in answers}) == 1
        print(f"{version}: 100 sequential requests in {elapsed * 1000:.0f} ms ({elapsed * 10:.2f} ms each)")
    # the same with curl (a C client: less of the client in the timing), 100 URLs on one connection
    url = f"https://{host}:{ingress.tls_port}/hello"
    for flag, version in (("--http2", "2"), ("--http1.1", "1.1")):
        out = subprocess.run(
            ["curl", "-s", flag, "--cacert", str(ingress.ca_file), "--max-time", "60",
             "-w", "%{http_version} %{num_connects} %{time_total}\\n",
             *[arg for _ in range(101) for arg in ("-o", "/dev/null", url)]],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows = [line.split() for line in out.stdout.splitlines()]
        assert len(rows) == 101 and all(row[0] == version for row in rows), out.stdout
        assert sum(int(row[1]) for row in rows) == 1  # one connection for all
        total = sum(float(row[2]) for row in rows[1:])
        print(f"curl {flag}: 100 sequential requests in {total * 1000:.0f} ms ({total * 10:.2f} ms each)")


def test_ingress_works_under_a_strict_egress_allowlist(ingress: Ingress) -> None:
    """Egress rules restrict what the sandbox dials; answers to ingress requests are not egress dials."""
    with ingress.http() as http:
        sandbox = create_sandbox(http, ingress_enabled=True, egress=["192.0.2.1:443"])
        sandbox_id = str(sandbox["id"])
        start_app(http, sandbox_id)
        with ingress.client(sandbox_id) as client:
            answers = [client.get("/hello") for _ in range(3)]
            streamed = client.get("/zeros?mib=4")
        assert [a.status_code for a in answers] == [200] * 3
        assert streamed.status_code == 200 and len(streamed.content) == 4 << 20
        http.delete(f"/v1/sandboxes/{sandbox_id}")


def test_not_reachable_without_ingress_and_patch_toggles_it_live(ingress: Ingress) -> None:
    with ingress.http() as http:
        sandbox = create_sandbox(http)
        sandbox_id = str(sandbox["id"])
        assert "ingress_url_template" not in sandbox
        start_app(http, sandbox_id)
        with ingress.client(sandbox_id) as client:
            closed = client.get("/hello")
            assert closed.status_code == 404
            assert closed.headers["x-paddock-ingress-error"] == "INGRESS_DISABLED"
            assert closed.json()["data"]["code"] == "INGRESS_DISABLED"

            view = http.patch(f"/v1/sandboxes/{sandbox_id}", json={"ingress_enabled": True}).json()["data"]
            assert view["ingress_url_template"].startswith(f"http://<port>-{sandbox_id}.")
            _wait_for(lambda: client.get("/hello").status_code == 200)

            view = http.patch(f"/v1/sandboxes/{sandbox_id}", json={"ingress_enabled": False}).json()["data"]
            assert "ingress_url_template" not in view
            _wait_for(lambda: client.get("/hello").status_code == 404)
        http.delete(f"/v1/sandboxes/{sandbox_id}")


def _answer(sock: socket.socket) -> tuple[str, bytes]:
    """One response read off a raw connection: its head and its (Content-Length) body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection was closed without an answer after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    assert length, head
    while len(body) < int(length.group(1)):
        chunk = sock.recv(65536)
        assert chunk, body
        body += chunk
    return head.decode(), body


def test_unknown_host_unknown_and_destroyed_sandbox_get_a_404_page(ingress: Ingress) -> None:
    """A keep-alive connection that outlives its sandbox answers its next request with the 404 page:
    the sweep that cuts exchanges with a destroyed sandbox leaves an idle connection alone, so a client
    that reuses it gets an answer, not a dropped connection (CI once saw "Server disconnected")."""
    with httpx.Client(base_url=f"http://127.0.0.1:{ingress.port}", timeout=30) as raw:
        stranger = raw.get("/", headers={"Host": "example.com"})
        assert stranger.status_code == 404
        assert stranger.headers["x-paddock-ingress-error"] == "UNKNOWN_HOST"
        unknown = raw.get(
            "/", headers={"Host": f"8000-sb-00000000000000000000000000.{DOMAIN}", "Accept": "text/html"}
        )
        assert unknown.status_code == 404
        assert unknown.headers["content-type"].startswith("text/html")
        assert "<h1>404 Not Found</h1>" in unknown.text and "Traceback" not in unknown.text
    with ingress.http() as http:
        sandbox = create_sandbox(http, ingress_enabled=True)
        sandbox_id = str(sandbox["id"])
        start_app(http, sandbox_id)
        request = f"GET /hello HTTP/1.1\r\nHost: {ingress_host(sandbox_id)}:{ingress.port}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", ingress.port), timeout=20) as sock:
            sock.sendall(request)
            head, body = _answer(sock)
            assert head.startswith("HTTP/1.1 200 "), head
            assert body.startswith(b"hello from ")
            assert http.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 200
            _wait_for(
                lambda: http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]["status"] == "destroyed", 30
            )
            time.sleep(3 * SWEEP_S)  # the proxy's sweep has looked at this connection since
            sock.sendall(request)
            head, body = _answer(sock)
        assert head.startswith("HTTP/1.1 404 "), head
        assert "\r\nX-Paddock-Ingress-Error: SANDBOX_NOT_FOUND\r\n" in head + "\r\n", head


def test_nothing_listening_gets_a_502_page(ingress: Ingress, app_sandbox: dict[str, object]) -> None:
    with ingress.client(str(app_sandbox["id"]), port=9) as client:
        answer = client.get("/")
    assert answer.status_code == 502
    assert answer.headers["x-paddock-ingress-error"] == "NOTHING_LISTENING"
    assert answer.json()["message"] == "nothing is listening on port 9 in the sandbox"


def test_a_paused_sandbox_resumes_on_its_first_request(ingress: Ingress) -> None:
    """Four requests race to a paused sandbox: all are answered, and it resumed once (one webhook event)."""
    with ingress.http() as http:
        hook = http.post(
            "/v1/webhook-endpoints",
            json={"url": f"http://127.0.0.1:{free_port()}/hook", "events": ["sandbox.resume"]},
        )
        assert hook.status_code == 200, hook.text
        sandbox = create_sandbox(http, ingress_enabled=True)
        sandbox_id = str(sandbox["id"])
        start_app(http, sandbox_id)
        paused = http.post(f"/v1/sandboxes/{sandbox_id}/pause")
        assert paused.status_code == 200, paused.text
        assert http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]["status"] == "paused"

        def fetch(_: int) -> httpx.Response:
            with ingress.client(sandbox_id) as client:
                return client.get("/hello")

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(fetch, range(4)))
        assert [a.status_code for a in answers] == [200] * 4, [
            (a.status_code, a.headers.get("x-paddock-ingress-error"), a.text[:200]) for a in answers
        ]
        assert all(a.text.startswith("hello from ") for a in answers)
        view = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]
        assert view["status"] == "running"
        assert view["last_resumed_at"] >= view["paused_at"]
        deliveries = http.get(f"/v1/webhook-endpoints/{hook.json()['data']['id']}").json()["data"][
            "deliveries"
        ]
        resumes = [
            d for d in deliveries if d["eventAction"] == "sandbox.resume" and sandbox_id in json.dumps(d)
        ]
        assert len(resumes) == 1, deliveries
        http.delete(f"/v1/webhook-endpoints/{hook.json()['data']['id']}")
        http.delete(f"/v1/sandboxes/{sandbox_id}")


def test_a_streaming_response_arrives_incrementally(ingress: Ingress, app_sandbox: dict[str, object]) -> None:
    arrivals: list[tuple[float, str]] = []
    with ingress.client(str(app_sandbox["id"])) as client:
        started = time.monotonic()
        with client.stream("GET", "/stream?n=5&ms=400") as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                arrivals.append((time.monotonic() - started, line))
    assert [line for _, line in arrivals] == [f"chunk {i}" for i in range(1, 6)]
    # five chunks 400 ms apart: the first is seen long before the last was even written
    assert arrivals[-1][0] - arrivals[0][0] >= 1.2, arrivals
    assert arrivals[0][0] < arrivals[-1][0] - 1.0, arrivals


def test_request_bodies_stream_through(ingress: Ingress, app_sandbox: dict[str, object]) -> None:
    """A chunked upload is relayed piece by piece (each piece answered before the next is sent), and
    a 16 MiB body arrives byte-exact."""
    host = f"{ingress_host(str(app_sandbox['id']))}:{ingress.port}"
    with socket.create_connection(("127.0.0.1", ingress.port), timeout=20) as sock:
        sock.sendall(
            f"POST /pingpong HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        received = b""
        for piece in (b"one", b"two", b"three"):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            while b"pong:" + piece not in received:
                data = sock.recv(65536)
                assert data, received
                received += data
        sock.sendall(b"0\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200 OK")

    body = os.urandom(16 << 20)
    with ingress.client(str(app_sandbox["id"]), timeout=120) as client:
        echoed = client.post("/echo", content=body)
    assert echoed.status_code == 200
    assert echoed.text == f"bytes={len(body)} sum={sum(body) % 2**32}\n"
    assert hashlib.sha256(body).digest()  # the body was random, not a compressible pattern


def test_a_websocket_passes_through_and_is_cut_when_ingress_is_turned_off(
    ingress: Ingress, pause_s: float = 0.0
) -> None:
    """``pause_s`` is slept before each message, so that the app's server is waiting for it in a read."""
    with ingress.http() as http:
        sandbox = create_sandbox(http, ingress_enabled=True)
        sandbox_id = str(sandbox["id"])
        start_app(http, sandbox_id)
        uri = f"ws://{ingress_host(sandbox_id)}:{ingress.port}/ws"
        sock = socket.create_connection(("127.0.0.1", ingress.port), timeout=20)
        with ws_connect(uri, sock=sock, open_timeout=20) as ws:
            for text in ("hello", "x" * 70_000):
                time.sleep(pause_s)
                ws.send(text)
                assert ws.recv(timeout=10) == f"echo:{text}"
            time.sleep(pause_s)
            ws.send(b"\x00\x01binary")
            assert ws.recv(timeout=10) == b"\x00\x01binary"
            http.patch(f"/v1/sandboxes/{sandbox_id}", json={"ingress_enabled": False})
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
        http.delete(f"/v1/sandboxes/{sandbox_id}")


def test_an_upload_under_way_gets_the_page_when_ingress_is_turned_off(ingress: Ingress) -> None:
    """A request the app has not answered yet when the URL closes is answered with the proxy's page,
    not dropped: here an upload, half sent."""
    with ingress.http() as http:
        sandbox = create_sandbox(http, ingress_enabled=True)
        sandbox_id = str(sandbox["id"])
        start_app(http, sandbox_id)
        host = f"{ingress_host(sandbox_id)}:{ingress.port}"
        with socket.create_connection(("127.0.0.1", ingress.port), timeout=20) as sock:
            sock.sendall(f"POST /sink HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000\r\n\r\n".encode())
            sock.sendall(b"x" * 10)
            closed = http.patch(f"/v1/sandboxes/{sandbox_id}", json={"ingress_enabled": False})
            assert closed.status_code == 200, closed.text
            head, body = _answer(sock)
        assert head.startswith("HTTP/1.1 404 "), head
        assert "\r\nX-Paddock-Ingress-Error: INGRESS_DISABLED\r\n" in head + "\r\n", head
        assert json.loads(body)["data"]["code"] == "INGRESS_DISABLED"
        http.delete(f"/v1/sandboxes/{sandbox_id}")


def test_malformed_requests_get_400_not_a_crash(ingress: Ingress, app_sandbox: dict[str, object]) -> None:
    host = f"{ingress_host(str(app_sandbox['id']))}:{ingress.port}"
    for raw in (
        b"NOT HTTP AT ALL\r\n\r\n",
        f"POST /echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n".encode(),
        b"GET / HTTP/1.1\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", ingress.port), timeout=20) as sock:
            sock.sendall(raw)
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400 Bad Request"), answer
    with ingress.client(str(app_sandbox["id"])) as client:
        assert client.get("/hello").status_code == 200  # the proxy is still serving


TLS_APP_PORT = 8443
#: openssl's own HTTPS server with a certificate made in the sandbox (self-signed); ``-www`` answers a GET
#: with a status page that names the TLS session it came over.
SERVE_HTTPS = (
    "cd /tmp && openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=app -days 1 -keyout k.pem -out c.pem"
    f" 2>/dev/null && setsid openssl s_server -quiet -accept {TLS_APP_PORT} -www -cert c.pem -key k.pem"
    " >/dev/null 2>&1 </dev/null &"
)


def _tls_page(ingress: Ingress, sandbox_id: str) -> httpx.Response:
    """GET / of the sandbox's TLS_APP_PORT through the plain listener, once the app is up (or 20 s on)."""
    with ingress.client(sandbox_id, TLS_APP_PORT) as client:
        deadline = time.monotonic() + 20
        while True:
            answer = client.get("/")
            listening = answer.headers.get("x-paddock-ingress-error") != "NOTHING_LISTENING"
            if listening or time.monotonic() > deadline:
                assert listening, "the sandbox's HTTPS app never listened"
                return answer
            time.sleep(0.3)


def test_the_host_an_app_gets_and_its_https_ports_are_set_shown_patched_and_forked(ingress: Ingress) -> None:
    """``ingress_host_header``: the app gets that ``Host`` (``${PORT}`` its port), the client's staying in
    ``X-Forwarded-Host``; ``ingress_https_ports``: an app serving HTTPS itself (self-signed) is reached
    over TLS. The view shows both, a PATCH changes them for the very next request, a fork keeps them, and
    bad values are a 400 naming the field with nothing changed."""
    mask = "${PORT}-myapp.example.test"
    with ingress.http() as http:
        sandbox = create_sandbox(
            http, ingress_enabled=True, ingress_host_header=mask, ingress_https_ports=[TLS_APP_PORT, 9443]
        )
        sandbox_id = str(sandbox["id"])
        try:
            assert sandbox["ingress_host_header"] == mask
            assert sandbox["ingress_https_ports"] == [TLS_APP_PORT, 9443]
            start_app(http, sandbox_id)
            started = http.post(
                f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", SERVE_HTTPS]}
            )
            assert started.status_code == 200, started.text
            with ingress.client(sandbox_id) as client:
                seen = client.get("/hello")
                assert seen.status_code == 200, seen.text
                assert seen.headers["x-seen-host"] == f"{APP_PORT}-myapp.example.test"
            page = _tls_page(ingress, sandbox_id)
            assert page.status_code == 200 and "Cipher" in page.text, page.text[:300]

            view = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]
            assert (view["ingress_host_header"], view["ingress_https_ports"]) == (mask, [TLS_APP_PORT, 9443])
            forked = http.post(f"/v1/sandboxes/{sandbox_id}/fork", json={})
            assert forked.status_code == 200, forked.text
            child = http.get(f"/v1/sandboxes/{forked.json()['data']['id']}").json()["data"]
            http.delete(f"/v1/sandboxes/{child['id']}")
            assert (child.get("ingress_host_header"), child.get("ingress_https_ports")) == (
                mask,
                [TLS_APP_PORT, 9443],
            )

            for body, field in (
                (
                    {"ingress_host_header": "other.example.test", "ingress_https_ports": [443, 0]},
                    "ingress_https_ports[1]",
                ),
                ({"ingress_host_header": "x.example.test\r\nX-Evil: 1"}, "ingress_host_header"),
                ({"ingress_host_header": "a" * 256}, "ingress_host_header"),
                ({"ingress_https_ports": ["443"]}, "ingress_https_ports[0]"),
                ({"ingress_https_ports": list(range(1, 40))}, "ingress_https_ports"),
            ):
                refused = http.patch(f"/v1/sandboxes/{sandbox_id}", json=body)
                assert refused.status_code == 400, (body, refused.text)
                assert field in refused.json()["data"], refused.text
            refused = http.post(
                "/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "ingress_host_header": "my app.example.test"}
            )
            assert refused.status_code == 400 and "ingress_host_header" in refused.json()["data"], (
                refused.text
            )
            unchanged = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]
            assert (unchanged["ingress_host_header"], unchanged["ingress_https_ports"]) == (
                mask,
                [TLS_APP_PORT, 9443],
            )

            # Cleared: the next request already carries the client's host, and TLS is off that port.
            patched = http.patch(
                f"/v1/sandboxes/{sandbox_id}", json={"ingress_host_header": "", "ingress_https_ports": []}
            )
            assert patched.status_code == 200, patched.text
            assert "ingress_host_header" not in patched.json()["data"]
            with ingress.client(sandbox_id) as client:
                assert (
                    client.get("/hello").headers["x-seen-host"]
                    == f"{ingress_host(sandbox_id)}:{ingress.port}"
                )
            plain = _tls_page(ingress, sandbox_id)
            assert plain.status_code == 502 and "Cipher" not in plain.text, (plain.headers, plain.text[:300])
            # Set again by a PATCH: a fixed host, at once.
            patched = http.patch(
                f"/v1/sandboxes/{sandbox_id}", json={"ingress_host_header": "fixed.example.test:3000"}
            )
            assert (
                patched.status_code == 200
                and patched.json()["data"]["ingress_host_header"] == "fixed.example.test:3000"
            )
            with ingress.client(sandbox_id) as client:
                assert client.get("/hello").headers["x-seen-host"] == "fixed.example.test:3000"
            # The SDK's keywords, both read back in its SandboxInfo.
            with paddock.Client(ingress.platform.url, ingress.key) as sdk:
                handle = sdk.sandboxes.get(sandbox_id)
                info = handle.patch(
                    ingress_host_header="${PORT}.sdk.example.test", ingress_https_ports=[TLS_APP_PORT]
                )
                assert (info.ingress_host_header, info.ingress_https_ports) == (
                    "${PORT}.sdk.example.test",
                    [TLS_APP_PORT],
                )
            with ingress.client(sandbox_id) as client:
                assert client.get("/hello").headers["x-seen-host"] == f"{APP_PORT}.sdk.example.test"
            page = _tls_page(ingress, sandbox_id)
            assert page.status_code == 200 and "Cipher" in page.text, page.text[:300]
        finally:
            http.delete(f"/v1/sandboxes/{sandbox_id}")
