"""Webhook endpoints (§11.14) and networks (§11.12), sync. ``_async_resources.py`` mirrors this file."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from paddock import _base
from paddock._models import Network, WebhookEndpoint

if TYPE_CHECKING:
    from paddock._client import Client


class Webhooks:
    """``client.webhooks``: endpoints that receive signed events (verify them with ``paddock.webhooks``)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def actions(self) -> list[str]:
        """Every action name an endpoint can subscribe to (the server's list is the authority)."""
        return [str(a) for a in self._client.request("GET", "v1/webhook-endpoints/actions")]

    def create(self, url: str, events: Iterable[str] | None = None) -> WebhookEndpoint:
        """Register ``url``; no ``events`` means every action. The result carries ``secret`` (shown once)."""
        body = _base.drop_none({"url": url, "events": None if events is None else list(events)})
        return WebhookEndpoint.from_api(self._client.request("POST", "v1/webhook-endpoints", json=body))

    def list(self) -> list[WebhookEndpoint]:
        return [WebhookEndpoint.from_api(e) for e in self._client.paginate("v1/webhook-endpoints")]

    def get(self, endpoint_id: str) -> WebhookEndpoint:
        """The endpoint with its retained ``deliveries`` (newest first)."""
        return WebhookEndpoint.from_detail(
            self._client.request("GET", _base.path("webhook-endpoints", endpoint_id))
        )

    def suspend(self, endpoint_id: str) -> WebhookEndpoint:
        data = self._client.request("POST", _base.path("webhook-endpoints", endpoint_id, "suspend"))
        return WebhookEndpoint.from_api(data)

    def resume(self, endpoint_id: str) -> WebhookEndpoint:
        data = self._client.request("POST", _base.path("webhook-endpoints", endpoint_id, "resume"))
        return WebhookEndpoint.from_api(data)

    def delete(self, endpoint_id: str) -> None:
        self._client.request("DELETE", _base.path("webhook-endpoints", endpoint_id))


class Networks:
    """``client.networks``: private overlay networks; sandboxes join with ``sandbox.join_network``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, name: str) -> Network:
        return Network.from_api(self._client.request("POST", "v1/networks", json={"name": name}))

    def list(self) -> list[Network]:
        return [Network.from_api(n) for n in self._client.paginate("v1/networks")]

    def get(self, network_id: str) -> Network:
        """The network with its ``members`` (sandbox id, status, overlay ip)."""
        return Network.from_api(self._client.request("GET", _base.path("networks", network_id)))

    def delete(self, network_id: str) -> None:
        """Delete; ``ConflictError`` (``IN_USE``) while a member sandbox is not terminal."""
        self._client.request("DELETE", _base.path("networks", network_id))
