"""The stderr of a sandbox's boot, kept bounded.

The OCI runtime hands its own stdio to the container's init (``run -d`` with no terminal), so the fd
the runtime writes its errors to is also the guest agent's fd 2, reachable from inside the sandbox as
``/proc/1/fd/2``. A host file there would let a sandbox write to the host's disk without limit (issue
#12). So that fd is a pipe: the agent reads it while the sandbox boots, keeps the last
``limit_bytes``, and closes its end when the boot is over. From then on a write to it fails with
EPIPE, and the guest agent has already moved its own stdio to /dev/null anyway. What was kept goes to
``runtime.log`` in the slot (at most ``limit_bytes``), as the runtime's errors did before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path


class BootLog:
    limit_bytes = 64 * 1024

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.read_fd, False)  # the writers' end stays blocking, as stderr usually is
        self._data = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def start(self) -> None:
        """Called once the runtime holds the write end: drop ours and read as bytes arrive."""
        self._close_write_end()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.read_fd, self._drain)

    def _close_write_end(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:  # every writer has closed its end (the guest agent left it for /dev/null)
                if self._loop is not None:
                    self._loop.remove_reader(self.read_fd)
                    self._loop = None
                return
            self._data += chunk
            if len(self._data) > self.limit_bytes:
                del self._data[: len(self._data) - self.limit_bytes]

    def text(self) -> str:
        return self._data.decode(errors="replace")

    def note(self, line: str) -> None:
        """Adds a line of the host agent's own (``paddock: …``, with the UTC time) to what is kept, so a
        quiet boot's log still says when and how it went."""
        if self._closed:
            return
        self._drain()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if self._data and not self._data.endswith(b"\n"):
            self._data += b"\n"
        self._data += f"{stamp} paddock: {line}\n".encode()
        if len(self._data) > self.limit_bytes:
            del self._data[: len(self._data) - self.limit_bytes]

    def suffix(self) -> str:
        """The tail of what was written, as a clause for an error message ("" when nothing was)."""
        self._drain_if_open()
        tail = self.text().strip()[-2000:]
        return f"; it wrote: {tail}" if tail else ""

    def _drain_if_open(self) -> None:
        if not self._closed:
            self._drain()

    def close(self) -> None:
        """Stops reading and closes the pipe (idempotent); writes what was kept to ``path``."""
        if self._closed:
            return
        self._drain()
        self._closed = True
        if self._loop is not None:
            self._loop.remove_reader(self.read_fd)
            self._loop = None
        self._close_write_end()
        os.close(self.read_fd)
        if self._data:
            with contextlib.suppress(OSError):
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, bytes(self._data))
                finally:
                    os.close(fd)


#: The most bytes one read looks at, from the file's end: a boot log is at most ``BootLog.limit_bytes``,
#: but a VM's serial console is written by the guest's kernel, so only its end is read.
MAX_READ_BYTES = 256 * 1024


def read_tail(path: Path, lines: int) -> tuple[list[str], bool]:
    """The last ``lines`` lines of a log the host agent keeps in a sandbox's slot (never in the
    sandbox's tree): ``O_NOFOLLOW``, at most ``MAX_READ_BYTES`` from the end. Answers the lines and
    whether older ones were left out; a log never written (a quiet boot) is no lines."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return [], False
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - MAX_READ_BYTES)
        data = os.pread(fd, size - start, start)
    finally:
        os.close(fd)
    text = data.decode(errors="replace")
    found = text.splitlines()
    if start > 0 and found:  # the first line is cut by the window
        found = found[1:]
    kept = found[-lines:] if lines > 0 else []
    return kept, start > 0 or len(kept) < len(found)
