"""The E2B sandbox edge's listener inside the control-plane process (``PADDOCK_CP_E2B_EDGE_PORT``;
``paddock serve`` opens 127.0.0.1:49983).

For the app's lifespan (``paddock_controlplane.app``)::

    edge = await edge_listener.start(services)   # None when e2b_edge_port is 0
    ...
    if edge:
        await edge.stop()
"""

from __future__ import annotations

from paddock_controlplane.edge.auditing import AuditMiddleware
from paddock_controlplane.edge.e2b import audit_targets
from paddock_controlplane.edge.e2b.edge import user_ports
from paddock_controlplane.edge.e2b.edge.router import EdgeApp
from paddock_controlplane.edge.e2b.listener import EmbeddedListener
from paddock_controlplane.records.services import Services


class EdgeListener(EmbeddedListener):
    def __init__(self, services: Services, host: str, port: int) -> None:
        app = AuditMiddleware(EdgeApp(services), audit_targets.edge_locate(services), services)
        super().__init__(app, host, port, title="E2B edge", listening_event="e2b_edge_listening")

    async def stop(self) -> None:
        await super().stop()
        await user_ports.close()


async def start(services: Services) -> EdgeListener | None:
    """Opens the edge's listener, if one is configured (``e2b_edge_port``)."""
    settings = services.settings
    if not settings.e2b_edge_port:
        return None
    listener = EdgeListener(services, settings.e2b_host or settings.host, settings.e2b_edge_port)
    await listener.start()
    return listener
