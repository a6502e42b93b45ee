"""E2B's sandbox logs (``GET /sandboxes/{id}/logs``, ``/v2/…/logs``) from Paddock's boot log.

E2B's are its envd's own log; a Paddock sandbox's nearest is its boot log (docs/observability.md): what
its runtime and its guest's init wrote while it booted, and the host agent's ``paddock: …`` lines about
the boot, each of those starting with its UTC time. A line without a time of its own takes the time of
the line before it (the sandbox's creation for the first), so the entries stay in order. Every entry is
``info``: the boot log has no levels, so asking for ``warn`` or ``error`` finds none."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Iterable
from typing import Any

from paddock_controlplane.edge.e2b.params import LOG_LEVELS
from paddock_core.timeutil import as_utc, rfc3339

#: The time the host agent's own lines start with (``2026-12-02T07:50:01Z paddock: …``).
_STAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?)Z (.*)$", re.DOTALL)
#: What every entry's ``fields`` say: which of Paddock's logs it came from.
FIELDS = {"logger": "paddock-boot"}


@dataclasses.dataclass(frozen=True)
class Entry:
    at: dt.datetime
    message: str
    level: str = "info"

    def v1(self) -> dict[str, Any]:
        """The first logs route's ``{timestamp, line}``: E2B's lines are its envd's JSON log records,
        which clients parse (E2B's CLI reads ``level`` and ``logger`` from them), so this one is too."""
        record = {"level": self.level, **FIELDS, "message": self.message}
        return {"timestamp": rfc3339(self.at), "line": json.dumps(record)}

    def structured(self) -> dict[str, Any]:
        return {"timestamp": rfc3339(self.at), "level": self.level, "message": self.message, "fields": FIELDS}


def entries(lines: Iterable[str], created_at: dt.datetime) -> list[Entry]:
    """The boot log's lines as entries, oldest first."""
    at = as_utc(created_at)
    made = []
    for line in lines:
        stamped = _STAMPED.match(line)
        message = line
        if stamped is not None:
            try:
                at = dt.datetime.fromisoformat(stamped[1]).replace(tzinfo=dt.UTC)
                message = stamped[2]
            except ValueError:  # shaped like a time but none (month 13): the line as it is
                pass
        made.append(Entry(at, message))
    return made


def page(
    found: list[Entry],
    *,
    since_ms: int | None,
    limit: int,
    backward: bool = False,
    level: str | None = None,
    search: str | None = None,
) -> list[Entry]:
    """``limit`` entries from ``since_ms`` on, oldest first, or (``backward``) up to it, newest first; at
    ``level`` or above, holding ``search``."""
    wanted = LOG_LEVELS.index(level) if level is not None else 0
    chosen = [entry for entry in found if LOG_LEVELS.index(entry.level) >= wanted]
    if search:
        chosen = [entry for entry in chosen if search in entry.message]
    if since_ms is not None:
        at = dt.datetime.fromtimestamp(since_ms / 1000, dt.UTC)
        chosen = [entry for entry in chosen if (entry.at <= at if backward else entry.at >= at)]
    if backward:
        chosen.reverse()
    return chosen[:limit]
