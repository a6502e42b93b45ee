"""A PostgreSQL LISTEN that outlives its connection: each notification on a channel is handed to a
callback, and a dropped connection is opened again after a second. Used by the control plane's status
and webhook wake-ups (``paddock_controlplane/workers/status_notify.py``) and by the point reads' cache
(``db.PgChanges``). SQLite has nothing to listen to: a listener of a non-PostgreSQL URL never starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from paddock_core.logging import get_logger

log = get_logger("paddock.pglisten")

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
    nobody listened. ``on_listening(connection)`` runs once each connection listens (before the catch-up),
    ``on_lost()`` each time one is lost or could not be opened."""

    def __init__(
        self,
        database_url: str,
        channel: str,
        on_notify: Callable[[str], None],
        *,
        catch_up: bool = False,
        on_listening: Callable[[Any], Awaitable[None]] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.dsn = listener_dsn(database_url)
        self.channel = channel
        self.on_notify = on_notify
        self.catch_up = catch_up
        self.on_listening = on_listening
        self.on_lost = on_lost
        self._task: asyncio.Task[None] | None = None
        self._connection: Any = None

    def start(self) -> None:
        if self.dsn is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{self.channel} listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def cancel(self) -> None:
        """``stop`` for a caller that cannot wait: the task is cancelled and its connection dropped."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._connection is not None and not self._connection.is_closed():
            self._connection.terminate()

    def _notified(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_notify(payload)

    async def _run(self) -> None:
        while True:
            connection = None
            try:
                self._connection = connection = await asyncpg.connect(self.dsn)
                lost = asyncio.Event()
                connection.add_termination_listener(lambda _conn, event=lost: event.set())
                await connection.add_listener(self.channel, self._notified)
                if self.on_listening is not None:
                    await self.on_listening(connection)
                if self.catch_up:
                    self.on_notify("")
                await lost.wait()
                log.warning("listener_lost", channel=self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is down: the caller's fallback covers the gap
                log.warning("listener_failed", channel=self.channel, error=str(exc))
            finally:
                if self.on_lost is not None:
                    self.on_lost()
                self._connection = None
                if connection is not None and not connection.is_closed():
                    with contextlib.suppress(Exception):
                        await connection.close()
            await asyncio.sleep(RECONNECT_AFTER_S)
