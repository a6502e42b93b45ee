"""x402's ``payment-identifier`` extension on real anvil chains: a paid deploy retried with the same id is
answered once, with the same result, and charged once — with coinbase's PyPI client (which signs afresh
on every retry) and with the very same payload sent again; the same id for another payment, or a
re-signed payment after a settlement that was sent but not yet mined, is refused and charges nothing."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from x402 import x402Client
from x402.extensions.payment_identifier import PAYMENT_IDENTIFIER, append_payment_identifier_to_extensions
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.schemas import PaymentPayload, PaymentRequired

from tests.gateway.conftest import RECIPIENT, Chain, Gateway, Wallet, new_wallet, static_site, unique_name
from tests.gateway.test_x402 import (
    PRICE_RAW,
    SETTLER,
    WalletAuth,
    credit_balance,
    decode,
    encode,
    nonce_of,
    offer_for,
    sign_authorization,
)
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]


class FixedPaymentId:
    """A coinbase client extension that puts one id into every payment it signs: the client's side of
    the extension ("reuses the same id on retries")."""

    key = PAYMENT_IDENTIFIER

    def __init__(self, payment_id: str) -> None:
        self.payment_id = payment_id

    def enrich_payment_payload(self, payload: PaymentPayload, required: PaymentRequired) -> PaymentPayload:
        extensions = dict(payload.extensions or {})
        append_payment_identifier_to_extensions(extensions, self.payment_id)
        return payload.model_copy(update={"extensions": extensions})


class LoseFirstPaidAnswerAndRetry(httpx.AsyncBaseTransport):
    """Below x402's transport: the first paid request reaches the gateway and is processed, its answer is
    lost on the way back, and this transport (as a retrying HTTP stack does) sends the same request again
    — the same ``PAYMENT-SIGNATURE``, fresh wallet auth from the transport below."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.sent: list[str] = []
        self.answers: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if "payment-signature" not in request.headers:
            return response
        self.sent.append(request.headers["payment-signature"])
        await response.aread()
        self.answers.append(response.status_code)
        if len(self.sent) == 1:  # lost: the client never sees it, and tries once more
            return await self.handle_async_request(request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def new_id() -> str:
    return "pay_" + os.urandom(16).hex()


def with_id(payload: dict[str, Any], payment_id: str) -> dict[str, Any]:
    return {**payload, "extensions": {PAYMENT_IDENTIFIER: {"info": {"required": False, "id": payment_id}}}}


async def test_the_402_declares_the_extension(x402_gateway: Gateway) -> None:
    response = await x402_gateway.deploy(new_wallet(), static_site(unique_name(), "x", port=free_port()))
    declared = decode(response.headers["PAYMENT-REQUIRED"])["extensions"][PAYMENT_IDENTIFIER]
    assert declared["info"] == {"required": False}
    assert declared["schema"]["properties"]["id"]["minLength"] == 16


async def paid_with_lost_answer(
    gw: Gateway, wallet: Wallet, body: dict[str, Any], payment_id: str | None
) -> tuple[httpx.Response, LoseFirstPaidAnswerAndRetry]:
    """Coinbase's client, unchanged, pays ``body`` on Base; the first paid answer is lost and retried."""
    client = x402Client().set_spend_controls({"max_amount_per_payment": "$5"})
    register_exact_evm_client(client, wallet.account, networks="eip155:8453")
    if payment_id is not None:
        client.register_extension(FixedPaymentId(payment_id))
    lossy = LoseFirstPaidAnswerAndRetry(WalletAuth(wallet, gw.clock))
    transport = x402AsyncTransport(client, transport=lossy)
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        return await http.post("/agent/deploy", json=body), lossy


async def test_without_an_id_the_retried_payment_is_only_refused(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """What the extension changes: without an id the retry of a processed payment is refused (its name
    is taken now, by its own first request), and the agent never learns its project."""
    base = devchains["base"]
    before = await base.token_balance("usdc", RECIPIENT)
    body = static_site(unique_name("noid"), "x", port=free_port())
    response, lossy = await paid_with_lost_answer(x402_gateway, paying_wallet, body, None)
    assert lossy.answers == [200, 400] and response.json()["code"] == "name_taken"
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW


async def test_a_retried_paid_deploy_with_the_same_id_is_answered_once_and_charged_once(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, base = x402_gateway, devchains["base"]
    body = static_site(unique_name("idem"), "<p>once</p>", port=free_port())
    payment_id = new_id()
    recipient_before = await base.token_balance("usdc", RECIPIENT)
    settler_nonce = await nonce_of(base, SETTLER)

    retried, lossy = await paid_with_lost_answer(gw, paying_wallet, body, payment_id)

    assert lossy.answers == [200, 200] and retried.status_code == 200, retried.text
    assert len(lossy.sent) == 2 and len(set(lossy.sent)) == 1  # the retry carried the same payment
    assert decode(lossy.sent[0])["extensions"][PAYMENT_IDENTIFIER]["info"]["id"] == payment_id
    [project] = (await gw.projects(paying_wallet))["projects"]
    assert retried.json()["projectId"] == project["id"]  # the first request's deploy, not a new one
    settled = decode(retried.headers["PAYMENT-RESPONSE"])
    assert settled["success"] is True
    assert await base.token_balance("usdc", RECIPIENT) == recipient_before + PRICE_RAW  # charged once
    assert await nonce_of(base, SETTLER) == settler_nonce + 1  # one settlement
    assert await credit_balance(gw, paying_wallet) == PRICE_RAW * 100

    # A retry that signed the same payment afresh (new nonce, as x402 clients do), same id: same answer.
    requirement = decode(lossy.sent[0])["accepted"]
    resigned = with_id(sign_authorization(paying_wallet, requirement, base.chain_id), payment_id)
    again = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": encode(resigned)})
    assert again.status_code == 200, again.text
    assert again.json() == retried.json()
    assert again.headers["PAYMENT-RESPONSE"] == retried.headers["PAYMENT-RESPONSE"]
    assert await base.token_balance("usdc", RECIPIENT) == recipient_before + PRICE_RAW
    assert await nonce_of(base, SETTLER) == settler_nonce + 1
    assert len((await gw.projects(paying_wallet))["projects"]) == 1

    # The same id for another payment (two months: another amount) is a conflict and charges nothing.
    longer = static_site(unique_name(), "x", port=free_port(), months=2)
    requirement = await offer_for(gw, paying_wallet, longer, "eip155:8453")
    assert requirement["amount"] != str(PRICE_RAW)
    other = with_id(sign_authorization(paying_wallet, requirement, base.chain_id), payment_id)
    conflict = await gw.deploy(paying_wallet, longer, **{"PAYMENT-SIGNATURE": encode(other)})
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["code"] == "payment_already_processed"
    assert conflict.json()["tx_hash"] == settled["transaction"]
    assert await base.token_balance("usdc", RECIPIENT) == recipient_before + PRICE_RAW
    assert await credit_balance(gw, paying_wallet) == PRICE_RAW * 100

    # Ids are per wallet: another wallet's payment under the same id is its own.
    stranger = new_wallet()
    await stranger.fund(base)
    body = static_site(unique_name(), "x", port=free_port())
    theirs = with_id(
        sign_authorization(stranger, await offer_for(gw, stranger, body, "eip155:8453"), base.chain_id),
        payment_id,
    )
    paid = await gw.deploy(stranger, body, **{"PAYMENT-SIGNATURE": encode(theirs)})
    assert paid.status_code == 200, paid.text
    assert paid.json()["projectId"] != retried.json()["projectId"]


async def test_a_malformed_id_is_a_400_naming_the_field(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw = x402_gateway
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await offer_for(gw, paying_wallet, body, "eip155:8453")
    payload = sign_authorization(paying_wallet, requirement, devchains["base"].chain_id)
    for bad in ("short", "x" * 129, "has spaces in it!!"):
        response = await gw.deploy(
            paying_wallet, body, **{"PAYMENT-SIGNATURE": encode(with_id(payload, bad))}
        )
        assert response.status_code == 400, response.text
        assert response.json()["field"] == f"extensions.{PAYMENT_IDENTIFIER}.info.id"
    assert await credit_balance(gw, paying_wallet) == 0


async def test_after_a_settlement_sent_but_not_mined_the_id_takes_no_second_payment(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    """The first request's settlement is sent but not mined in time (502 naming it). A re-signed retry
    under the same id is refused (409 naming that transaction) instead of taking a second payment; the
    very same payload waits for that transaction and is answered, and then every retry gets that answer."""
    gw, base = x402_gateway, devchains["base"]
    body = static_site(unique_name(), "x", port=free_port())
    requirement = await offer_for(gw, paying_wallet, body, "eip155:8453")
    payment_id = new_id()
    first = encode(with_id(sign_authorization(paying_wallet, requirement, base.chain_id), payment_id))
    resigned = encode(with_id(sign_authorization(paying_wallet, requirement, base.chain_id), payment_id))
    before = await base.token_balance("usdc", RECIPIENT)
    settler_nonce = await nonce_of(base, SETTLER)
    gw.services.settler.receipt_timeout_s = 0.5
    await base.set_automine(False)
    try:
        pending = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": first})
        assert pending.status_code == 502, pending.text
        tx_hash = pending.json()["tx_hash"]
        refused = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": resigned})
        assert refused.status_code == 409, refused.text
        assert refused.json()["tx_hash"] == tx_hash
        await base.mine()
    finally:
        await base.set_automine(True)
    resumed = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": first})
    assert resumed.status_code == 200, resumed.text
    assert decode(resumed.headers["PAYMENT-RESPONSE"])["transaction"] == tx_hash
    later = await gw.deploy(paying_wallet, body, **{"PAYMENT-SIGNATURE": resigned})
    assert later.status_code == 200 and later.json() == resumed.json()
    assert await base.token_balance("usdc", RECIPIENT) == before + PRICE_RAW
    assert await nonce_of(base, SETTLER) == settler_nonce + 1
    assert await credit_balance(gw, paying_wallet) == PRICE_RAW * 100
