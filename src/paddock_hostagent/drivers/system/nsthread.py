"""Work done inside one of a sandbox's namespaces, in process.

Some kernel state belongs to the namespace of the *thread* that touches it: ``/proc/sys/net`` shows
the network namespace of the thread that opens it, and ``sethostname`` names the thread's UTS
namespace. ``in_namespace`` runs a piece of work in a short-lived thread that enters the namespace
(``setns``) first and then ends: no fork of the agent (unsafe in its threaded event loop), no process
to spawn (``ip netns exec``, ``nsenter`` cost one each), and no other thread of the agent ever runs in
a sandbox's namespace.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from paddock_hostagent.drivers.base import DriverError

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)


def in_namespace(namespace: Path, kind: int, work: Callable[[], T], what: str) -> T:
    """Runs ``work`` in a new thread that has entered ``namespace`` (a ``/proc/<pid>/ns/*`` or
    ``/run/netns/*`` file of type ``kind``, a ``CLONE_NEW*`` flag) and returns what it returned; what
    it opened there (a socket, a netlink socket) stays in that namespace, usable from any thread.
    Raises DriverError naming ``what`` if entering or the work failed."""
    outcome: list[T] = []
    failures: list[BaseException] = []

    def enter_and_work() -> None:
        try:
            fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, kind) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {namespace}")
            finally:
                os.close(fd)
            outcome.append(work())
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=enter_and_work, name="in-namespace")
    worker.start()
    worker.join()
    if failures:
        raise DriverError(f"{what} failed: {failures[0]}") from failures[0]
    return outcome[0]
