"""``paddock_core.serving``: a service's heap, as it stands once the app has started, is frozen out of
the garbage collector's full collections (which otherwise walk ~200,000 objects, 50–125 ms of stalled
event loop, on every full collection), and its open file limit is raised to the hard one."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from paddock_core import serving
from tests.conftest import service_in_thread
from tests.ports import free_port


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # what this test froze goes back to the collector


def test_the_heap_at_startup_is_frozen_and_the_app_answers(unfrozen: None) -> None:
    assert gc.get_freeze_count() == 0
    frozen_when_answering: list[int] = []

    async def probe(request: Request) -> JSONResponse:
        frozen_when_answering.append(gc.get_freeze_count())
        return JSONResponse({"ok": True})

    port = free_port()
    server = serving.FrozenHeapServer(
        serving.config(Starlette(routes=[Route("/", probe)]), "127.0.0.1", port)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started, "uvicorn did not start within 10 s"
        assert httpx.get(f"http://127.0.0.1:{port}/").json() == {"ok": True}
    finally:
        server.should_exit = True
        thread.join(10)
    assert not thread.is_alive()
    # Every object alive at startup (this test process's modules included) is out of the collector's reach.
    assert frozen_when_answering and frozen_when_answering[0] > 10_000


def test_a_service_starts_with_its_open_file_limit_raised_to_the_hard_one() -> None:
    """Under systemd's default soft limit (1,024) a host agent would run out of descriptors at a few
    hundred sandboxes; the service raises it to what the operator allows (the hard limit)."""
    script = (
        "import resource\n"
        "from paddock_core import serving\n"
        "from paddock_hostagent.guest.client import KEPT_CONNECTIONS\n"
        "before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "kept_before = KEPT_CONNECTIONS.max_idle\n"
        "serving.raise_open_file_limit()\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "print(before, kept_before, soft, hard, KEPT_CONNECTIONS.max_idle)\n"
    )

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    out = subprocess.run(
        [sys.executable, "-c", script], preexec_fn=low_soft_limit, capture_output=True, text=True, check=True
    ).stdout.split()
    before, kept_before, soft, hard, kept_after = map(int, out)
    assert (before, kept_before) == (256, 64)
    assert soft == hard > 256
    assert kept_after == hard // 4  # the host agent's cap on kept guest connections follows the new limit


def test_a_service_told_to_stop_does_not_wait_for_ever_on_an_open_stream(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client following a stream that never ends (an exec's output, a download) must not keep the
    service from stopping, nor from running its shutdown (where a host agent takes its warm pool down)."""
    monkeypatch.setattr(serving, "GRACEFUL_SHUTDOWN_S", 1)
    shut_down = threading.Event()

    async def endless(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            while True:
                yield b"x"
                await asyncio.sleep(0.05)

        return StreamingResponse(chunks())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        shut_down.set()

    app = Starlette(routes=[Route("/follow", endless)], lifespan=lifespan)
    with service_in_thread(app) as service:
        received = threading.Event()

        def follow() -> None:
            with (
                contextlib.suppress(httpx.HTTPError),
                httpx.stream("GET", f"{service.url}/follow") as response,
            ):
                for _ in response.iter_bytes():
                    received.set()

        threading.Thread(target=follow, daemon=True).start()
        assert received.wait(5), "the stream never started"
        told = time.monotonic()
        service.server.should_exit = True  # what SIGTERM does
        service.thread.join(10)
        assert not service.thread.is_alive(), (
            "the service was still waiting for the stream 10 s after it was told to stop"
        )
        assert time.monotonic() - told < 5
    assert shut_down.is_set(), "the app's shutdown never ran"


class _CountedSends:
    """The socket's transport, counting the writes that reach it (each one ``send``)."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)


def test_a_response_leaves_in_one_send_and_a_large_or_streamed_one_whole(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn writes a response's head and body apart; the service's transport sends them as one (one
    wake-up of the client, not two), holds nothing past ``COALESCE_BYTES`` and nothing across a turn of
    the loop, so large and streamed bodies arrive whole and in time."""
    writes: list[bytes] = []
    made = serving.BoundedHttpProtocol.connection_made

    def counted(self: serving.BoundedHttpProtocol, transport: asyncio.Transport) -> None:
        made(self, _CountedSends(transport, writes))  # type: ignore[arg-type]

    monkeypatch.setattr(serving.BoundedHttpProtocol, "connection_made", counted)
    big = b"b" * (3 * serving.COALESCE_BYTES)

    async def small(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def large(request: Request) -> Response:
        return Response(big, media_type="application/octet-stream")

    async def streamed(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for part in (b"one,", b"two,", b"three"):
                yield part
                await asyncio.sleep(0.2)  # a stream that waits: what came before must be out already

        return StreamingResponse(chunks())

    app = Starlette(routes=[Route("/small", small), Route("/large", large), Route("/streamed", streamed)])
    with service_in_thread(app) as service, httpx.Client(base_url=service.url) as client:
        assert client.get("/small").json() == {"ok": True}
        [sent] = writes
        assert sent.startswith(b"HTTP/1.1 200 OK\r\n") and sent.endswith(b'\r\n\r\n{"ok":true}')
        writes.clear()
        assert client.get("/large").content == big
        assert b"".join(writes).endswith(big) and len(writes) <= 2
        writes.clear()
        firsts: list[tuple[bytes, float]] = []
        started = time.monotonic()
        with client.stream("GET", "/streamed") as response:
            for chunk in response.iter_bytes():
                firsts.append((chunk, time.monotonic() - started))
        assert b"".join(chunk for chunk, _ in firsts) == b"one,two,three"
        assert firsts[0][0].startswith(b"one,") and firsts[0][1] < 0.15, firsts  # not held for the wait
