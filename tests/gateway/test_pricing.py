"""Pricing (§9.2): the arithmetic, the 5-minute cache, the 30 s backoff, the upstream source."""

from __future__ import annotations

import json
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from paddock_gateway.errors import PricingUnavailable
from paddock_gateway.pricing import HttpPricing, PriceCache, PricingError, StaticPricing, price_for


def test_price_arithmetic() -> None:
    example = price_for(Decimal("181.3947"), 1, floor_usd=Decimal("0.50"), credits_per_usd=100)
    assert (example.amount_usd, example.amount_token) == (Decimal("1.813947"), "1813947")
    floor = price_for(Decimal("10"), 3, floor_usd=Decimal("0.50"), credits_per_usd=100)
    assert floor.amount_token == "1500000"  # 0.10/month is raised to the 0.50 floor, per month
    rounded = price_for(Decimal("0.00000001") + 100, 7, floor_usd=Decimal("0.50"), credits_per_usd=100)
    assert rounded.amount_token == "7000001"  # rounded up to 6 decimals


class FlakySource:
    def __init__(self) -> None:
        self.values: list[Decimal | Exception] = []
        self.calls = 0

    async def monthly_credits(self) -> Decimal:
        self.calls += 1
        value = self.values.pop(0)
        if isinstance(value, Exception):
            raise value
        return value


async def test_cache_ttl_backoff_and_stale_value() -> None:
    now = [0.0]
    source = FlakySource()
    cache = PriceCache(source, monotonic=lambda: now[0])

    source.values = [PricingError("down")]
    with pytest.raises(PricingUnavailable):
        await cache.price(1)
    now[0] = 10
    with pytest.raises(PricingUnavailable):
        await cache.price(1)  # within the 30 s backoff: no new attempt
    assert source.calls == 1

    now[0] = 31
    source.values = [Decimal("200")]
    assert (await cache.price(1)).amount_token == "2000000"
    now[0] = 300
    assert (await cache.price(1)).amount_token == "2000000" and source.calls == 2  # cached for 5 minutes

    now[0] = 332
    source.values = [PricingError("down again")]
    assert (await cache.price(2)).amount_token == "4000000"  # stale value served after a failed refresh
    now[0] = 350
    assert (await cache.price(1)).amount_token == "2000000" and source.calls == 3  # backoff again
    now[0] = 363
    source.values = [Decimal("300")]
    assert (await cache.price(1)).amount_token == "3000000"


async def test_static_source() -> None:
    assert await StaticPricing(Decimal("1.813947")).monthly_credits() == Decimal("181.3947")


@pytest.fixture
def pricing_server() -> tuple[str, list[object]]:
    answers: list[object] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(answers.pop(0)).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/price", answers
    server.shutdown()


async def test_http_source(pricing_server: tuple[str, list[object]]) -> None:
    url, answers = pricing_server
    answers.extend([{"credits": 181.3947}, {"nope": 1}, {"credits": -5}])
    source = HttpPricing(url)
    assert await source.monthly_credits() == Decimal("181.3947")
    for _ in range(2):
        with pytest.raises(PricingError):
            await source.monthly_credits()
