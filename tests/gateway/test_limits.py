"""The rate limit (§4) and the body cap (§2.5)."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.conftest import Gateway, gateway_settings, new_wallet, running_gateway


async def test_31st_request_in_a_minute_is_429(gateway: Gateway) -> None:
    wallet = new_wallet()
    for i in range(30):
        response = await gateway.http.get("/agent/projects", headers=gateway.auth(wallet))
        assert response.status_code == 200, (i, response.text)
    limited = await gateway.http.get("/agent/projects", headers=gateway.auth(wallet))
    assert limited.status_code == 429
    assert limited.json() == {"error": "Too many requests", "code": "rate_limited"}
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    # the limit is per (IP, wallet): another wallet header, and the unlimited routes, still pass
    assert (await gateway.http.get("/agent/chains", headers={"X-Wallet-Address": "0xabc"})).status_code == 200
    assert (await gateway.http.get("/health")).status_code == 200
    unauthenticated_same_wallet = await gateway.http.get(
        "/agent/chains", headers={"X-Wallet-Address": wallet.address.lower()}
    )
    assert unauthenticated_same_wallet.status_code == 429  # the key is the lowercased raw header


async def test_rate_limit_comes_before_authentication(gateway: Gateway) -> None:
    for _ in range(30):
        assert (await gateway.http.get("/agent/projects")).status_code == 401
    assert (await gateway.http.get("/agent/projects")).status_code == 429


async def test_trusted_proxy_forwarded_for(tmp_path: Path) -> None:
    settings = gateway_settings(tmp_path, trusted_proxies=["127.0.0.1/32"], rate_limit_requests=2)
    async with running_gateway(settings, tmp_path) as gw:
        for client in ("203.0.113.7", "203.0.113.8"):
            headers = {"X-Forwarded-For": f"198.51.100.1, {client}"}
            assert [(await gw.http.get("/agent/chains", headers=headers)).status_code for _ in range(3)] == [
                200,
                200,
                429,
            ]


async def test_oversized_body_is_413_before_auth(tmp_path: Path) -> None:
    async with running_gateway(gateway_settings(tmp_path, max_body_bytes=1024), tmp_path) as gw:
        too_big = await gw.http.post(
            "/agent/deploy", content=b"x" * 1025, headers={"Content-Type": "application/json"}
        )
        assert too_big.status_code == 413 and too_big.json()["code"] == "request_too_large"

        async def chunks():  # no Content-Length: read up to the cap, no further
            for _ in range(8):
                yield b"y" * 512

        chunked = await gw.http.post(
            "/agent/deploy", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert chunked.status_code == 413
        small = await gw.http.post(
            "/agent/deploy", content=b"{}", headers={"Content-Type": "application/json"}
        )
        assert small.status_code == 401


def test_default_cap_is_50_mib(tmp_path: Path) -> None:
    assert gateway_settings(tmp_path).max_body_bytes == 50 * 1024 * 1024
