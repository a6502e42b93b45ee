"""Long polls woken across control-plane processes: on PostgreSQL, every process LISTENs on
``paddock_sandbox_status``, which a trigger NOTIFYs with the sandbox's id when a change of its status
commits (migration 0010), and wakes its own waiters (``hotcache.StatusWatch``) at once. Without it a
waiter saw another process's change only at its next 250 ms re-read; the re-read stays as the
fallback (a dropped listener connection is re-opened after a second). SQLite: nothing to do.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg

from paddock_controlplane.hotcache import StatusWatch
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


class StatusListener:
    def __init__(self, database_url: str, watch: StatusWatch) -> None:
        self.dsn = listener_dsn(database_url)
        self.watch = watch
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.dsn is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="status listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _notified(self, _connection: Any, _pid: int, _channel: str, sandbox_id: str) -> None:
        self.watch.changed(sandbox_id)

    async def _run(self) -> None:
        while True:
            connection = None
            try:
                connection = await asyncpg.connect(self.dsn)
                lost = asyncio.Event()
                connection.add_termination_listener(lambda _conn, event=lost: event.set())
                await connection.add_listener(CHANNEL, self._notified)
                await lost.wait()
                log.warning("status_listener_lost")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is down: waiters fall back to re-reads meanwhile
                log.warning("status_listener_failed", error=str(exc))
            finally:
                if connection is not None and not connection.is_closed():
                    with contextlib.suppress(Exception):
                        await connection.close()
            await asyncio.sleep(RECONNECT_AFTER_S)
