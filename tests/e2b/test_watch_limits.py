"""Open watches are bounded (isolation rule 5): each holds a guest process and an inotify instance in its
sandbox (or, polled, runs a listing there every 0.5 s), so a sandbox has at most ``MAX_WATCHES_PER_SANDBOX`` of them open, through the edge's ``WatchDir`` and
``/v1``'s ``GET …/files/watch`` together (one limiter), and an account ``MAX_WATCHES_PER_ACCOUNT``. One
more is refused, a 429 with Retry-After on ``/v1`` and Connect's ``resource_exhausted`` on the edge, and
a closed watch frees its place. On the previous code the ninth watch was opened like the first."""

from __future__ import annotations

import contextlib
import json
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from e2b import Sandbox
from paddock_controlplane.edge.e2b.edge import connect
from paddock_controlplane.sandboxes.sandbox_fs import (
    MAX_WATCHES_PER_SANDBOX,
    WatchSlots,
)
from paddock_core import errors
from tests.e2b.conftest import E2bPlatform

WATCH_TIMEOUT = httpx.Timeout(20.0)


#: The iterators of the watches held open: leaving httpx's iterator (a ``break`` or its collection)
#: closes the response, so each is kept until its watch is meant to close.
_held: list[Iterator[object]] = []


def _first_envelope(response: httpx.Response) -> tuple[int, dict[str, object]]:
    buffer = b""
    chunks = response.iter_raw()
    _held.append(chunks)
    for chunk in chunks:
        buffer += chunk
        if len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if len(buffer) >= 5 + length:
                return flags, json.loads(buffer[5 : 5 + length])
    raise AssertionError(f"the stream ended after {buffer!r}")


def _first_line(response: httpx.Response) -> dict[str, object]:
    lines = response.iter_lines()
    _held.append(lines)
    for line in lines:
        if line.strip():
            return dict(json.loads(line))
    raise AssertionError("the watch ended before its first line")


@pytest.mark.root
@pytest.mark.slow
def test_a_sandbox_has_at_most_eight_open_watches_on_both_paths(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(timeout=300)
    edge = httpx.Client(base_url=e2b_env.sandbox_url, timeout=WATCH_TIMEOUT)
    v1 = e2b_env.platform.http(e2b_env.api_key, timeout=WATCH_TIMEOUT)
    edge_headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token or "",
        "Content-Type": connect.STREAM_CONTENT_TYPE,
    }
    watch_body = connect.envelope({"path": "/tmp"})

    @contextlib.contextmanager
    def edge_watch() -> Iterator[httpx.Response]:
        with edge.stream(
            "POST", "/filesystem.Filesystem/WatchDir", content=watch_body, headers=edge_headers
        ) as r:
            yield r

    @contextlib.contextmanager
    def v1_watch() -> Iterator[httpx.Response]:
        with v1.stream(
            "GET", f"/v1/sandboxes/{sandbox.sandbox_id}/files/watch", params={"path": "/tmp"}
        ) as r:
            yield r

    def open_edge(stack: contextlib.ExitStack) -> None:
        response = stack.enter_context(edge_watch())
        assert response.status_code == 200
        flags, message = _first_envelope(response)
        assert flags == 0 and message == {"start": {}}, message

    def open_v1(stack: contextlib.ExitStack) -> None:
        response = stack.enter_context(v1_watch())
        assert response.status_code == 200, response.read()
        assert _first_line(response) == {"watching": "/tmp"}

    try:
        with contextlib.ExitStack() as held:
            half = MAX_WATCHES_PER_SANDBOX // 2
            for _ in range(half):
                open_edge(held)
            last = contextlib.ExitStack()
            held.enter_context(last)
            for index in range(MAX_WATCHES_PER_SANDBOX - half):
                open_v1(last if index == 0 else held)

            # One more, on either path, is refused while the eight are open.
            with v1_watch() as refused:
                assert refused.status_code == 429, refused.status_code  # (a 200 would never end)
                assert int(refused.headers["Retry-After"]) >= 1
                assert "at most 8 open watches" in refused.read().decode()
            with edge_watch() as refused:
                flags, message = _first_envelope(refused)
                assert flags & connect.END_STREAM, message
                error = message["error"]
                assert isinstance(error, dict) and error["code"] == "resource_exhausted", message
                assert "at most 8 open watches" in str(error["message"])

            # A closed watch frees its place: the next one opens (the server sees the close promptly).
            last.close()
            deadline = time.monotonic() + 15
            freed = False
            while not freed:
                with v1_watch() as probe:
                    if probe.status_code == 200:
                        assert _first_line(probe) == {"watching": "/tmp"}
                        freed = True
                assert freed or time.monotonic() < deadline, "a closed watch's place was not freed in 15 s"
                time.sleep(0.2)
    finally:
        _held.clear()
        edge.close()
        v1.close()
        Sandbox.kill(sandbox.sandbox_id)


def test_an_account_is_capped_across_its_sandboxes_and_places_come_back() -> None:
    """The limiter's account bound (a unit seam beside the live test above)."""
    slots = WatchSlots(per_sandbox=2, per_account=3)
    taken = [slots.take("u1", "sb-a"), slots.take("u1", "sb-a"), slots.take("u1", "sb-b")]
    with pytest.raises(errors.RateLimited) as refused:
        slots.take("u1", "sb-c")
    assert "account has at most 3" in refused.value.message and refused.value.retry_after_s >= 1
    with pytest.raises(errors.RateLimited):
        slots.take("u2", "sb-a")  # another account's watch on a full sandbox: the sandbox's bound
    assert slots.take("u2", "sb-z") is not None
    taken[0].release()
    taken[0].release()  # idempotent: one place back, not two
    assert slots.take("u1", "sb-c") is not None
    with pytest.raises(errors.RateLimited):
        slots.take("u1", "sb-d")
