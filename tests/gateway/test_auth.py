"""Wallet authentication (§3): every 401 cause, in the contract's order."""

from __future__ import annotations

import uuid

import httpx

from tests.gateway.conftest import Gateway, new_wallet


async def projects(gw: Gateway, headers: dict[str, str]) -> httpx.Response:
    return await gw.http.get("/agent/projects", headers=headers)


def code(response: httpx.Response) -> str:
    assert response.status_code == 401, response.text
    return str(response.json()["code"])


async def test_signed_request_is_accepted(gateway: Gateway) -> None:
    wallet = new_wallet()
    response = await projects(gateway, gateway.auth(wallet))
    assert response.status_code == 200
    assert response.json() == {"wallet": wallet.address, "count": 0, "projects": []}


async def test_missing_headers(gateway: Gateway) -> None:
    headers = gateway.auth(new_wallet())
    for name in list(headers):
        partial = {k: v for k, v in headers.items() if k != name}
        assert code(await projects(gateway, partial)) == "auth_missing"


async def test_malformed_headers(gateway: Gateway) -> None:
    wallet = new_wallet()
    good = gateway.auth(wallet)
    cases = [
        {"X-Wallet-Address": wallet.address[:-1]},
        {"X-Signature": good["X-Signature"][2:]},
        {"X-Signature": good["X-Signature"][:-2]},
        {"X-Signature": good["X-Signature"][:-2] + "05"},  # v must be 0, 1, 27 or 28
        {"X-Timestamp": "17e11"},
        {"X-Timestamp": "-1"},
        {"X-Nonce": "not-a-uuid"},
        {"X-Nonce": uuid.uuid4().hex},
    ]
    for change in cases:
        assert code(await projects(gateway, {**good, **change})) == "auth_malformed", change
    error = (await projects(gateway, {**good, "X-Nonce": "x"})).json()
    assert error == {"error": "Malformed authentication headers", "code": "auth_malformed"}


async def test_expired_timestamp_both_ways(gateway: Gateway) -> None:
    wallet = new_wallet()
    now = gateway.clock.now_ms()
    assert code(await projects(gateway, wallet.auth(now - 61_000))) == "auth_expired"
    assert code(await projects(gateway, wallet.auth(now + 61_000))) == "auth_expired"
    assert (await projects(gateway, wallet.auth(now - 50_000))).status_code == 200
    huge = {**gateway.auth(wallet), "X-Timestamp": "9" * 5000}
    assert code(await projects(gateway, huge)) == "auth_expired"


async def test_invalid_signature(gateway: Gateway) -> None:
    wallet, other = new_wallet(), new_wallet()
    forged = {**gateway.auth(other), "X-Wallet-Address": other.address}
    forged["X-Signature"] = wallet.auth(gateway.clock.now_ms(), nonce=forged["X-Nonce"])["X-Signature"]
    assert code(await projects(gateway, forged)) == "auth_invalid_signature"


async def test_address_is_signed_exactly_as_sent(gateway: Gateway) -> None:
    wallet = new_wallet()
    signed_checksummed = gateway.auth(wallet)
    sent_lowercase = {**signed_checksummed, "X-Wallet-Address": wallet.address.lower()}
    assert code(await projects(gateway, sent_lowercase)) == "auth_invalid_signature"
    lowercase_both = gateway.auth(wallet, address=wallet.address.lower())
    assert (await projects(gateway, lowercase_both)).status_code == 200


async def test_v_of_zero_or_one_is_accepted(gateway: Gateway) -> None:
    headers = gateway.auth(new_wallet())
    v = int(headers["X-Signature"][-2:], 16)
    headers["X-Signature"] = headers["X-Signature"][:-2] + f"{v - 27:02x}"
    assert (await projects(gateway, headers)).status_code == 200


async def test_nonce_is_single_use_and_forgeries_do_not_burn_it(gateway: Gateway) -> None:
    wallet, attacker = new_wallet(), new_wallet()
    headers = gateway.auth(wallet)
    forged = {
        **headers,
        "X-Signature": attacker.sign(f"{wallet.address}:{headers['X-Timestamp']}:{headers['X-Nonce']}"),
    }
    assert code(await projects(gateway, forged)) == "auth_invalid_signature"
    assert (await projects(gateway, headers)).status_code == 200
    replay = await projects(gateway, headers)
    assert replay.json() == {"error": "Nonce already used", "code": "auth_nonce_reused"}
    # the same nonce from another wallet is a different key
    assert (await projects(gateway, gateway.auth(new_wallet(), nonce=headers["X-Nonce"]))).status_code == 200


async def test_nonce_consumed_even_when_the_request_then_fails(gateway: Gateway) -> None:
    headers = gateway.auth(new_wallet())
    bad = await gateway.http.post(
        "/agent/deploy", content=b"{", headers={**headers, "Content-Type": "application/json"}
    )
    assert bad.status_code == 400
    again = await gateway.http.post(
        "/agent/deploy", content=b"{", headers={**headers, "Content-Type": "application/json"}
    )
    assert code(again) == "auth_nonce_reused"


async def test_unauthenticated_routes_need_no_signature(gateway: Gateway) -> None:
    for path in ("/health", "/agent/chains", "/agent/recipients", "/openapi.json"):
        assert (await gateway.http.get(path)).status_code == 200, path
