"""Sets the hostname of a running sandbox: ``sethostname`` inside its UTS namespace, in process.

A sandbox claimed from the warm pool (``drivers/pool.py``) was booted under a placeholder name. The
hostname belongs to the UTS namespace of the thread that calls ``sethostname``, so a short-lived thread
enters the sandbox's namespace (``setns`` on ``/proc/<init>/ns/uts``), sets the name and ends: no
process to spawn (``nsenter hostname`` costs one), and no other thread of the agent ever runs in the
sandbox's namespace (``drivers/network.py``'s ``netns_sysctl`` does the same for sysctls).
"""

from __future__ import annotations

import ctypes
import os
import threading

from paddock_hostagent.drivers.base import DriverError

CLONE_NEWUTS = 0x04000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
_libc.sethostname.argtypes = (ctypes.c_char_p, ctypes.c_size_t)


def set_hostname(init_pid: int, hostname: str) -> None:
    """Sets ``hostname`` in the UTS namespace of process ``init_pid`` (the sandbox's init)."""
    name = hostname.encode()
    failures: list[BaseException] = []

    def enter_and_set() -> None:
        try:
            fd = os.open(f"/proc/{init_pid}/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWUTS) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into the UTS namespace of {init_pid}")
            finally:
                os.close(fd)
            if _libc.sethostname(name, len(name)) != 0:
                raise OSError(ctypes.get_errno(), "sethostname")
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=enter_and_set, name="sandbox-hostname")
    worker.start()
    worker.join()
    if failures:
        raise DriverError(f"setting the hostname of {init_pid} failed: {failures[0]}") from failures[0]
