"""The SDK's direct HTTP/1.1 path (``paddock._wire``) against a real socket server on 127.0.0.1.

The server below answers as a test tells it to (kept-alive or closing, chunked, gzip, late, cut short)
and records every request with the connection it came on. The live SDK suites (tests/sdk/test_live_*)
drive the same path against a real control plane."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

import paddock
from paddock import RetryPolicy, _wire


@dataclass
class Seen:
    connection: int
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


def envelope(data: object) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def answer(status: int, body: bytes, *headers: str, reason: str = "OK") -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", "Content-Type: application/json"]
    return ("\r\n".join([*head, *headers]) + "\r\n\r\n").encode() + body


#: What the server sends for a request: bytes to write, then whether to close the connection.
Reply = Callable[[Seen], tuple[bytes, bool]]


def echo(seen: Seen) -> tuple[bytes, bool]:
    return answer(200, envelope({"target": seen.target, "n": seen.connection})), False


@dataclass
class Server:
    reply: Reply = echo
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                seen = Seen(number, method, target, headers, body)
                with self.lock:
                    self.seen.append(seen)
                out, close = self.reply(seen)
                if out:
                    conn.sendall(out)
                if close:
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def client(url: str, **options: object) -> paddock.Client:
    return paddock.Client(url, "key-1", retry=RetryPolicy(max_retries=0), **options)  # type: ignore[arg-type]


def test_calls_share_one_kept_connection_and_send_what_httpx_sends(server: Server) -> None:
    body = {"cmd": "prinf", "args": ["é", "a b"], "env": {"K": "v"}}
    with client(server.url) as direct, client(server.url, transport=httpx.HTTPTransport()) as plain:
        for c in (direct, plain):
            assert (
                c.request("POST", "v1/sandboxes/sb%2F1/exec", json=body)["target"]
                == "/v1/sandboxes/sb%2F1/exec"
            )
            c.request("GET", "v1/sandboxes", params={"q": "a b&c", "limit": 5})
            c.request("POST", "v1/sandboxes/sb-1/pause")
    direct_seen, httpx_seen = server.seen[:3], server.seen[3:]
    assert {s.connection for s in direct_seen} == {1}  # one connection, kept alive
    for mine, theirs in zip(direct_seen, httpx_seen, strict=True):
        assert (mine.method, mine.target, mine.body) == (theirs.method, theirs.target, theirs.body)
        for name in ("x-api-key", "accept", "user-agent", "content-type", "content-length", "host"):
            assert mine.headers.get(name) == theirs.headers.get(name), name
    assert json.loads(direct_seen[0].body) == body


def test_a_connection_the_server_closed_while_idle_is_replaced(server: Server) -> None:
    server.reply = lambda seen: (answer(200, envelope(seen.connection)), True)  # answer, then hang up
    with client(server.url) as c:
        assert c.request("POST", "v1/sandboxes/sb-1/pause") == 1
        time.sleep(0.05)
        assert c.request("POST", "v1/sandboxes/sb-1/resume") == 2  # not an error: a new connection
    assert [s.target for s in server.seen] == ["/v1/sandboxes/sb-1/pause", "/v1/sandboxes/sb-1/resume"]


def test_chunked_and_gzip_answers_read_whole(server: Server) -> None:
    data = {"items": ["x" * 1000] * 50}
    raw = envelope(data)

    def reply(seen: Seen) -> tuple[bytes, bool]:
        if seen.target.endswith("chunked"):
            chunks = [raw[i : i + 777] for i in range(0, len(raw), 777)]
            body = (
                b"".join(f"{len(c):x};ext=1\r\n".encode() + c + b"\r\n" for c in chunks)
                + b"0\r\nX-T: 1\r\n\r\n"
            )
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body, False
        return answer(200, gzip.compress(raw), "Content-Encoding: gzip"), False

    server.reply = reply
    with client(server.url) as c:
        assert c.request("GET", "v1/chunked") == data
        assert c.request("GET", "v1/gzip") == data
        assert c.request("GET", "v1/chunked") == data  # the connection survived both
    assert {s.connection for s in server.seen} == {1}
    assert server.seen[0].headers["accept-encoding"] == "gzip"


def test_errors_are_typed_with_the_request_id(server: Server) -> None:
    fail = json.dumps(
        {"status": "fail", "data": {"code": "invalid_field", "message": "bad", "cmd": "is required"}}
    )
    server.reply = lambda seen: (
        answer(400, fail.encode(), "X-Request-Id: req-9", reason="Bad Request"),
        False,
    )
    with client(server.url) as c, pytest.raises(paddock.ValidationError) as caught:
        c.request("POST", "v1/sandboxes/sb-1/exec", json={})
    assert (caught.value.status, caught.value.code, caught.value.request_id) == (
        400,
        "invalid_field",
        "req-9",
    )
    assert caught.value.fields == {"cmd": "is required"}


def test_a_429_is_retried_after_retry_after(server: Server) -> None:
    def reply(seen: Seen) -> tuple[bytes, bool]:
        if len(server.seen) == 1:
            return answer(429, b'{"status":"error","message":"slow down"}', "Retry-After: 0"), False
        return answer(200, envelope("ok")), False

    server.reply = reply
    with paddock.Client(server.url, "k", retry=RetryPolicy(max_retries=1)) as c:
        assert c.request("POST", "v1/sandboxes") == "ok"
    assert len(server.seen) == 2


def test_a_late_answer_times_out_and_a_cut_one_fails_then_the_client_recovers(server: Server) -> None:
    def reply(seen: Seen) -> tuple[bytes, bool]:
        if seen.target.endswith("late"):
            time.sleep(0.5)
            return answer(200, envelope("late")), False
        if seen.target.endswith("cut"):
            return answer(200, envelope("x" * 100))[:-20], True
        return echo(seen)

    server.reply = reply
    with client(server.url, timeout=0.2) as c:
        with pytest.raises(paddock.TransportError):
            c.request("GET", "v1/late")
        with pytest.raises(paddock.TransportError, match="disconnected"):
            c.request("GET", "v1/cut")
        assert c.request("GET", "v1/fine")["target"] == "/v1/fine"
    retrying = RetryPolicy(max_retries=2, base_s=0.01)
    with (
        paddock.Client(server.url, "k", timeout=0.2, retry=retrying) as c,
        pytest.raises(paddock.TransportError),
    ):
        c.request("GET", "v1/late")
    assert sum(s.target == "/v1/late" for s in server.seen) == 1 + 3  # a GET is retried after no answer


def late(seen: Seen) -> tuple[bytes, bool]:
    time.sleep(0.3)
    return answer(200, envelope("late")), False


def test_a_timeout_of_the_call_overrides_the_clients(server: Server) -> None:
    server.reply = late
    with client(server.url, timeout=0.1) as c:
        assert c.request("GET", "v1/late", timeout=2) == "late"


def test_an_unreachable_server_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the connection is refused
        with client(f"http://127.0.0.1:{port}") as c, pytest.raises(paddock.TransportError):
            c.request("GET", "v1/whoami")


def test_a_proxy_from_the_environment_is_used(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = Server()
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with client("http://127.0.0.2:9") as c:  # loopback, never listening: only the proxy answers
            c.request("GET", "v1/whoami")
        assert [s.target for s in proxy.seen] == ["http://127.0.0.2:9/v1/whoami"]
        assert server.seen == []
    finally:
        proxy.close()


def test_threads_share_a_client(server: Server) -> None:
    with client(server.url) as c, ThreadPoolExecutor(8) as pool:
        targets = list(pool.map(lambda i: c.request("GET", f"v1/n/{i}")["target"], range(400)))
    assert targets == [f"/v1/n/{i}" for i in range(400)]
    assert server.connections <= 8 + 1


def test_a_base_url_path_prefixes_every_call(server: Server) -> None:
    with client(server.url + "/api/") as c:
        assert c.request("GET", "v1/whoami")["target"] == "/api/v1/whoami"


async def test_the_async_client_keeps_its_connection_and_replaces_a_closed_one(server: Server) -> None:
    closing = {"on": False}

    def reply(seen: Seen) -> tuple[bytes, bool]:
        if seen.target.endswith("chunked"):
            raw = envelope({"chunked": True})
            return (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + f"{len(raw):x}\r\n".encode()
                + raw
                + b"\r\n0\r\n\r\n",
                False,
            )
        out = answer(200, envelope({"target": seen.target, "n": seen.connection}))
        return out, closing["on"]

    server.reply = reply
    async with paddock.AsyncClient(server.url, "k", retry=RetryPolicy(max_retries=0)) as c:
        first = await c.request("POST", "v1/a", json={"x": 1})
        second = await c.request("GET", "v1/b", params={"wait_for": "running"})
        assert (first["n"], second["n"]) == (1, 1)
        assert second["target"] == "/v1/b?wait_for=running"
        assert await c.request("GET", "v1/chunked") == {"chunked": True}
        closing["on"] = True
        assert (await c.request("GET", "v1/c"))["n"] == 1  # answered, then the server hangs up
        await asyncio.sleep(0.05)
        assert (await c.request("GET", "v1/d"))["n"] == 2
        server.reply = late
        with pytest.raises(paddock.TransportError):
            await c.request("GET", "v1/late", timeout=0.1)
        assert await c.request("GET", "v1/late", timeout=2) == "late"


@pytest.mark.parametrize("piece", [1, 3, 4096])
def test_an_answer_split_anywhere_reads_the_same(piece: int) -> None:
    """The socket may hand an answer over in any pieces: one byte at a time reads as one read does."""
    raw = envelope({"k": "v" * 300})
    chunked = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Request-Id: r1\r\n\r\n"
        + b"".join(
            f"{len(raw[i : i + 100]):x}\r\n".encode() + raw[i : i + 100] + b"\r\n"
            for i in range(0, len(raw), 100)
        )
        + b"0\r\nX-Trailer: t\r\n\r\n"
    )
    for wire_bytes in (chunked, answer(201, raw, "X-Request-Id: r1")):
        reader = _wire.AnswerReader("POST")
        done = [reader.feed(wire_bytes[i : i + piece]) for i in range(0, len(wire_bytes), piece)]
        assert done[-1] and not any(done[:-1])
        head, body = reader.answer()
        assert body == raw and dict(head.headers)["X-Request-Id"] == "r1" and reader.clean()
    extra = _wire.AnswerReader("GET")
    assert extra.feed(answer(200, raw) + b"HTTP/1.1 200 OK\r\n")
    assert not extra.clean()  # bytes nobody asked for: the connection is not reused
