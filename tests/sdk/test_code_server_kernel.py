"""The code interpreter's kernel server (``paddock/_code_server.py``, run inside the sandbox): whether a
context's kernel is alive.

A full test run saw two contexts started at once fail with "the kernel for context 'two' exited while
starting (status None)": the kernel was alive (no exit status), but its ``/proc/<pid>/cmdline`` did not
name its connection file yet. ``Popen`` returns once the child's exec has begun, before the kernel has
set the new program's arguments. A child of the server that has not exited is alive whatever its
cmdline says; only a kernel the server did not start itself (one a former server left) is told by it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock import _code_server
from paddock._code_server import Kernel


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernel]:
    monkeypatch.setattr(_code_server, "STATE_DIR", tmp_path)
    made = Kernel("two")
    yield made
    if made.process is not None and made.process.poll() is None:
        made.process.kill()
        made.process.wait()


def test_a_kernel_it_started_is_alive_before_its_arguments_can_be_read(kernel: Kernel) -> None:
    # A child whose cmdline names no connection file: what a kernel's is between Popen and its exec's end.
    kernel.process = subprocess.Popen(["sleep", "30"])
    kernel.pid_file.write_text(str(kernel.process.pid))
    assert kernel.pid() == kernel.process.pid
    kernel.process.kill()
    kernel.process.wait()
    assert kernel.pid() is None  # exited: dead, and the pid (free for reuse) is not taken for it


def test_a_kernel_it_did_not_start_is_told_by_its_connection_file(kernel: Kernel) -> None:
    other = subprocess.Popen(["sleep", "30"])  # a live process that is not this context's kernel
    try:
        kernel.pid_file.write_text(str(other.pid))
        assert kernel.pid() is None
        named = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)", str(kernel.connection_file)]
        )
        try:
            kernel.pid_file.write_text(str(named.pid))
            cmdline = Path(f"/proc/{named.pid}/cmdline")
            deadline = time.monotonic() + 5
            while str(kernel.connection_file).encode() not in cmdline.read_bytes():  # the race above
                assert time.monotonic() < deadline, "the child's arguments never showed"
                time.sleep(0.01)
            assert kernel.pid() == named.pid
        finally:
            named.kill()
            named.wait()
    finally:
        other.kill()
        other.wait()
