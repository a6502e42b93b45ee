"""The E2B API's listener inside the control-plane process (``PADDOCK_CP_E2B_PORT``; ``paddock serve``
opens 127.0.0.1:3000). E2B's ``timeout`` is the native lifetime, which the reconciler's expiry pass
(``lifecycle.expire_pass``) carries out: this listener runs no worker of its own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn

from paddock_controlplane.e2b import api
from paddock_controlplane.services import Services
from paddock_core import serving
from paddock_core.logging import get_logger

log = get_logger("paddock.e2b")


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

    async def start(self) -> None:
        self._serving = asyncio.create_task(self._serve(), name="e2b api")
        while not self.server.started:
            if self._serving.done():
                self._serving.result()  # raises the bind failure
                raise RuntimeError(f"the E2B API could not listen on {self.host}:{self.port}")
            await asyncio.sleep(0.02)
        log.info("e2b_api_listening", host=self.host, port=self.port)

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        except SystemExit as exc:  # uvicorn exits when it cannot bind; the control plane says why
            raise RuntimeError(f"the E2B API could not listen on {self.host}:{self.port}") from exc

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._serving is not None:
            with contextlib.suppress(Exception):
                await self._serving


async def start(services: Services) -> E2bListener | None:
    """Opens the E2B API's listener, if one is configured (``e2b_port``)."""
    settings = services.settings
    if not settings.e2b_port:
        return None
    listener = E2bListener(services, settings.e2b_host or settings.host, settings.e2b_port)
    await listener.start()
    return listener
