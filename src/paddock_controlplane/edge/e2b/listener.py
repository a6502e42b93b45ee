"""The E2B API's listener inside the control-plane process (``PADDOCK_CP_E2B_PORT``; ``paddock serve``
opens 127.0.0.1:3000). E2B's ``timeout`` is the native lifetime, which the reconciler's expiry pass
(``lifecycle.expire_pass``) carries out: this listener runs no worker of its own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from paddock_controlplane.edge.e2b import api
from paddock_controlplane.records.services import Services
from paddock_core import serving
from paddock_core.logging import get_logger

log = get_logger("paddock.e2b")


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a process that already has its own server: it leaves the signals to that one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class EmbeddedListener:
    """An ASGI app on a port of its own inside the control-plane process (the E2B API, the sandbox
    edge): ``start`` returns once it listens, or raises why it could not."""

    def __init__(self, app: ASGIApp, host: str, port: int, *, title: str, listening_event: str) -> None:
        config = serving.config(app, host, port)
        config.lifespan = "off"
        self.server = _EmbeddedServer(config)
        self.host, self.port = host, port
        self.title, self.listening_event = title, listening_event
        self._serving: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._serving = asyncio.create_task(self._serve(), name=self.title.lower())
        while not self.server.started:
            if self._serving.done():
                self._serving.result()  # raises the bind failure
                raise RuntimeError(self._cannot_listen())
            await asyncio.sleep(0.02)
        log.info(self.listening_event, host=self.host, port=self.port)

    def _cannot_listen(self) -> str:
        return f"the {self.title} could not listen on {self.host}:{self.port}"

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        except SystemExit as exc:  # uvicorn exits when it cannot bind; the control plane says why
            raise RuntimeError(self._cannot_listen()) from exc

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._serving is not None:
            with contextlib.suppress(Exception):
                await self._serving


async def start(services: Services) -> EmbeddedListener | None:
    """Opens the E2B API's listener, if one is configured (``e2b_port``)."""
    settings = services.settings
    if not settings.e2b_port:
        return None
    listener = EmbeddedListener(
        api.create_app(services),
        settings.e2b_host or settings.host,
        settings.e2b_port,
        title="E2B API",
        listening_event="e2b_api_listening",
    )
    await listener.start()
    return listener
