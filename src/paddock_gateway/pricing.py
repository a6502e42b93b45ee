"""Pricing (§9.2): a pluggable monthly price source behind a 5-minute cache with a 30 s retry backoff.

``PricingSource`` returns the monthly price **in credits** of the fixed plan (1 replica, 512 MiB,
500 millicores). ``StaticPricing`` is the default (a configured USD price); ``HttpPricing`` asks an
upstream endpoint. ``PriceCache`` serves the last good value after a failed refresh and raises
``PricingUnavailable`` only when no price was ever obtained.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Protocol

import httpx

from paddock_core import tls
from paddock_core.logging import get_logger
from paddock_gateway.errors import PricingUnavailable

log = get_logger("paddock.gateway.pricing")
MICRO = Decimal("0.000001")


class PricingError(Exception):
    """The upstream price could not be obtained or understood."""


class PricingSource(Protocol):
    async def monthly_credits(self) -> Decimal: ...


class StaticPricing:
    def __init__(self, monthly_usd: Decimal, credits_per_usd: int = 100) -> None:
        self.credits = Decimal(monthly_usd) * credits_per_usd

    async def monthly_credits(self) -> Decimal:
        return self.credits


class HttpPricing:
    """GET ``url`` → ``{"<field>": <credits per month>}``."""

    def __init__(self, url: str, field: str = "credits", timeout_s: float = 5.0) -> None:
        self.url = url
        self.field = field
        self.timeout_s = timeout_s

    async def monthly_credits(self) -> Decimal:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, verify=tls.client_context()) as http:
                response = await http.get(self.url)
                response.raise_for_status()
                value = Decimal(str(response.json()[self.field]))
        except (httpx.HTTPError, ValueError, KeyError, TypeError, InvalidOperation) as exc:
            raise PricingError(f"pricing lookup failed: {type(exc).__name__}") from exc
        if not value.is_finite() or value < 0:
            raise PricingError("pricing lookup returned a negative or non-finite price")
        return value


@dataclass(frozen=True)
class Price:
    """The price of one request: ``amount_raw`` is ``amount_usd`` in 10^-6 USD (= raw token units)."""

    monthly_raw: int
    months: int
    amount_raw: int

    @property
    def amount_usd(self) -> Decimal:
        return Decimal(self.amount_raw) * MICRO

    @property
    def amount_token(self) -> str:
        return str(self.amount_raw)


def price_for(monthly_credits: Decimal, months: int, *, floor_usd: Decimal, credits_per_usd: int) -> Price:
    """``monthly_usd = max(credits / 100, floor)``; ``amount_usd = monthly_usd × months`` rounded up to 6 dp."""
    monthly_usd = max(monthly_credits / credits_per_usd, floor_usd)
    monthly_raw = int((monthly_usd / MICRO).to_integral_value(rounding=ROUND_CEILING))
    amount = (monthly_usd * months).quantize(MICRO, rounding=ROUND_CEILING)
    return Price(monthly_raw=monthly_raw, months=months, amount_raw=int(amount / MICRO))


class PriceCache:
    def __init__(
        self,
        source: PricingSource,
        *,
        ttl_s: float = 300.0,
        backoff_s: float = 30.0,
        floor_usd: Decimal = Decimal("0.50"),
        credits_per_usd: int = 100,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.ttl_s = ttl_s
        self.backoff_s = backoff_s
        self.floor_usd = floor_usd
        self.credits_per_usd = credits_per_usd
        self.monotonic = monotonic
        self.value: Decimal | None = None
        self.fetched_at = -1e18
        self.failed_at = -1e18
        self.lock = asyncio.Lock()

    def fresh(self) -> bool:
        return self.value is not None and self.monotonic() - self.fetched_at < self.ttl_s

    async def monthly_credits(self) -> Decimal:
        if self.fresh():
            assert self.value is not None
            return self.value
        async with self.lock:
            now = self.monotonic()
            if not self.fresh() and now - self.failed_at >= self.backoff_s:
                try:
                    self.value = await self.source.monthly_credits()
                    self.fetched_at = self.monotonic()
                except PricingError as exc:
                    self.failed_at = self.monotonic()
                    log.warning("pricing_refresh_failed", error=str(exc), stale=self.value is not None)
        if self.value is None:
            raise PricingUnavailable()
        return self.value

    async def price(self, months: int) -> Price:
        credits = await self.monthly_credits()
        return price_for(credits, months, floor_usd=self.floor_usd, credits_per_usd=self.credits_per_usd)
