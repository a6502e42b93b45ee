"""The §4 rate limit: 30 requests in any sliding 60 s window per (client IP, raw wallet header).

Backed by the ``limits`` library's moving-window strategy in process memory. The client IP is the
socket peer, or — when the peer is a trusted proxy — the right-most ``X-Forwarded-For`` entry that is
not itself a trusted proxy.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Iterable

from limits import RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from paddock_gateway.errors import RateLimited


class RateLimiter:
    def __init__(self, requests: int, window_s: int, trusted_proxies: Iterable[str] = ()) -> None:
        self.item = RateLimitItemPerSecond(requests, window_s)
        self.limiter = MovingWindowRateLimiter(MemoryStorage())
        self.trusted = [ipaddress.ip_network(entry, strict=False) for entry in trusted_proxies]

    def is_trusted(self, ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(address in network for network in self.trusted)

    def client_ip(self, peer: str, forwarded_for: str | None) -> str:
        if not forwarded_for or not self.is_trusted(peer):
            return peer
        for entry in reversed([part.strip() for part in forwarded_for.split(",") if part.strip()]):
            if not self.is_trusted(entry):
                return entry
        return peer

    async def check(self, client_ip: str, wallet_header: str | None) -> None:
        """Count one request; raise ``RateLimited`` with the seconds until a slot frees when over."""
        key = f"{client_ip}|{(wallet_header or '').lower()}"
        if await self.limiter.hit(self.item, "gateway", key):
            return
        stats = await self.limiter.get_window_stats(self.item, "gateway", key)
        raise RateLimited(retry_after_s=math.ceil(max(0.0, stats.reset_time - time.time())))
