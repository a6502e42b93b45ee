"""``WalletSandbox``: what ``GatewayClient.create_wallet_sandbox`` returns — a sandbox rented by a wallet
alone (``POST /agent/sandboxes``, docs/wallet-sandboxes.md), with the access token that drives it through
the control plane's token routes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paddock._async_client import AsyncClient
    from paddock._client import Client


@dataclass
class WalletSandbox:
    """A sandbox rented by the wallet (``POST /agent/sandboxes``): drive it through the control plane at
    ``control_plane_url`` with ``access_token`` as the API key (``client()`` / ``async_client()``). The
    token is shown once, in this answer; keep it. ``scheme`` ``exact``: ``amount_raw`` paid in
    ``transaction`` for ``seconds`` of running; ``upto``: ``authorized_raw`` at most, settled later for
    the seconds it ran × ``price_per_second_raw``."""

    sandbox_id: str
    access_token: str = field(repr=False)
    control_plane_url: str
    expires_at: str
    scheme: str
    network: str
    price_per_second_raw: int
    seconds: int
    transaction: str | None = None
    amount_raw: int | None = None
    authorized_raw: int | None = None
    payment: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> WalletSandbox:
        payment = dict(data.get("payment") or {})
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            access_token=str(data["access_token"]),
            control_plane_url=str(data["control_plane_url"]),
            expires_at=str(data.get("expires_at", "")),
            scheme=str(payment.get("scheme", "")),
            network=str(payment.get("network", "")),
            price_per_second_raw=int(payment.get("price_per_second_raw") or 0),
            seconds=int(payment.get("seconds") or 0),
            transaction=payment.get("transaction") or None,
            amount_raw=None if payment.get("amount_raw") is None else int(payment["amount_raw"]),
            authorized_raw=None if payment.get("authorized_raw") is None else int(payment["authorized_raw"]),
            payment=payment,
        )

    def client(self, **options: Any) -> Client:
        """A control-plane ``Client`` acting with this sandbox's token: ``client.sandboxes.get(id)``."""
        from paddock._client import Client

        return Client(base_url=self.control_plane_url, api_key=self.access_token, **options)

    def async_client(self, **options: Any) -> AsyncClient:
        from paddock._async_client import AsyncClient

        return AsyncClient(base_url=self.control_plane_url, api_key=self.access_token, **options)


__all__ = ["WalletSandbox"]
