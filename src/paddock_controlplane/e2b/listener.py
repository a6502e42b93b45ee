"""The E2B API's listener inside the control-plane process (``PADDOCK_CP_E2B_PORT``; ``paddock serve``
opens 127.0.0.1:3000), and the expiry worker that carries out E2B's ``timeout``: a sandbox whose
``end_at`` has passed is killed, or paused when it was created with ``autoPause``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn
from sqlalchemy import select

from paddock_controlplane import destruction, suspension
from paddock_controlplane.e2b import api
from paddock_controlplane.e2b.store import E2bSandbox
from paddock_controlplane.models import Sandbox
from paddock_controlplane.services import Services
from paddock_controlplane.states import SandboxStatus
from paddock_core import serving
from paddock_core.db import transaction
from paddock_core.logging import get_logger

log = get_logger("paddock.e2b")

#: Sandboxes the expiry worker acts on per pass (the rest wait for the next pass, a second later).
EXPIRY_BATCH = 50


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a process that already has its own server: it leaves the signals to that one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class E2bListener:
    def __init__(self, services: Services, host: str, port: int) -> None:
        self.services = services
        config = serving.config(api.create_app(services), host, port)
        config.lifespan = "off"
        self.server = _EmbeddedServer(config)
        self.host, self.port = host, port
        self._serving: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._serving = asyncio.create_task(self._serve(), name="e2b api")
        while not self.server.started:
            if self._serving.done():
                self._serving.result()  # raises the bind failure
                raise RuntimeError(f"the E2B API could not listen on {self.host}:{self.port}")
            await asyncio.sleep(0.02)
        self._expiry = asyncio.create_task(self._expire_forever(), name="e2b expiry")
        log.info("e2b_api_listening", host=self.host, port=self.port)

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        except SystemExit as exc:  # uvicorn exits when it cannot bind; the control plane says why
            raise RuntimeError(f"the E2B API could not listen on {self.host}:{self.port}") from exc

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        self.server.should_exit = True
        if self._serving is not None:
            with contextlib.suppress(Exception):
                await self._serving

    async def _expire_forever(self) -> None:
        while True:
            try:
                await expire_once(self.services)
            except Exception as exc:  # a pass that fails is retried on the next; the error is logged
                log.warning("e2b_expiry_failed", error=str(exc))
            await asyncio.sleep(self.services.settings.reconcile_interval_s)


async def expire_once(services: Services) -> int:
    """Kills (or, with ``autoPause``, pauses) every running sandbox whose E2B lifetime is over; returns
    how many it acted on. The lifetime stops while a sandbox is paused (``end_at`` is cleared)."""
    now = services.clock()
    async with transaction(services.sessions) as session:
        rows = (
            (
                await session.execute(
                    select(E2bSandbox, Sandbox.status)
                    .join(Sandbox, Sandbox.id == E2bSandbox.sandbox_id)
                    .where(E2bSandbox.end_at.is_not(None), E2bSandbox.end_at <= now)
                    .order_by(E2bSandbox.end_at)
                    .limit(EXPIRY_BATCH)
                )
            )
            .tuples()
            .all()
        )
        due = []
        for row, status in rows:
            if status == SandboxStatus.RUNNING:
                due.append((row.sandbox_id, row.user_id, row.auto_pause))
                row.end_at = None
            elif status not in (SandboxStatus.CREATING, SandboxStatus.RESUMING, SandboxStatus.FORKING):
                row.end_at = None  # paused, gone or failed: nothing to expire
    for sandbox_id, user_id, auto_pause in due:
        try:
            if auto_pause:
                await suspension.pause(services, user_id, sandbox_id, reason="e2b_timeout")
            else:
                await destruction.destroy(services, user_id, sandbox_id, reason="e2b_timeout")
            log.info("e2b_sandbox_expired", sandbox_id=sandbox_id, paused=auto_pause)
        except Exception as exc:
            log.warning("e2b_expiry_action_failed", sandbox_id=sandbox_id, error=str(exc))
    return len(due)


async def start(services: Services) -> E2bListener | None:
    """Opens the E2B API's listener, if one is configured (``e2b_port``)."""
    settings = services.settings
    if not settings.e2b_port:
        return None
    listener = E2bListener(services, settings.e2b_host or settings.host, settings.e2b_port)
    await listener.start()
    return listener
