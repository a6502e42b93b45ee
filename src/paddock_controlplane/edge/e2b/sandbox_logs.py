"""E2B's sandbox logs (``GET /sandboxes/{id}/logs``, ``/v2/…/logs``) from Paddock's boot log and the
sandbox's audit trail.

E2B's are its envd's own log: the processes it started, the files it served, the requests it took. A
Paddock sandbox's nearest are two:

- its boot log (docs/observability.md): what its runtime and its guest's init wrote while it booted,
  and the host agent's ``paddock: …`` lines about the boot, each of those starting with its UTC time. A
  line without a time of its own takes the time of the line before it (the sandbox's creation for the
  first), so the entries stay in order. Every entry is ``info`` (the boot log has no levels). It lives
  on the sandbox's host, so it goes with the sandbox.
- its audit trail (docs/audit.md): the calls on it, the processes started and the files moved (through
  E2B's SDK or ``/v1``), its egress attempts. Each event is one entry (``from_events``): a refused
  connection, a call answered 4xx and lost events are ``warn``, a call answered 5xx ``error``. It is in
  the database, so it outlives the sandbox, for the trail's retention (7 days by default, as E2B keeps
  its logs).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from paddock_controlplane.edge.e2b.params import LOG_LEVELS
from paddock_controlplane.records.audit import AuditEvent
from paddock_core import audit_text
from paddock_core.timeutil import as_utc, rfc3339

#: The time the host agent's own lines start with (``2026-12-02T07:50:01Z paddock: …``).
_STAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?)Z (.*)$", re.DOTALL)
#: What a boot log entry's ``fields`` say: which of Paddock's logs it came from.
FIELDS: Mapping[str, str] = {"logger": "paddock-boot"}
#: The ``logger`` of an entry made from the audit trail.
AUDIT_LOGGER = "paddock-audit"


@dataclasses.dataclass(frozen=True)
class Entry:
    at: dt.datetime
    message: str
    level: str = "info"
    #: E2B's ``fields``, strings only (the SDKs' ``SandboxLogEntryFields``): ``logger`` first.
    fields: Mapping[str, str] = dataclasses.field(default_factory=lambda: FIELDS)

    def v1(self) -> dict[str, Any]:
        """The first logs route's ``{timestamp, line}``: E2B's lines are its envd's JSON log records,
        which clients parse (E2B's CLI reads ``level`` and ``logger`` from them), so this one is too."""
        record = {"level": self.level, **self.fields, "message": self.message}
        return {"timestamp": rfc3339(self.at), "line": json.dumps(record)}

    def structured(self) -> dict[str, Any]:
        return {
            "timestamp": rfc3339(self.at),
            "level": self.level,
            "message": self.message,
            "fields": dict(self.fields),
        }


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


def from_events(events: Iterable[AuditEvent]) -> list[Entry]:
    """The audit trail's events as entries, in their order. The message says what happened in a line;
    ``fields`` name the event's kind and who did it (a key's or token's id, ``envd``), never more of
    its detail than the message shows (no input digests)."""
    made = []
    for event in events:
        message, level = audit_text.describe(event.kind, event.detail)
        fields = {"logger": AUDIT_LOGGER, "kind": event.kind}
        if event.actor is not None:
            fields["actor"] = event.actor
        made.append(Entry(as_utc(event.at), message, level, fields))
    return made


def merged(*logs: list[Entry]) -> list[Entry]:
    """Entries from several logs, oldest first (each already in order; a stable sort keeps ties so)."""
    return sorted((entry for log in logs for entry in log), key=lambda entry: entry.at)


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
