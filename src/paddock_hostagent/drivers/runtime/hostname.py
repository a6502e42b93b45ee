"""Sets the hostname of a running sandbox: ``sethostname`` inside its UTS namespace, in process.

A sandbox claimed from the warm pool (``drivers/runtime/pool.py``) was booted under a placeholder name. The
hostname belongs to the UTS namespace of the calling thread, so the call runs in a short-lived thread
that entered the sandbox's (``drivers/system/nsthread.py``), where ``nsenter hostname`` would spawn a process.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from paddock_hostagent.drivers.system.nsthread import CLONE_NEWUTS, in_namespace

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sethostname.argtypes = (ctypes.c_char_p, ctypes.c_size_t)


def set_hostname(init_pid: int, hostname: str) -> None:
    """Sets ``hostname`` in the UTS namespace of process ``init_pid`` (the sandbox's init)."""
    name = hostname.encode()

    def set_name() -> None:
        if _libc.sethostname(name, len(name)) != 0:
            raise OSError(ctypes.get_errno(), "sethostname")

    in_namespace(
        Path(f"/proc/{init_pid}/ns/uts"), CLONE_NEWUTS, set_name, f"setting the hostname of {init_pid}"
    )
