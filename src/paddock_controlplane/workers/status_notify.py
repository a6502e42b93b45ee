"""PostgreSQL notifications heard by every control-plane process (``ChannelListener``), so work done
by one process wakes the waiters of all of them at once instead of at their next poll:

- long polls: a trigger NOTIFYs ``paddock_sandbox_status`` with the sandbox's id when a change of its
  status commits (migration 0010); each process wakes its own waiters (``hotcache.StatusWatch``),
  whose 250 ms re-read stays as the fallback;
- webhook workers: a commit that makes deliveries due NOTIFYs ``webhooks.NOTIFY_CHANNEL``.

A dropped listener connection is re-opened after a second; the polls cover the gap. SQLite: nothing to
do (one process).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import asyncpg

from paddock_controlplane.records.hotcache import StatusWatch
from paddock_core.logging import get_logger

log = get_logger("paddock.status_notify")

CHANNEL = "paddock_sandbox_status"
RECONNECT_AFTER_S = 1.0


def listener_dsn(database_url: str) -> str | None:
    """asyncpg's DSN for a PostgreSQL SQLAlchemy URL; None for any other database."""
    for prefix in ("postgresql+asyncpg://", "postgresql://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    return None


class ChannelListener:
    """LISTENs on ``channel`` and calls ``on_notify`` with each notification's payload. With
    ``catch_up``, ``on_notify("")`` also runs each time listening (re)starts, for what was committed while
    nobody listened."""

    def __init__(
        self, database_url: str, channel: str, on_notify: Callable[[str], None], *, catch_up: bool = False
    ) -> None:
        self.dsn = listener_dsn(database_url)
        self.channel = channel
        self.on_notify = on_notify
        self.catch_up = catch_up
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.dsn is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{self.channel} listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _notified(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_notify(payload)

    async def _run(self) -> None:
        while True:
            connection = None
            try:
                connection = await asyncpg.connect(self.dsn)
                lost = asyncio.Event()
                connection.add_termination_listener(lambda _conn, event=lost: event.set())
                await connection.add_listener(self.channel, self._notified)
                if self.catch_up:
                    self.on_notify("")
                await lost.wait()
                log.warning("listener_lost", channel=self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is down: the polls cover the gap
                log.warning("listener_failed", channel=self.channel, error=str(exc))
            finally:
                if connection is not None and not connection.is_closed():
                    with contextlib.suppress(Exception):
                        await connection.close()
            await asyncio.sleep(RECONNECT_AFTER_S)


def status_listener(database_url: str, watch: StatusWatch) -> ChannelListener:
    """Wakes this process's waiters on a sandbox whose status another process changed."""
    return ChannelListener(database_url, CHANNEL, watch.changed)
