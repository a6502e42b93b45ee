"""The E2B sandbox edge's listener inside the control-plane process (``PADDOCK_CP_E2B_EDGE_PORT``;
``paddock serve`` opens 127.0.0.1:49983).

For the app's lifespan (``paddock_controlplane.app``)::

    edge = await edge_listener.start(services)   # None when e2b_edge_port is 0
    ...
    if edge:
        await edge.stop()
"""

from __future__ import annotations

import asyncio
import contextlib

from paddock_controlplane.e2b.edge import user_ports
from paddock_controlplane.e2b.edge.router import EdgeApp
from paddock_controlplane.e2b.listener import _EmbeddedServer
from paddock_controlplane.services import Services
from paddock_core import serving
from paddock_core.logging import get_logger

log = get_logger("paddock.e2b.edge")


class EdgeListener:
    def __init__(self, services: Services, host: str, port: int) -> None:
        config = serving.config(EdgeApp(services), host, port)
        config.lifespan = "off"
        self.server = _EmbeddedServer(config)
        self.host, self.port = host, port
        self._serving: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._serving = asyncio.create_task(self._serve(), name="e2b edge")
        while not self.server.started:
            if self._serving.done():
                self._serving.result()
                raise RuntimeError(f"the E2B edge could not listen on {self.host}:{self.port}")
            await asyncio.sleep(0.02)
        log.info("e2b_edge_listening", host=self.host, port=self.port)

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        except SystemExit as exc:
            raise RuntimeError(f"the E2B edge could not listen on {self.host}:{self.port}") from exc

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._serving is not None:
            with contextlib.suppress(Exception):
                await self._serving
        await user_ports.close()


async def start(services: Services) -> EdgeListener | None:
    """Opens the edge's listener, if one is configured (``e2b_edge_port``)."""
    settings = services.settings
    if not settings.e2b_edge_port:
        return None
    listener = EdgeListener(services, settings.e2b_host or settings.host, settings.e2b_edge_port)
    await listener.start()
    return listener
