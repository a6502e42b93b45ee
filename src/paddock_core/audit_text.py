"""One line saying what an audit event records (docs/audit.md), and how loud it is.

The E2B logs routes make a log entry of each event (``paddock_controlplane/edge/e2b/sandbox_logs.py``)
and ``paddock sandbox audit`` prints a table of them; both say an event the same way. Standard library
only: the command line imports it without the server's dependencies.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

#: A line's level, as E2B's logs name them (``debug`` < ``info`` < ``warn`` < ``error``).
INFO, WARN, ERROR = "info", "warn", "error"


def describe(kind: str, detail: Mapping[str, Any]) -> tuple[str, str]:
    """The event's line and level: a refused connection, a call answered 4xx and lost events are
    ``warn``, a call answered 5xx ``error``, everything else ``info``. Only what the event holds is said
    (argv, paths, addresses), never its input digest."""
    if kind == "api":
        status = int(detail.get("status") or 0)
        level = ERROR if status >= 500 else WARN if status >= 400 else INFO
        took = detail.get("duration_ms")
        return f"{detail.get('method')} {detail.get('route')} answered {status} in {took} ms", level
    if kind in ("command", "process"):
        argv = shlex.join(str(part) for part in detail.get("argv") or [])
        if detail.get("truncated"):
            argv += " …"
        if kind == "process":
            return f"process {detail.get('process_id')} started: {argv}", INFO
        return f"command exited {detail.get('exit_code')}: {argv}", INFO
    if kind == "file":
        verb = "written" if detail.get("direction") == "write" else "read"
        return f"file {verb}: {detail.get('path')} ({detail.get('bytes')} bytes)", INFO
    if kind == "egress":
        verdict = detail.get("verdict")
        where = f"{detail.get('protocol')} {detail.get('address')}:{detail.get('port')}"
        return f"egress {verdict}: {where}", WARN if verdict == "refused" else INFO
    if kind == "dropped":
        return f"{detail.get('dropped')} events not recorded: {detail.get('reason')}", WARN
    return kind, INFO
