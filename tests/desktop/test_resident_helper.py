"""The resident desktop helper's own contract, on the host: every request it accepts gets an answer.

The helper (``paddock_core/guest/desktop_helper.py``) runs here as it does in a sandbox — the control
plane's copy of its source, forked off to serve a unix socket — with its state directory moved to a
temporary one and two extra operations: one that fails in a way no operation expects, one that is slow.
A CI run on gVisor once got curl's "Empty reply from server" from it: a request it had accepted and then
dropped. These tests hold it to answering.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from paddock_controlplane.sandboxes.computer import HELPER_SOURCE

SOCKET_NAME = "helper-0123456789abcdef.sock"
# Runs the helper's source with its state directory and two operations of the test's, then makes it
# resident exactly as ``main`` does after a call.
HARNESS = """
import sys, time
from pathlib import Path
state = Path(sys.argv[1])
helper = {"__name__": "desktop_helper"}
exec(compile(sys.stdin.read(), "desktop_helper.py", "exec"), helper)
helper["STATE_DIR"] = state
def op_boom(index, args):
    raise KeyError("no such thing")
def op_slow(index, args):
    (state / "slow-started").touch()
    time.sleep(float(args["seconds"]))
    return {"slept": args["seconds"]}
helper["OPERATIONS"].update(boom=op_boom, slow=op_slow)
helper["become_resident"](state / sys.argv[2])
"""


def post(socket: Path, operation: str, arguments: dict[str, object]) -> dict[str, object]:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=30) as client:
        response = client.post(f"http://helper/{operation}", content=json.dumps(arguments))
    response.raise_for_status()
    answer: dict[str, object] = response.json()
    return answer


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def resident() -> Iterator[tuple[Path, int]]:
    """A resident helper's socket and pid. Its directory is short: a unix socket's path is at most 107
    bytes, which pytest's own temporary directories come close to."""
    state = Path(tempfile.mkdtemp(prefix="pdk-helper-", dir="/tmp"))
    socket = state / SOCKET_NAME
    subprocess.run(
        [sys.executable, "-c", HARNESS, str(state), SOCKET_NAME],
        input=HELPER_SOURCE, text=True, check=True, timeout=30,
    )  # fmt: skip
    lock = socket.with_suffix(".lock")
    deadline = time.monotonic() + 10
    while not (socket.exists() and lock.exists() and lock.read_text().strip()):
        assert time.monotonic() < deadline, "the helper never became resident"
        time.sleep(0.05)
    pid = int(lock.read_text())
    try:
        yield socket, pid
    finally:
        if alive(pid):
            os.kill(pid, 9)
        shutil.rmtree(state, ignore_errors=True)


def test_an_unexpected_failure_is_answered_with_its_cause_and_the_helper_goes_on(
    resident: tuple[Path, int],
) -> None:
    socket, pid = resident
    failed = post(socket, "boom", {})
    assert failed == {
        "error": {
            "status": 500,
            "code": "DESKTOP_FAILED",
            "message": "the desktop helper failed: KeyError: 'no such thing'",
        }
    }
    assert "KeyError: 'no such thing'" in (socket.parent / "helper-faults.log").read_text()
    assert post(socket, "slow", {"seconds": 0}) == {"data": {"slept": 0}}
    assert alive(pid)


def test_a_helper_whose_socket_is_taken_away_finishes_the_request_in_flight(
    resident: tuple[Path, int],
) -> None:
    socket, pid = resident
    answers: list[dict[str, object]] = []
    caller = threading.Thread(target=lambda: answers.append(post(socket, "slow", {"seconds": 4})))
    caller.start()
    deadline = time.monotonic() + 20
    while not (socket.parent / "slow-started").exists():
        assert time.monotonic() < deadline, "the helper never took the slow request"
        time.sleep(0.05)
    # A newer helper takes the name (the socket of this digest is replaced): this one must leave, but
    # only after answering the request it holds. It notices within its 2 s watch.
    socket.unlink()
    socket.write_text("")
    caller.join(timeout=20)
    assert answers == [{"data": {"slept": 4}}]
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, "the helper did not leave once its socket was taken"
        time.sleep(0.1)
    assert socket.read_text() == ""  # it left the newer helper's name alone
