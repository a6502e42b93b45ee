"""PostgreSQL notifications heard by every control-plane process (``ChannelListener``), so work done
by one process wakes the waiters of all of them at once instead of at their next poll:

- long polls: a trigger NOTIFYs ``paddock_sandbox_status`` with the sandbox's id when a change of its
  status commits (migration 0010); each process wakes its own waiters (``hotcache.StatusWatch``),
  whose 250 ms re-read stays as the fallback;
- webhook workers: a commit that makes deliveries due NOTIFYs ``webhooks.NOTIFY_CHANNEL``.

A dropped listener connection is re-opened after a second (``paddock_core/pglisten.py``); the polls
cover the gap. SQLite: nothing to do (one process).
"""

from __future__ import annotations

from paddock_controlplane.records.hotcache import StatusWatch
from paddock_core.pglisten import ChannelListener

CHANNEL = "paddock_sandbox_status"


def status_listener(database_url: str, watch: StatusWatch) -> ChannelListener:
    """Wakes this process's waiters on a sandbox whose status another process changed."""
    return ChannelListener(database_url, CHANNEL, watch.changed)
