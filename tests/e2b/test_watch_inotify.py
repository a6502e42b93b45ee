"""The edge's ``WatchDir`` follows the guest's inotify: a file written through the SDK is a create within
a second (the polled stream looked every 0.5 s), with its entry when ``includeEntry`` asks; a directory
past the guest's cap loses events, and the stream ends with ``internal`` as envd's own watcher does on an
overflow, never by going silent."""

from __future__ import annotations

import json
import queue
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from e2b import Sandbox
from paddock_controlplane.edge.e2b.edge import connect
from tests.e2b.conftest import E2bPlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: WATCH_MAX_DIRS in guest/watch.c.
MAX_DIRS = 4096


def _envelopes(response: httpx.Response) -> Iterator[tuple[int, dict[str, Any]]]:
    buffer = b""
    for chunk in response.iter_raw():
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if len(buffer) < 5 + length:
                break
            yield flags, json.loads(buffer[5 : 5 + length])
            buffer = buffer[5 + length :]


class Stream:
    """A WatchDir stream read by a thread, so the test waits for a message with a timeout."""

    def __init__(self, env: E2bPlatform, sandbox: Sandbox, request: dict[str, Any]) -> None:
        self.messages: queue.Queue[tuple[int, dict[str, Any]] | None] = queue.Queue()
        self.last_flags = -1
        self._client = httpx.Client(base_url=env.sandbox_url, timeout=httpx.Timeout(60.0))
        headers = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sandbox._envd_access_token or "",
            "Content-Type": connect.STREAM_CONTENT_TYPE,
        }
        self._cm = self._client.stream(
            "POST", "/filesystem.Filesystem/WatchDir", content=connect.envelope(request), headers=headers
        )
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in _envelopes(self.response):
                self.messages.put(message)
        except httpx.HTTPError:
            pass
        self.messages.put(None)

    def next(self, timeout_s: float) -> tuple[int, dict[str, Any]]:
        message = self.messages.get(timeout=timeout_s)
        assert message is not None, "the stream ended without its end envelope"
        return message

    def until(self, wanted: Any, timeout_s: float) -> list[dict[str, Any]]:
        """Messages up to the first for which ``wanted(message)`` holds; fails after ``timeout_s``.
        ``last_flags`` is the envelope flags of that one."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"nothing wanted within {timeout_s} s; last {seen[-5:]}"
            try:
                self.last_flags, message = self.next(left)
            except queue.Empty:
                pytest.fail(f"nothing wanted within {timeout_s} s; last {seen[-5:]}")
            seen.append(message)
            if wanted(message):
                return seen

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self._client.close()


def _event(name: str, kind: str) -> Any:
    return lambda m: m.get("filesystem", {}).get("name") == name and m["filesystem"]["type"] == kind


def test_watch_dir_streams_inotify_events_and_ends_on_an_overflow(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(timeout=300)
    try:
        sandbox.files.make_dir("/tmp/w")
        stream = Stream(e2b_env, sandbox, {"path": "/tmp/w", "recursive": True, "includeEntry": True})
        try:
            assert stream.next(10) == (0, {"start": {}})
            sandbox.files.write("/tmp/w/new.txt", "new")
            returned = time.monotonic()
            seen = stream.until(_event("new.txt", "EVENT_TYPE_CREATE"), 1.0)
            print(f"WatchDir: the create came {time.monotonic() - returned:.3f} s after the write returned")
            entry = seen[-1]["filesystem"]["entry"]
            assert (entry["path"], entry["type"], entry["size"]) == ("/tmp/w/new.txt", "FILE_TYPE_FILE", "3")
            sandbox.commands.run("mkdir -p /tmp/w/sub && echo x >> /tmp/w/sub/f")
            stream.until(_event("sub/f", "EVENT_TYPE_CREATE"), 1.0)
            sandbox.files.remove("/tmp/w/new.txt")
            stream.until(_event("new.txt", "EVENT_TYPE_REMOVE"), 1.0)
        finally:
            stream.close()

        made = sandbox.commands.run(f"mkdir /tmp/big && cd /tmp/big && seq 1 {MAX_DIRS - 2} | xargs mkdir")
        assert made.exit_code == 0
        stream = Stream(e2b_env, sandbox, {"path": "/tmp/big", "recursive": True})
        try:
            assert stream.next(30) == (0, {"start": {}})
            sandbox.commands.run("mkdir /tmp/big/x && mkdir /tmp/big/x/y")
            seen = stream.until(lambda m: "error" in m, 10)
            end = seen[-1]
            assert end["error"]["code"] == "internal" and "events were lost" in end["error"]["message"], end
            assert stream.last_flags == connect.END_STREAM  # the end-of-stream envelope, not a message
        finally:
            stream.close()
    finally:
        sandbox.kill()
