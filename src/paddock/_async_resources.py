"""Webhook endpoints (§11.14) and networks (§11.12)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from paddock import _base
from paddock._models import Network, WebhookEndpoint

if TYPE_CHECKING:
    from paddock._async_client import AsyncClient


class AsyncWebhooks:
    """``client.webhooks``: endpoints that receive signed events (verify them with ``paddock.webhooks``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def actions(self) -> list[str]:
        """Every action name an endpoint can subscribe to (the server's list is the authority)."""
        return [str(a) for a in await self._client.request("GET", "v1/webhook-endpoints/actions")]

    async def create(self, url: str, events: Iterable[str] | None = None) -> WebhookEndpoint:
        """Register ``url``; no ``events`` means every action. The result carries ``secret`` (shown once)."""
        body = _base.drop_none({"url": url, "events": None if events is None else list(events)})
        return WebhookEndpoint.from_api(await self._client.request("POST", "v1/webhook-endpoints", json=body))

    async def list(self) -> list[WebhookEndpoint]:
        return [WebhookEndpoint.from_api(e) async for e in self._client.paginate("v1/webhook-endpoints")]

    async def get(self, endpoint_id: str) -> WebhookEndpoint:
        """The endpoint with its retained ``deliveries`` (newest first)."""
        return WebhookEndpoint.from_detail(
            await self._client.request("GET", _base.path("webhook-endpoints", endpoint_id))
        )

    async def suspend(self, endpoint_id: str) -> WebhookEndpoint:
        data = await self._client.request("POST", _base.path("webhook-endpoints", endpoint_id, "suspend"))
        return WebhookEndpoint.from_api(data)

    async def resume(self, endpoint_id: str) -> WebhookEndpoint:
        data = await self._client.request("POST", _base.path("webhook-endpoints", endpoint_id, "resume"))
        return WebhookEndpoint.from_api(data)

    async def delete(self, endpoint_id: str) -> None:
        await self._client.request("DELETE", _base.path("webhook-endpoints", endpoint_id))


class AsyncNetworks:
    """``client.networks``: private overlay networks; sandboxes join with ``sandbox.join_network``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, name: str) -> Network:
        return Network.from_api(await self._client.request("POST", "v1/networks", json={"name": name}))

    async def list(self) -> list[Network]:
        return [Network.from_api(n) async for n in self._client.paginate("v1/networks")]

    async def get(self, network_id: str) -> Network:
        """The network with its ``members`` (sandbox id, status, overlay ip)."""
        return Network.from_api(await self._client.request("GET", _base.path("networks", network_id)))

    async def delete(self, network_id: str) -> None:
        """Delete; ``ConflictError`` (``IN_USE``) while a member sandbox is not terminal."""
        await self._client.request("DELETE", _base.path("networks", network_id))
