"""HTTP ingress: ``<port>-<sandbox id>.<ingress domain>`` reaches that port of the sandbox.

``routing`` maps host names to sandboxes (cached, waking paused ones), ``http1`` parses HTTP/1.1
with llhttp and re-frames bodies, ``proxy`` serves the listeners, ``http2`` serves HTTP/2 clients of the
TLS listener (each stream one HTTP/1.1 exchange with the app), ``pages`` renders the proxy's own error answers.
"""

from __future__ import annotations

from paddock_controlplane.edge.ingress.http2 import H2ClientConnection
from paddock_controlplane.edge.ingress.proxy import IngressProxy
from paddock_controlplane.edge.ingress.routing import Router
from paddock_controlplane.records.hotcache import TTLCache
from paddock_controlplane.records.services import Services


async def start(services: Services, cache: TTLCache[object]) -> IngressProxy | None:
    """Opens this process's ingress listeners, if any are configured."""
    settings = services.settings
    if not (settings.ingress_port or settings.ingress_tls_port):
        return None
    proxy = IngressProxy(services, Router(services, cache), h2=H2ClientConnection)
    await proxy.start()
    return proxy
