"""x402 v2 (Appendix B) against real anvil chains: the PAYMENT-REQUIRED offer, PAYMENT-SIGNATURE paid
and settled by the gateway's own key, every rejection, and one authorization settled once however often
it is sent. The payer here signs with eth-account's own EIP-712 code (independent of the gateway's), and
the PyPI ``x402`` client pays unchanged."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_utils.crypto import keccak
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact.register import register_exact_evm_client

from paddock import eip3009
from paddock_gateway import credits, devchain
from paddock_gateway.settings import GatewaySettings
from tests.gateway.conftest import (
    RECIPIENT,
    Chain,
    Clock,
    Gateway,
    Wallet,
    new_wallet,
    rpc,
    running_gateway,
    static_site,
    unique_name,
    x402_settings,
)
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]

PRICE_RAW = 1_813_947
SETTLER = devchain.SETTLEMENT_ADDRESS
TRANSFER_WITH_AUTHORIZATION = keccak(
    text="transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)"
)[:4].hex()


def decode(value: str) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(value, validate=True)))


def encode(value: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(value).encode()).decode()


def sign_authorization(
    wallet: Wallet,
    requirement: dict[str, Any],
    chain_id: int,
    *,
    to: str | None = None,
    value: int | None = None,
    valid_after: int = 0,
    valid_before: int | None = None,
    nonce: str | None = None,
    signer: Wallet | None = None,
) -> dict[str, Any]:
    """A ``PaymentPayload`` for ``requirement``, signed with eth-account's EIP-712 implementation."""
    typed = eip3009.transfer_with_authorization(
        name=requirement["extra"]["name"],
        version=requirement["extra"]["version"],
        chain_id=chain_id,
        verifying_contract=requirement["asset"],
        sender=wallet.address,
        to=to or requirement["payTo"],
        value=int(requirement["amount"]) if value is None else value,
        valid_after=valid_after,
        valid_before=valid_before if valid_before is not None else int(time.time()) + 300,
        nonce=bytes.fromhex((nonce or "0x" + os.urandom(32).hex())[2:]),
    )
    message = typed["message"]
    signature = (signer or wallet).account.sign_typed_data(full_message=typed).signature
    return {
        "x402Version": 2,
        "accepted": requirement,
        "payload": {
            "signature": "0x" + bytes(signature).hex(),
            "authorization": {
                **{k: str(v) for k, v in message.items() if k != "nonce"},
                "nonce": "0x" + message["nonce"].hex(),
            },
        },
    }


async def offer_for(gw: Gateway, wallet: Wallet, body: dict[str, Any], network: str) -> dict[str, Any]:
    quote = await gw.deploy(wallet, body)
    assert quote.status_code == 402, quote.text
    offered = decode(quote.headers["PAYMENT-REQUIRED"])
    return next(item for item in offered["accepts"] if item["network"] == network)


async def credit_balance(gw: Gateway, wallet: Wallet) -> int:
    async with gw.services.sessions() as session:
        return await credits.balance_micro(session, wallet.address.lower())


async def nonce_of(chain: Chain, address: str) -> int:
    return int(await rpc(chain.rpc_url, "eth_getTransactionCount", [address, "latest"]), 16)


async def eth_balance(chain: Chain, address: str) -> int:
    return int(await rpc(chain.rpc_url, "eth_getBalance", [address, "latest"]), 16)


async def test_the_quote_offers_every_scheme_per_token_in_payment_required(
    x402_gateway: Gateway, devchains: dict[str, Chain]
) -> None:
    """EIP-3009 for USDC on both chains first (the two offers the gateway made before Permit2, unchanged
    and in the same places), then Permit2 for USDC and USDT on both chains, then ``upto`` (by Permit2)
    for USDC on both chains, for the months asked and settled by the gateway's key."""
    response = await x402_gateway.deploy(new_wallet(), static_site(unique_name(), "x", port=free_port()))
    assert response.status_code == 402
    assert response.json()["amount_token"] == str(PRICE_RAW)  # the JSON quote is unchanged
    exposed = {h.strip().upper() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"PAYMENT-REQUIRED", "PAYMENT-RESPONSE"} <= exposed
    required = decode(response.headers["PAYMENT-REQUIRED"])
    assert required["x402Version"] == 2
    assert required["resource"]["url"] == "https://gateway.example/agent/deploy"

    def offer(chain: str, token: str, extra: dict[str, str]) -> dict[str, Any]:
        return {
            "scheme": "exact",
            "network": f"eip155:{devchains[chain].chain_id}",
            "amount": str(PRICE_RAW),
            "asset": devchains[chain].tokens[token],
            "payTo": RECIPIENT,
            "maxTimeoutSeconds": 300,
            "extra": extra,
        }

    eip3009 = {"name": "USD Coin", "version": "2", "assetTransferMethod": "eip3009"}
    permit2 = {"assetTransferMethod": "permit2"}
    assert required["accepts"] == [
        offer("base", "usdc", eip3009),
        offer("arbitrum", "usdc", eip3009),
        offer("base", "usdc", permit2),
        offer("base", "usdt", permit2),
        offer("arbitrum", "usdc", permit2),
        offer("arbitrum", "usdt", permit2),
        *(
            {
                **offer(chain, "usdc", {"assetTransferMethod": "permit2", "facilitatorAddress": SETTLER}),
                "scheme": "upto",
                # the permit must outlast the month asked (730 h) by the settlement window (900 s)
                "maxTimeoutSeconds": 730 * 3600 + 900,
            }
            for chain in ("base", "arbitrum")
        ),
    ]
    assert devchains["base"].chain_id == 8453 and devchains["arbitrum"].chain_id == 42161


async def test_no_settlement_key_means_no_x402_offer(chain_gateway: Gateway) -> None:
    response = await chain_gateway.deploy(new_wallet(), static_site(unique_name(), "x", port=free_port()))
    assert response.status_code == 402 and "PAYMENT-REQUIRED" not in response.headers


class WalletAuth(httpx.AsyncBaseTransport):
    """Signs every request afresh (the gateway's EIP-191 auth, one nonce per request). The x402 transport
    wraps this one, so its paying retry carries new auth headers and the x402 client stays unchanged."""

    def __init__(self, wallet: Wallet, clock: Clock) -> None:
        self.wallet, self.clock = wallet, clock
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers.update(self.wallet.auth(self.clock.now_ms()))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_pypi_x402_client_pays_a_deploy_end_to_end(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, base = x402_gateway, devchains["base"]
    port = free_port()
    body = static_site(unique_name("x402"), "<h1>paid by signature</h1>", port=port)
    recipient_before = await base.token_balance("usdc", RECIPIENT)
    payer_tokens_before = await base.token_balance("usdc", paying_wallet.address)
    payer_eth_before = await eth_balance(base, paying_wallet.address)
    settler_nonce_before = await nonce_of(base, SETTLER)

    client = x402Client().set_spend_controls({"max_amount_per_payment": "$5"})  # its default cap is $1
    register_exact_evm_client(client, paying_wallet.account, networks="eip155:8453")
    transport = x402AsyncTransport(client, transport=WalletAuth(paying_wallet, gw.clock))
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        response = await http.post("/agent/deploy", json=body)

    assert response.status_code == 200, response.text
    accepted = response.json()
    assert accepted["status"] == "deploying"
    settled = decode(response.headers["PAYMENT-RESPONSE"])
    assert settled["success"] is True and settled["network"] == "eip155:8453"
    assert settled["payer"] == paying_wallet.address
    receipt = await base.receipt(settled["transaction"])
    assert receipt is not None and receipt["status"] == "0x1"
    assert receipt["from"].lower() == SETTLER.lower()  # the gateway's key sent it, and paid its gas

    assert await base.token_balance("usdc", RECIPIENT) == recipient_before + PRICE_RAW
    assert await base.token_balance("usdc", paying_wallet.address) == payer_tokens_before - PRICE_RAW
    assert await eth_balance(base, paying_wallet.address) == payer_eth_before  # no gas spent
    assert await nonce_of(base, paying_wallet.address) == 0  # the payer never sent a transaction
    assert await nonce_of(base, SETTLER) == settler_nonce_before + 1

    final = await gw.wait_terminal(paying_wallet, accepted["projectId"], accepted["deploymentId"])
    assert final["status"] == "ready", final
    async with httpx.AsyncClient() as http:
        page = await http.get(final["endpoint"] + "/index.html")
    assert "paid by signature" in page.text

    # The settlement is an ordinary Transfer from the payer: the shared ledger credits it once only.
    again = await gw.deploy(
        paying_wallet,
        static_site(unique_name(), "x", port=free_port()),
        **{"X-Payment-Tx": settled["transaction"]},
    )
    assert again.status_code == 409


async def test_the_same_authorization_twice_settles_once(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, base = x402_gateway, devchains["base"]
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await offer_for(gw, paying_wallet, body, "eip155:8453")
    header = encode(sign_authorization(paying_wallet, requirement, base.chain_id))
    before = await base.token_balance("usdc", RECIPIENT)

    first = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": header})
    assert first.status_code == 200, first.text
    tx_hash = decode(first.headers["PAYMENT-RESPONSE"])["transaction"]
    second = await gw.deploy(
        paying_wallet, static_site(unique_name(), "x", port=free_port()), **{"PAYMENT-SIGNATURE": header}
    )
    assert second.status_code == 409
    assert second.json() == {
        "error": "Payment already processed",
        "code": "payment_already_processed",
        "tx_hash": tx_hash,
    }
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert await credit_balance(gw, paying_wallet) <= PRICE_RAW * 100  # credited once, not twice


@pytest.mark.db
async def test_twenty_concurrent_requests_with_one_authorization_settle_exactly_once(
    tmp_path: Path, database_url: str, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """On SQLite and on PostgreSQL: the claim's primary key decides, not timing."""
    arbitrum = devchains["arbitrum"]
    settings = x402_settings(tmp_path, devchains).model_copy(update={"database_url": database_url})
    async with running_gateway(settings, tmp_path, chains=devchains) as gw:
        body = static_site(unique_name(), "x", port=free_port())
        requirement = await offer_for(gw, paying_wallet, body, "eip155:42161")
        header = encode(sign_authorization(paying_wallet, requirement, arbitrum.chain_id))
        before = await arbitrum.token_balance("usdc", RECIPIENT)
        settler_nonce = await nonce_of(arbitrum, SETTLER)

        bodies = [static_site(unique_name(), "x", port=free_port()) for _ in range(20)]
        responses = await asyncio.gather(
            *(gw.deploy(paying_wallet, each, **{"PAYMENT-SIGNATURE": header}) for each in bodies)
        )
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200] + [409] * 19, [r.text for r in responses if r.status_code not in (200, 409)]
        assert await arbitrum.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
        assert await nonce_of(arbitrum, SETTLER) == settler_nonce + 1  # one settlement transaction
        assert await credit_balance(gw, paying_wallet) <= PRICE_RAW * 100  # one top-up


async def rejected(gw: Gateway, wallet: Wallet, body: dict[str, Any], payload: dict[str, Any]) -> str:
    """The x402 reason of a 402, after checking that nothing was credited and nothing deployed."""
    response = await gw.deploy(wallet, body, **{"PAYMENT-SIGNATURE": encode(payload)})
    assert response.status_code == 402, response.text
    error = response.json()
    assert error["code"] == "payment_verification_failed"
    settled = decode(response.headers["PAYMENT-RESPONSE"])
    assert settled["success"] is False and settled["transaction"] == ""
    assert settled["errorReason"] == error["reason"]
    assert await credit_balance(gw, wallet) == 0
    return str(error["reason"])


async def test_every_rejection_is_a_402_with_the_x402_reason_and_credits_nothing(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, base = x402_gateway, devchains["base"]
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await offer_for(gw, paying_wallet, body, "eip155:8453")
    recipient_before = await base.token_balance("usdc", RECIPIENT)
    now = int(time.time())

    def signed(**kwargs: Any) -> dict[str, Any]:
        return sign_authorization(paying_wallet, requirement, base.chain_id, **kwargs)

    async def reason(payload: dict[str, Any], wallet: Wallet = paying_wallet) -> str:
        return await rejected(gw, wallet, body, payload)

    assert await reason(signed(signer=new_wallet())) == "invalid_exact_evm_payload_signature"
    tampered = signed()
    tampered["payload"]["authorization"]["value"] = str(PRICE_RAW * 2)
    assert await reason(tampered) == "invalid_exact_evm_payload_signature"
    assert (
        await reason(signed(valid_before=now - 1)) == "invalid_exact_evm_payload_authorization_valid_before"
    )
    assert (
        await reason(signed(valid_after=now + 600)) == "invalid_exact_evm_payload_authorization_valid_after"
    )
    other = new_wallet().address
    assert await reason(signed(to=other)) == "invalid_exact_evm_payload_recipient_mismatch"
    assert (
        await reason(signed(value=PRICE_RAW - 1)) == "invalid_exact_evm_payload_authorization_value_mismatch"
    )
    # The gateway offers upto too, by Permit2 only: an EIP-3009 payload under it is x402's wrong payload type.
    assert (
        await reason({**signed(), "accepted": {**requirement, "scheme": "upto"}})
        == "unsupported_payload_type"
    )
    assert await reason({**signed(), "accepted": {**requirement, "scheme": "nope"}}) == "unsupported_scheme"
    assert (
        await reason({**signed(), "accepted": {**requirement, "network": "eip155:1"}}) == "network_mismatch"
    )
    # Signed by its own key, but for another wallet than the request's authenticated one.
    stranger = new_wallet()
    assert await reason(sign_authorization(stranger, requirement, base.chain_id)) == "sender_mismatch"
    # A wallet that holds no USDC.
    broke = new_wallet()
    payload = sign_authorization(broke, requirement, base.chain_id)
    assert await reason(payload, broke) == "invalid_exact_evm_insufficient_balance"

    # A nonce already used on chain (here: the payer's authorization settled by someone else first).
    nonce = "0x" + os.urandom(32).hex()
    used = signed(nonce=nonce)
    auth, sig = used["payload"]["authorization"], bytes.fromhex(used["payload"]["signature"][2:])
    outsider = new_wallet()
    await rpc(base.rpc_url, "anvil_setBalance", [outsider.address, hex(10**18)])
    call = (
        "0x"
        + TRANSFER_WITH_AUTHORIZATION
        + "".join(
            word.rjust(64, "0")
            for word in (
                auth["from"][2:].lower(),
                auth["to"][2:].lower(),
                f"{int(auth['value']):x}",
                f"{int(auth['validAfter']):x}",
                f"{int(auth['validBefore']):x}",
                nonce[2:],
                f"{sig[64]:x}",
                sig[:32].hex(),
                sig[32:64].hex(),
            )
        )
    )
    tx = await outsider.send(base, requirement["asset"], call)
    assert (await base.mined(tx))["status"] == "0x1"
    recipient_before += PRICE_RAW
    assert await reason(used) == "invalid_exact_evm_nonce_already_used"

    assert await base.token_balance("usdc", RECIPIENT) == recipient_before  # nothing else moved


async def test_malformed_and_mixed_headers_are_400_naming_the_field(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw = x402_gateway
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await offer_for(gw, paying_wallet, body, "eip155:8453")
    good = sign_authorization(paying_wallet, requirement, devchains["base"].chain_id)

    async def error(value: str, **extra: str) -> dict[str, Any]:
        response = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": value}, **extra)
        assert response.status_code == 400, response.text
        return dict(response.json())

    assert (await error("not base64!"))["field"] == "header"
    assert (await error(base64.b64encode(b"[1]").decode()))["field"] == "header"
    assert (await error(encode({**good, "x402Version": 1})))["field"] == "x402Version"
    broken = json.loads(json.dumps(good))
    broken["payload"]["authorization"]["nonce"] = "0x1234"
    wrong = await error(encode(broken))
    assert wrong["code"] == "invalid_payment_signature"
    assert wrong["field"] == "payload.authorization.nonce"
    assert "payload.authorization.nonce" in wrong["error"]
    del broken["payload"]["signature"]
    assert (await error(encode(broken)))["field"] == "payload.signature"
    mixed = await error(encode(good), **{"X-Payment-Tx": "0x" + "ab" * 32})
    assert mixed["code"] == "mixed_payment_methods"
    assert await credit_balance(gw, paying_wallet) == 0


async def test_a_failed_settlement_credits_nothing_and_the_authorization_can_be_retried(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, base = x402_gateway, devchains["base"]
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await offer_for(gw, paying_wallet, body, "eip155:8453")
    header = encode(sign_authorization(paying_wallet, requirement, base.chain_id))
    recipient_before = await base.token_balance("usdc", RECIPIENT)
    gas = await eth_balance(base, SETTLER)
    await rpc(base.rpc_url, "anvil_setBalance", [SETTLER, "0x0"])  # the settlement key cannot pay gas
    try:
        failed = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": header})
    finally:
        await rpc(base.rpc_url, "anvil_setBalance", [SETTLER, hex(gas)])
    assert failed.status_code == 502, failed.text
    assert failed.json()["error"] == "the base RPC did not accept the settlement transaction"
    assert "private" not in failed.text.lower() and devchain.SETTLEMENT_PRIVATE_KEY[2:] not in failed.text
    assert await credit_balance(gw, paying_wallet) == 0
    assert await base.token_balance("usdc", RECIPIENT) == recipient_before

    retried = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": header})
    assert retried.status_code == 200, retried.text
    assert await base.token_balance("usdc", RECIPIENT) == recipient_before + PRICE_RAW


def test_the_settlement_key_never_shows_in_settings_output() -> None:
    settings = GatewaySettings(recipient=RECIPIENT, settlement_private_key=devchain.SETTLEMENT_PRIVATE_KEY)
    assert devchain.SETTLEMENT_PRIVATE_KEY[2:] not in repr(settings) + str(settings.model_dump())
    with pytest.raises(ValueError) as raised:
        GatewaySettings(recipient=RECIPIENT, settlement_private_key="0x" + "zz" * 32)
    assert "zz" * 32 not in str(raised.value)


def test_account_helper_matches_the_devchain_settlement_address() -> None:
    assert Account.from_key(devchain.SETTLEMENT_PRIVATE_KEY).address == SETTLER


async def test_a_settlement_not_mined_in_time_is_awaited_by_the_retry_and_credited_once(
    x402_gateway: Gateway,
    paying_wallet: Wallet,
    devchains: dict[str, Chain],
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The gateway sends the settlement but the chain does not mine it in time: 502 naming the hash,
    nothing credited. The same authorization sent again waits for that same transaction (no second
    one), and once it is mined the deploy goes on and the payment is credited exactly once."""
    gw, base = x402_gateway, devchains["base"]
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await offer_for(gw, paying_wallet, body, "eip155:8453")
    header = encode(sign_authorization(paying_wallet, requirement, base.chain_id))
    before = await base.token_balance("usdc", RECIPIENT)
    settler_nonce = await nonce_of(base, SETTLER)
    gw.services.settler.receipt_timeout_s = 0.5
    await base.set_automine(False)
    try:
        pending = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": header})
        assert pending.status_code == 502, pending.text
        tx_hash = pending.json()["tx_hash"]
        assert await credit_balance(gw, paying_wallet) == 0
        still = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": header})
        assert still.status_code == 502 and still.json()["tx_hash"] == tx_hash  # the same one, not resent
        await base.mine()
    finally:
        await base.set_automine(True)
    resumed = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": header})
    assert resumed.status_code == 200, resumed.text
    assert decode(resumed.headers["PAYMENT-RESPONSE"])["transaction"] == tx_hash
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert await nonce_of(base, SETTLER) == settler_nonce + 1
    again = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": header})
    assert again.status_code in (400, 409)  # the name is now taken, and the authorization is spent
    logged = capfd.readouterr()
    assert devchain.SETTLEMENT_PRIVATE_KEY[2:].lower() not in (logged.out + logged.err).lower()
