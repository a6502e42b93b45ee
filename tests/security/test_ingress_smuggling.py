"""Request smuggling through the ingress proxy into a real app in a real sandbox (issue #12 item 7).

The app is ``recording_app.pl``: a deliberately naive backend (trusts Content-Length over
Transfer-Encoding, reads chunk sizes with ``hex()``, keeps every Host) that logs every byte it receives
and every request it parses. Each probe sends raw bytes to the proxy on 127.0.0.1 and checks what a
client sees (status, ``Connection: close``, the connection really closed) and what the app got (its
logs, read through the files API). Every probe carries a fresh marker, so the logs of one module-wide
app tell the probes apart.
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform
from tests.network.ingress_support import APP_PORT, create_sandbox, ingress_host, start_ingress_platform

__all__ = ["debian_image", "guest_binary_dir"]  # session fixtures, shared with tests/hostagent

pytestmark = [pytest.mark.root, pytest.mark.slow]

APP = Path(__file__).with_name("recording_app.pl")
#: After the proxy refused a request, how long anything it might have let through gets to reach the
#: app's logs before they are read (the sentinel request on a new connection comes first).
SETTLE_S = 0.3


@dataclass
class Edge:
    platform: LivePlatform
    proxy_port: int
    sandbox_id: str
    http: httpx.Client

    @property
    def host(self) -> str:
        return f"{ingress_host(self.sandbox_id)}:{self.proxy_port}"

    def app_log(self, name: str) -> bytes:
        answer = self.http.get(f"/v1/sandboxes/{self.sandbox_id}/files", params={"path": f"/tmp/{name}"})
        assert answer.status_code == 200, answer.text
        return answer.content


@pytest.fixture(scope="module")
def edge(debian_image: Path, guest_binary_dir: Path) -> Iterator[Edge]:
    platform, proxy_port = start_ingress_platform(guest_binary_dir)
    try:
        with platform.http(platform.api_key()) as http:
            sandbox_id = str(create_sandbox(http, ingress_enabled=True)["id"])
            put = http.put(
                f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/srv/rec.pl"}, content=APP.read_bytes()
            )
            assert put.status_code == 200, put.text
            started = http.post(
                f"/v1/sandboxes/{sandbox_id}/exec",
                json={
                    "cmd": "bash",
                    "args": ["-c", f"setsid perl /srv/rec.pl {APP_PORT} >/tmp/app.out 2>&1 </dev/null &"],
                },
            )
            assert started.status_code == 200, started.text
            edge = Edge(platform, proxy_port, sandbox_id, http)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if exchange(edge, get(edge, "/ready", "Connection: close\r\n")).startswith(b"HTTP/1.1 200"):
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("the recording app did not answer through the proxy")
            yield edge
    finally:
        platform.stop()


def get(edge: Edge, path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {edge.host}\r\n{extra}\r\n".encode()


def exchange(edge: Edge, *pieces: bytes, pause_s: float = 0.0) -> bytes:
    """Sends the pieces (``pause_s`` apart) on one connection and reads until the proxy closes it (each
    probe ends in a refusal or a ``Connection: close`` request, so a hang here is a failure)."""
    with socket.create_connection(("127.0.0.1", edge.proxy_port), timeout=20) as sock:
        for index, piece in enumerate(pieces):
            if index and pause_s:
                time.sleep(pause_s)
            sock.sendall(piece)
        received = b""
        while data := sock.recv(65536):
            received += data
    return received


def assert_refused(answer: bytes, status: int = 400) -> None:
    """The proxy's own error page, announcing and doing the close (the read above ended at EOF)."""
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    assert head.startswith(f"HTTP/1.1 {status} "), answer[:300]
    assert "\r\nConnection: close" in head, head
    assert "\r\nX-Paddock-Ingress-Error: " in head, head
    assert answer.count(b"HTTP/1.1 ") == 1, answer  # nothing of the app's after it


def assert_app_never_saw(edge: Edge, marker: str) -> None:
    """Not one byte of the probe reached the app: a sentinel sent after it is logged, the probe is not."""
    sentinel = f"/sentinel-{secrets.token_hex(6)}"
    assert exchange(edge, get(edge, sentinel, "Connection: close\r\n")).startswith(b"HTTP/1.1 200")
    time.sleep(SETTLE_S)
    raw = edge.app_log("raw.log")
    assert sentinel.encode() in raw
    assert marker.encode() not in raw


def requests_with(edge: Edge, marker: str) -> list[str]:
    lines = edge.app_log("requests.log").decode("latin-1").splitlines()
    return [line for line in lines if marker in line]


def new_marker() -> str:
    return f"m{secrets.token_hex(8)}"


# -- malformed framing and heads: refused with 400 + close, and the app gets nothing ----------------

REFUSED = {
    "two Host headers": "GET /{m} HTTP/1.1\r\nHost: {h}\r\nHost: {h}\r\n\r\n",
    "two different Host headers": "GET /{m} HTTP/1.1\r\nHost: {h}\r\nHost: evil.example\r\n\r\n",
    "invalid chunk size": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "zz\r\nGET /{m}-smuggled HTTP/1.1\r\nHost: {h}\r\n\r\n0\r\n\r\n"
    ),
    "chunk size with 0x": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
    "chunk size overflow": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "10000000000000003\r\nabc\r\n0\r\n\r\n"
    ),
    "chunk data longer than its size": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcGET / HTTP/1.1\r\n\r\n"
    ),
    "CL.TE": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG"
    ),
    "TE.CL": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
        "2a\r\nGET /{m}-smuggled HTTP/1.1\r\nHost: {h}\r\n\r\n\r\n0\r\n\r\n"
    ),
    "duplicate Content-Length": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    "conflicting Content-Length": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\nabc"
    ),
    "Content-Length list": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nContent-Length: 3, 3\r\n\r\nabc",
    "Content-Length signed": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nContent-Length: +3\r\n\r\nabc",
    "obs-fold": "GET /{m} HTTP/1.1\r\nHost: {h}\r\nX-Folded: a\r\n b\r\n\r\n",
    "obs-fold of Transfer-Encoding": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"
    ),
    "unknown Transfer-Encoding": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "Transfer-Encoding identity": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: identity\r\n\r\nabc",
    "chunked not last": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    "two Transfer-Encoding headers": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n"
    ),
    "space before the colon": "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "vertical tab in Transfer-Encoding": (
        "POST /{m} HTTP/1.1\r\nHost: {h}\r\nTransfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n"
    ),
    "Transfer-Encoding on HTTP/1.0": (
        "POST /{m} HTTP/1.0\r\nHost: {h}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "bare CR in a header": "GET /{m} HTTP/1.1\r\nHost: {h}\r\nX-A: a\rGET /{m}-smuggled HTTP/1.1\r\n\r\n",
    "bare CR in the request line": "GET /{m}\rX HTTP/1.1\r\nHost: {h}\r\n\r\n",
    "bare LF line ends": "GET /{m} HTTP/1.1\nHost: {h}\n\n",
    "NUL in a header": "GET /{m} HTTP/1.1\r\nHost: {h}\r\nX-A: a\x00b\r\n\r\n",
    "NUL in the target": "GET /{m}\x00x HTTP/1.1\r\nHost: {h}\r\n\r\n",
    "space in the target": "GET /{m} x HTTP/1.1\r\nHost: {h}\r\n\r\n",
    "space in a header name": "GET /{m} HTTP/1.1\r\nHost: {h}\r\nX A: b\r\n\r\n",
    "HTTP/2.0 on the request line": "GET /{m} HTTP/2.0\r\nHost: {h}\r\n\r\n",
    "upgrade with a body": (
        "GET /{m} HTTP/1.1\r\nHost: {h}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        "Content-Length: 37\r\n\r\nGET /{m}-smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    ),
}


@pytest.mark.parametrize("raw", REFUSED.values(), ids=REFUSED.keys())
def test_malformed_requests_are_refused_and_the_app_gets_nothing(edge: Edge, raw: str) -> None:
    marker = new_marker()
    answer = exchange(edge, raw.format(m=marker, h=edge.host).encode("latin-1"))
    assert_refused(answer)
    assert_app_never_saw(edge, marker)


def test_an_oversized_head_gets_431(edge: Edge) -> None:
    marker = new_marker()
    padding = "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(70))
    answer = exchange(edge, get(edge, f"/{marker}", padding))
    assert_refused(answer, 431)
    one_huge_line = exchange(edge, get(edge, f"/{marker}", f"X-Huge: {'b' * 100_000}\r\n"))
    assert_refused(one_huge_line, 431)
    assert_app_never_saw(edge, marker)


def test_an_invalid_chunk_after_the_head_was_sent_on_ends_in_400_and_no_request(edge: Edge) -> None:
    """The head reaches the app before the bad chunk does; the app gets a cut-off request, never a whole one,
    and nothing after the bad chunk."""
    marker = new_marker()
    head = f"POST /{marker} HTTP/1.1\r\nHost: {edge.host}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    bad = f"zz\r\nGET /{marker}-smuggled HTTP/1.1\r\nHost: {edge.host}\r\n\r\n0\r\n\r\n"
    answer = exchange(edge, head.encode(), bad.encode(), pause_s=0.5)
    assert_refused(answer)
    time.sleep(SETTLE_S)
    assert requests_with(edge, marker) == []
    raw = edge.app_log("raw.log")
    assert f"/{marker} HTTP/1.1".encode() in raw  # the head did go on ...
    assert f"{marker}-smuggled".encode() not in raw  # ... but nothing from the bad chunk onwards


# -- what the proxy accepts reaches the app as exactly what the proxy saw ---------------------------


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_request_hidden_in_a_body_stays_in_the_body(edge: Edge, framing: str) -> None:
    """A TE.CL / CL.TE desync needs the app to end the body somewhere else than the proxy did: with
    the body re-framed from what the parser decoded, the app sees one request whose body holds the
    hidden one."""
    marker = new_marker()
    hidden = f"GET /{marker}-smuggled HTTP/1.1\r\nHost: {edge.host}\r\n\r\n"
    if framing == "chunked":
        body = f"{len(hidden):x};ext=1\r\n{hidden}\r\n0\r\n\r\n"
        head = f"POST /{marker} HTTP/1.1\r\nHost: {edge.host}\r\nTransfer-Encoding: chunked\r\n\r\n"
    else:
        body = hidden
        head = f"POST /{marker} HTTP/1.1\r\nHost: {edge.host}\r\nContent-Length: {len(hidden)}\r\n\r\n"
    last = get(edge, f"/{marker}-last", "Connection: close\r\n")
    answer = exchange(edge, (head + body).encode() + last)
    seen = [line for line in answer.split(b"\n") if line.startswith(b"seen ")]
    assert seen == [
        f"seen POST /{marker} HTTP/1.1 body={len(hidden)}".encode(),
        f"seen GET /{marker}-last HTTP/1.1 body=0".encode(),
    ], answer
    time.sleep(SETTLE_S)
    logged = requests_with(edge, marker)
    assert len(logged) == 2, logged
    assert f"\tPOST /{marker} HTTP/1.1\t" in logged[0]
    assert "smuggled" in logged[0].split("\tbody=")[1]  # the hidden request is body text, not a request
    assert "smuggled" not in logged[1]


def test_pipelined_requests_are_served_in_order_on_one_app_connection(edge: Edge) -> None:
    marker = new_marker()
    pipeline = (
        get(edge, f"/{marker}-1")
        + f"POST /{marker}-2 HTTP/1.1\r\nHost: {edge.host}\r\nContent-Length: 5\r\n\r\nhello".encode()
        + f"POST /{marker}-3 HTTP/1.1\r\nHost: {edge.host}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + b"2\r\nhi\r\n3\r\nyou\r\n0\r\n\r\n"
        + get(edge, f"/{marker}-4", "Connection: close\r\n")
    )
    answer = exchange(edge, pipeline)
    seen = [line.split(b" body=")[0].decode() for line in answer.split(b"\n") if line.startswith(b"seen ")]
    assert seen == [
        f"seen GET /{marker}-1 HTTP/1.1",
        f"seen POST /{marker}-2 HTTP/1.1",
        f"seen POST /{marker}-3 HTTP/1.1",
        f"seen GET /{marker}-4 HTTP/1.1",
    ]
    assert answer.count(b"HTTP/1.1 200 OK") == 4
    time.sleep(SETTLE_S)
    logged = requests_with(edge, marker)
    assert [line.split("\t")[1].split(" ")[1] for line in logged] == [f"/{marker}-{i}" for i in (1, 2, 3, 4)]
    assert len({line.split("\t")[0] for line in logged}) == 1  # one upstream connection, in order
    assert logged[1].endswith("\tbody=hello") and logged[2].endswith("\tbody=hiyou")


def test_a_bad_request_in_a_pipeline_ends_it_after_the_good_ones(edge: Edge) -> None:
    marker = new_marker()
    pipeline = (
        get(edge, f"/{marker}-ok")
        + (f"GET /{marker}-bad HTTP/1.1\r\nHost: {edge.host}\r\nHost: {edge.host}\r\n\r\n").encode()
    )
    answer = exchange(edge, pipeline + get(edge, f"/{marker}-after"))
    first, _, rest = answer.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert_refused(rest.split(b"\n", 1)[1])
    time.sleep(SETTLE_S)
    logged = requests_with(edge, marker)
    assert len(logged) == 1 and f"/{marker}-ok " in logged[0]
    raw = edge.app_log("raw.log")
    assert f"{marker}-bad".encode() not in raw and f"{marker}-after".encode() not in raw


def test_the_app_sees_one_host_the_routed_one(edge: Edge) -> None:
    marker = new_marker()
    answer = exchange(edge, get(edge, f"/{marker}", "Connection: close\r\n"))
    assert answer.startswith(b"HTTP/1.1 200 OK")
    [seen] = requests_with(edge, marker)
    assert f"\thost={edge.host}\t" in seen
