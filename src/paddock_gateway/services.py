"""The gateway's wired services: built once in the app's lifespan, reached by routes as a dependency."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from paddock_core.timeutil import Clock
from paddock_gateway.adapters.chain import ChainClient
from paddock_gateway.adapters.control_plane import ControlPlane
from paddock_gateway.adapters.hosting import HostingPlatform
from paddock_gateway.metering import Metering
from paddock_gateway.pricing import PriceCache
from paddock_gateway.ratelimit import RateLimiter
from paddock_gateway.registry import Registry
from paddock_gateway.settings import GatewaySettings
from paddock_gateway.settlement import Settler
from paddock_gateway.signatures import SignatureVerifier, Verdict


@dataclass
class Services:
    settings: GatewaySettings
    registry: Registry
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    chains: dict[str, ChainClient]
    hosting: HostingPlatform
    prices: PriceCache
    limiter: RateLimiter
    clock: Clock
    started_at: dt.datetime
    settler: Settler = field(default_factory=lambda: Settler(SecretStr("")))
    metering: Metering | None = field(default=None)
    signatures: SignatureVerifier = field(default_factory=SignatureVerifier)
    #: The control plane as the gateway's account, for the sandboxes wallets rent (``agent_sandboxes``).
    agent_sandboxes: ControlPlane | None = field(default=None)

    def chain_client(self, chain: str) -> ChainClient:
        return self.chains[chain]

    async def contract_signature(self, address: str, digest: bytes, signature: bytes) -> Verdict:
        """Wallet auth's smart-wallet check: EIP-1271/ERC-6492 on any of the gateway's chains."""
        clients = [self.chains[spec.name] for spec in self.registry.ordered() if spec.name in self.chains]
        return await self.signatures.verify_on_any(clients, address, digest, signature)
