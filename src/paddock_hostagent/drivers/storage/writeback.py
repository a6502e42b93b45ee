"""What the disk store holds dirty in the host's page cache, and when it is written back.

A sandbox's disk drops its flushes (``loops.write_through``: a sandbox never outlives a host crash),
so what a tenant writes waits dirty in the host's page cache: first in its own filesystem, then, once
synced, in its image file in the store. ``FICLONE`` writes a file's dirty pages back before it shares
their blocks, so a fork's clone first wrote back whatever its source had synced: 280-470 ms for 1 GiB
just synced on the dev box. Two things keep that out of a fork:

- **The store's bound** (``STORE_DIRTY_BYTES``, ``hold``): the store's own loop device may hold that
  much dirty, past which the kernel writes back and paces the writers (the sandboxes' loop devices),
  so what a sandbox syncs reaches the disk in its sync and not in its next fork's clone (2-21 ms).
- **A fork's own sync** (``sync_copied``): what the source still holds unsynced has to reach the disk
  before its clone anyway. The sync runs with the bound lifted, since the kernel's pacing of a writer
  at the bound is slower than the disk, and while it runs the image's new dirty pages are sent to the
  disk beside it, so the clone finds little left to write. A fork after 100 MiB unsynced: 112 ms
  paced at the bound, 84 ms lifted, 68 ms lifted and pushed (``bench/fork_after_write.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

from paddock_hostagent.drivers.storage import loops, mounts

MIB = 1 << 20
#: What the store's own loop device may hold dirty (``loops.bound_dirty``). With it, a tenant's ``fsync``
#: of 1 GiB just written took 0.37-0.75 s against 0.08-0.62 s unbounded (the same work, done in the
#: sync instead of later by the flusher), 1,000 O_DSYNC writes of 4 KiB 77-128 ms either way; beside a
#: sandbox writing flat out, which now writes at the disk's pace instead of into memory, that fsync took
#: 2.2-2.6 s against 1.3-1.8 s. The host's own background threshold (``vm.dirty_background_bytes``) is
#: left as it is: lowered to 16 MiB it also sped up a fork after 100 MiB unsynced, but under cgroup v1
#: the flusher's writes are no sandbox's, and it then wrote most of a sandbox's ``dd conv=fsync``
#: before the fsync did, past the sandbox's disk throttle (38 MiB/s against 20:
#: ``test_disk_throttle_holds_direct_and_synced_io``).
STORE_DIRTY_BYTES = 64 * MIB
#: A sync shorter than this pushes nothing: a settled source's takes ~0.3 ms.
_PUSH_AFTER_S = 0.003
#: How often the pusher asks for the image's new dirty pages to be written.
_PUSH_EVERY_S = 0.002
_SYNC_FILE_RANGE_WRITE = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.sync_file_range.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)


class _StoreBound:
    """The store devices this process bounds, and the bound's lifts: while any fork's source syncs,
    no store device is held to its bound. The last lift to end sets it again; what the stores then
    hold over it, their next writers wait out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: set[str] = set()
        self._lifts = 0

    def hold(self, device: str) -> bool:
        with self._lock:
            if not loops.bound_dirty(device, STORE_DIRTY_BYTES, strict=self._lifts == 0):
                return False
            self._devices.add(device)
        return True

    def let_go(self, device: str) -> None:
        with self._lock:
            self._devices.discard(device)
            loops.unbound_dirty(device)

    @contextlib.contextmanager
    def lifted(self) -> Iterator[None]:
        with self._lock:
            self._lifts += 1
            if self._lifts == 1:
                for device in self._devices:
                    loops.strict_dirty(device, False)
        try:
            yield
        finally:
            with self._lock:
                self._lifts -= 1
                if self._lifts == 0:
                    for device in self._devices:
                        loops.strict_dirty(device, True)


class _ImagePusher:
    """One thread per process that, while a fork's source syncs, asks every few milliseconds for the
    source image's dirty pages to be written (``sync_file_range``, which starts the writes and does not
    wait for them). A thread started per sync cost the fork 1.5 ms more for a settled source: a new
    thread waits for the interpreter's lock before ``start`` returns, and the event loop holds it then.
    It starts with the first sync. Overlapping syncs are served one after the other: a second fork's
    sync is pushed only once the first's ends (its clone then writes back what was not)."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Path, threading.Event]] = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()

    def push_while(self, image: Path, done: threading.Event) -> None:
        with self._lock:
            if not self._started:
                threading.Thread(target=self._run, name="store-writeback", daemon=True).start()
                self._started = True
        self._requests.put((image, done))

    def _run(self) -> None:
        while True:
            image, done = self._requests.get()
            if done.wait(_PUSH_AFTER_S):
                continue
            try:
                fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # the image is gone: nothing to push
            try:
                while not done.wait(_PUSH_EVERY_S):
                    _libc.sync_file_range(
                        fd, 0, 0, _SYNC_FILE_RANGE_WRITE
                    )  # best effort: the clone waits anyway
            finally:
                os.close(fd)


_bound = _StoreBound()
_pusher = _ImagePusher()


def hold(device: str) -> bool:
    """Bounds what the store device ``device`` holds dirty (``STORE_DIRTY_BYTES``); False where the
    kernel has no such knobs (the store then runs unbounded)."""
    return _bound.hold(device)


def let_go(device: str) -> None:
    """Gives the store device the kernel's defaults back (it is about to be detached)."""
    _bound.let_go(device)


def lifted() -> contextlib.AbstractContextManager[None]:
    """The stores' bound let go for the block's length (the last of overlapping lifts sets it again)."""
    return _bound.lifted()


def sync_copied(mount_dir: Path, image: Path) -> None:
    """``syncfs`` of a fork's or a snapshot's source (mounted at ``mount_dir``, its image file
    ``image``), with the stores' bound lifted and the image's new dirty pages sent to the disk beside
    it. Blocking: run it in a thread."""
    done = threading.Event()
    with lifted():
        _pusher.push_while(image, done)
        try:
            mounts.sync_filesystem(mount_dir)
        finally:
            done.set()
