"""A sandbox's logs as the host agent kept them (issue #35): ``boot``, what its runtime and its guest's
init wrote while it booted plus the agent's own lines about the boot (``drivers/runtime/bootlog.py``),
and ``guest``, a VM's serial console. Each is a file in the sandbox's slot on the host, which the
sandbox cannot reach; it is read from its end only, ``tail`` lines at most (``bootlog.read_tail``)."""

from __future__ import annotations

import asyncio
from typing import Literal

from paddock_hostagent import errors
from paddock_hostagent.drivers.runtime.bootlog import read_tail
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.sandboxes.checks import driver_errors
from paddock_hostagent.schemas import SandboxLog


async def read(
    manager: SandboxManager, sandbox_id: str, source: Literal["boot", "guest"], tail: int
) -> SandboxLog:
    record = manager.entry(sandbox_id).record  # 404 unknown here
    with driver_errors():  # the agent's one table: a tier without the log is 409, no such log 400
        path = manager.runtime.log_path(record, source)
        await manager.runtime.flush_log(record, source)
    try:
        lines, truncated = await asyncio.to_thread(read_tail, path, tail)
    except OSError as exc:  # e.g. ELOOP: the agent never makes a link there
        raise errors.SandboxFailed(
            f"the {source} log of {sandbox_id} cannot be read: {exc.strerror}"
        ) from exc
    return SandboxLog(id=sandbox_id, source=source, lines=lines, truncated=truncated)
