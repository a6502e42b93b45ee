"""x402's ``sign-in-with-x`` against a live gateway on anvil: a wallet that paid a deploy (coinbase's client,
EIP-3009) lists, reads the status of, extends (paying again by x402) and deletes its project with SIWx
proofs instead of the seed's headers. The challenge is parsed with x402's own models, the header encoded with x402's
``encode_siwx_header`` and signed with its ``sign_evm_message``. The EIP-4361 message is laid out here,
from the EIP's text, independently of the gateway: x402 formats it with the ``signinwithethereum``
package, whose web3 < 8 pin the project cannot install. Refusals carry x402's reasons: another domain, an
old ``issuedAt``, a used nonce, another signer, an unsupported chain, a wallet that never paid."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402 import x402Client
from x402.extensions.sign_in_with_x import (
    SIGN_IN_WITH_X,
    SIWxExtension,
    SIWxPayload,
    assert_siwx_challenge_bound_to_origin,
    encode_siwx_header,
    parse_siwx_header,
    sign_evm_message,
)
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.schemas import PaymentRequired

from tests.gateway.conftest import RECIPIENT, Chain, Gateway, Wallet, new_wallet, static_site, unique_name
from tests.gateway.test_x402 import PRICE_RAW, WalletAuth, credit_balance, decode
from tests.gateway.test_x402_permit2 import Recording
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]

ORIGIN = "https://gateway.example"  # x402_settings' public URL


def eip4361(fields: dict[str, Any], address: str) -> str:
    """EIP-4361's message, from its ABNF: header, address, blank line, [statement, blank line], fields."""
    chain_id = fields["chainId"].removeprefix("eip155:")
    lines = [
        f"{fields['domain']} wants you to sign in with your Ethereum account:",
        address,
        "",
        *([fields["statement"], ""] if fields.get("statement") else [""]),
        f"URI: {fields['uri']}",
        f"Version: {fields['version']}",
        f"Chain ID: {chain_id}",
        f"Nonce: {fields['nonce']}",
        f"Issued At: {fields['issuedAt']}",
    ]
    for key, label in (
        ("expirationTime", "Expiration Time"),
        ("notBefore", "Not Before"),
        ("requestId", "Request ID"),
    ):
        if fields.get(key):
            lines.append(f"{label}: {fields[key]}")
    if fields.get("resources"):
        lines += ["Resources:", *(f"- {resource}" for resource in fields["resources"])]
    return "\n".join(lines)


async def challenge(gw: Gateway, path: str = "/agent/projects", method: str = "GET") -> SIWxExtension:
    """A route's 401 without credentials carries the SIWx challenge; x402's model parses it."""
    response = await gw.http.request(method, path)
    assert response.status_code == 401
    body = response.json()
    assert body["code"] == "auth_missing"
    return SIWxExtension.model_validate(body["extensions"][SIGN_IN_WITH_X])


async def proof(
    gw: Gateway,
    account: LocalAccount,
    *,
    path: str = "/agent/projects",
    method: str = "GET",
    signer: Any = None,
    address: str | None = None,
    **override: Any,
) -> str:
    """A ``SIGN-IN-WITH-X`` header as x402's client makes one: the challenge's info with the first
    supported chain, checked against the origin, signed by ``signer`` (default the account); ``override``
    changes fields after x402's check, to make bad proofs."""
    declared = await challenge(gw, path, method)
    chain = declared.supported_chains[0]
    info = {
        **declared.info.model_dump(by_alias=True, exclude_none=True),
        "chainId": chain.chain_id,
        "type": chain.type,
    }
    assert_siwx_challenge_bound_to_origin(info, ORIGIN + path)  # x402's client check of the challenge
    info.update(override)  # a bad proof is made past that check, as an attacker's client would
    address = address or account.address
    signature = await sign_evm_message(eip4361(info, address), signer or account)
    payload = SIWxPayload.model_validate({**info, "address": address, "signature": signature})
    header = encode_siwx_header(payload)
    assert parse_siwx_header(header).nonce == info["nonce"]
    return header


async def pay_a_deploy(gw: Gateway, wallet: Wallet) -> dict[str, Any]:
    client = x402Client().set_spend_controls({"max_amount_per_payment": "$5"})
    register_exact_evm_client(client, wallet.account, networks="eip155:8453")
    transport = x402AsyncTransport(client, transport=WalletAuth(wallet, gw.clock))
    body = static_site(unique_name("siwx"), "<h1>paid, then managed by SIWx</h1>", port=free_port())
    async with httpx.AsyncClient(base_url=gw.url, transport=transport, timeout=60) as http:
        response = await http.post("/agent/deploy", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def refused(response: httpx.Response) -> str:
    assert response.status_code == 401, response.text
    body = response.json()
    assert body["code"] == "auth_siwx_rejected" and body["error"] == "Sign-in-with-x proof rejected"
    return str(body["reason"])


async def test_a_payer_lists_reads_and_deletes_its_projects_with_siwx(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, account = x402_gateway, paying_wallet.account
    quote = await gw.deploy(paying_wallet, static_site(unique_name(), "x", port=free_port()))
    required = PaymentRequired.model_validate(decode(quote.headers["PAYMENT-REQUIRED"]))
    declared = SIWxExtension.model_validate((required.extensions or {})[SIGN_IN_WITH_X])
    assert declared.info.domain == "gateway.example" and declared.info.uri == ORIGIN + "/agent/projects"
    assert [c.chain_id for c in declared.supported_chains] == [
        f"eip155:{devchains['base'].chain_id}",
        f"eip155:{devchains['arbitrum'].chain_id}",
    ]

    accepted = await pay_a_deploy(gw, paying_wallet)
    project_id, deployment_id = accepted["projectId"], accepted["deploymentId"]

    listed = await gw.http.get("/agent/projects", headers={"SIGN-IN-WITH-X": await proof(gw, account)})
    assert listed.status_code == 200, listed.text
    assert listed.json()["wallet"] == paying_wallet.address
    assert [p["id"] for p in listed.json()["projects"]] == [project_id]

    status_path = f"/agent/deploy/{project_id}/{deployment_id}/status"
    status = await gw.http.get(
        status_path, headers={"SIGN-IN-WITH-X": await proof(gw, account, path=status_path)}
    )
    assert status.status_code == 200, status.text
    assert status.json()["status"] in ("deploying", "ready")

    header = await proof(gw, account, path=f"/agent/projects/{project_id}", method="DELETE")
    deleted = await gw.http.delete(f"/agent/projects/{project_id}", headers={"SIGN-IN-WITH-X": header})
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["projectId"] == project_id
    # The same proof again: its nonce is spent.
    again = await gw.http.delete(f"/agent/projects/{project_id}", headers={"SIGN-IN-WITH-X": header})
    assert refused(again) == "invalid_siwx_nonce"
    remaining = (await gw.projects(paying_wallet))["projects"]  # the seed's headers still work
    assert all(p["id"] != project_id or p["status"] == "deleting" for p in remaining)


async def test_bad_proofs_are_refused_with_the_reason(x402_gateway: Gateway, paying_wallet: Wallet) -> None:
    gw, account = x402_gateway, paying_wallet.account
    await pay_a_deploy(gw, paying_wallet)

    async def listing(header: str) -> httpx.Response:
        return await gw.http.get("/agent/projects", headers={"SIGN-IN-WITH-X": header})

    assert (
        refused(await listing(await proof(gw, account, domain="evil.example")))
        == "invalid_siwx_domain_mismatch"
    )
    other_uri = "https://evil.example/agent/projects"
    bad_uri = await listing(await proof(gw, account, uri=other_uri, resources=[other_uri]))
    assert refused(bad_uri) == "invalid_siwx_uri_mismatch"
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=6)).isoformat().replace("+00:00", "Z")
    assert refused(await listing(await proof(gw, account, issuedAt=old))) == "invalid_siwx_issued_at_too_old"
    assert (
        refused(await listing(await proof(gw, account, chainId="eip155:1")))
        == "invalid_siwx_unsupported_chain"
    )
    never_paid = Account.create()
    assert refused(await listing(await proof(gw, never_paid))) == "siwx_payment_required"
    malformed = await listing("not base64!")
    assert refused(malformed) == "invalid_siwx_payload" and malformed.json()["field"] == "header"

    # Signed by another key: refused, and the nonce it named is not burnt.
    nonce = uuid.uuid4().hex
    forged = await proof(gw, account, signer=Account.create(), nonce=nonce)
    assert refused(await listing(forged)) == "invalid_siwx_signature"
    genuine = await listing(await proof(gw, account, nonce=nonce))
    assert genuine.status_code == 200, genuine.text
    assert refused(await listing(await proof(gw, account, nonce=nonce))) == "invalid_siwx_nonce"


async def test_a_proof_of_a_wallet_is_not_anothers(x402_gateway: Gateway, paying_wallet: Wallet) -> None:
    """Claiming a payer's address with one's own signature is refused; the payer's projects stay hidden."""
    gw = x402_gateway
    await pay_a_deploy(gw, paying_wallet)
    intruder = new_wallet()
    header = await proof(gw, intruder.account, address=paying_wallet.address)
    response = await gw.http.get("/agent/projects", headers={"SIGN-IN-WITH-X": header})
    assert refused(response) == "invalid_siwx_signature"


class SiwxAuth(httpx.AsyncBaseTransport):
    """A fresh SIWx proof on every request (a client-chosen nonce, issuedAt now) from one challenge, so the
    x402 transport's paying retry carries its own: proofs are single-use."""

    def __init__(self, account: LocalAccount, declared: SIWxExtension) -> None:
        self.account, self.declared = account, declared
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        chain = self.declared.supported_chains[0]
        info = {
            **self.declared.info.model_dump(by_alias=True, exclude_none=True),
            "chainId": chain.chain_id,
            "type": chain.type,
            "nonce": uuid.uuid4().hex,
            "issuedAt": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
        }
        info.pop("expirationTime", None)
        signature = await sign_evm_message(eip4361(info, self.account.address), self.account)
        payload = SIWxPayload.model_validate(
            {**info, "address": self.account.address, "signature": signature}
        )
        request.headers["SIGN-IN-WITH-X"] = encode_siwx_header(payload)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_payer_extends_its_project_with_siwx_and_x402(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw, base = x402_gateway, devchains["base"]
    project_id = (await pay_a_deploy(gw, paying_wallet))["projectId"]
    path = f"/agent/projects/{project_id}/extend"
    declared = await challenge(gw, path, "POST")
    recipient_before = await base.token_balance("usdc", RECIPIENT)
    credits_before = await credit_balance(gw, paying_wallet)

    auth = SiwxAuth(paying_wallet.account, declared)
    async with httpx.AsyncClient(base_url=gw.url, transport=auth, timeout=60) as http:
        quote = await http.post(path, json={"months": 2})
    assert quote.status_code == 402, quote.text
    assert quote.json()["amount_token"] == str(2 * PRICE_RAW)
    required = decode(quote.headers["PAYMENT-REQUIRED"])
    assert required["resource"]["url"] == ORIGIN + path
    assert {offer["amount"] for offer in required["accepts"]} == {str(2 * PRICE_RAW)}

    client = x402Client().set_spend_controls({"max_amount_per_payment": "$5"})
    register_exact_evm_client(client, paying_wallet.account, networks=f"eip155:{base.chain_id}")
    recording = Recording(SiwxAuth(paying_wallet.account, declared))
    async with httpx.AsyncClient(
        base_url=gw.url, transport=x402AsyncTransport(client, transport=recording), timeout=60
    ) as http:
        extended = await http.post(path, json={"months": 2})
    assert extended.status_code == 200, extended.text
    body = extended.json()
    assert (body["projectId"], body["months"], body["amount_usd"]) == (project_id, 2, 2 * PRICE_RAW / 1e6)
    settled = decode(extended.headers["PAYMENT-RESPONSE"])
    assert settled["success"] is True and settled["payer"] == paying_wallet.address
    assert await base.token_balance("usdc", RECIPIENT) == recipient_before + 2 * PRICE_RAW
    assert await credit_balance(gw, paying_wallet) == credits_before + 2 * PRICE_RAW * 100

    # The same payment again: 409, nothing moves. Another wallet cannot extend this project.
    [header] = recording.sent
    async with httpx.AsyncClient(
        base_url=gw.url, transport=SiwxAuth(paying_wallet.account, declared)
    ) as http:
        replay = await http.post(path, json={"months": 2}, headers={"PAYMENT-SIGNATURE": header})
    assert replay.status_code == 409, replay.text
    other = new_wallet()
    await other.fund(base)
    await pay_a_deploy(gw, other)
    async with httpx.AsyncClient(base_url=gw.url, transport=SiwxAuth(other.account, declared)) as http:
        foreign = await http.post(path, json={"months": 1})
        bad = await http.post(path, json={"months": 0})
    assert foreign.status_code == 403, foreign.text
    assert bad.status_code == 400 and bad.json()["details"][0]["field"] == "months"
    assert await base.token_balance("usdc", RECIPIENT) == recipient_before + 2 * PRICE_RAW + PRICE_RAW
    assert await credit_balance(gw, paying_wallet) == credits_before + 2 * PRICE_RAW * 100
