"""x402's ``bazaar`` discovery extension on the deploy's 402: coinbase's package parses and validates it,
its client copies it into the payment it signs (and the payment still settles), and a facilitator's
``extract_discovery_info`` catalogues ``POST https://gateway.example/agent/deploy`` from that payment with
the deploy request's schema and the 200's."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest
from x402 import x402Client
from x402.extensions.bazaar import (
    BAZAAR,
    extract_discovery_info,
    extract_discovery_info_from_extension,
    validate_discovery_extension,
)
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.schemas import PaymentRequired

from tests.gateway.conftest import Chain, Gateway, Wallet, new_wallet, static_site, unique_name
from tests.gateway.test_x402 import WalletAuth, decode
from tests.gateway.test_x402_permit2 import Recording
from tests.ports import free_port

pytestmark = [pytest.mark.chain, pytest.mark.slow]


async def test_coinbases_package_parses_the_bazaar_declaration(x402_gateway: Gateway) -> None:
    body = static_site(unique_name(), "x", port=free_port())
    response = await x402_gateway.deploy(new_wallet(), body)
    assert response.status_code == 402
    required = PaymentRequired.model_validate(decode(response.headers["PAYMENT-REQUIRED"]))
    declared = (required.extensions or {})[BAZAAR.key]
    assert validate_discovery_extension(declared).valid, validate_discovery_extension(declared).errors
    info = extract_discovery_info_from_extension(declared)
    assert info.input.method == "POST" and info.input.body_type == "json"
    assert info.output is not None and info.output.example["status"] == "deploying"

    schema = declared["schema"]
    body_schema = {**schema["properties"]["input"]["properties"]["body"], "$defs": schema["$defs"]}
    jsonschema.validate(body, body_schema)  # a request the gateway accepts fits the declared schema
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**body, "months": "twelve"}, body_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in body.items() if k != "upload"}, body_schema)


async def test_a_paid_deploy_carries_it_to_a_facilitators_catalogue(
    x402_gateway: Gateway, paying_wallet: Wallet, devchains: dict[str, Chain]
) -> None:
    gw = x402_gateway
    client = x402Client().set_spend_controls({"max_amount_per_payment": "$5"})
    register_exact_evm_client(client, paying_wallet.account, networks=f"eip155:{devchains['base'].chain_id}")
    recording = Recording(WalletAuth(paying_wallet, gw.clock))
    body = static_site(unique_name("bazaar"), "<h1>discovered</h1>", port=free_port())
    async with httpx.AsyncClient(
        base_url=gw.url, transport=x402AsyncTransport(client, transport=recording), timeout=60
    ) as http:
        response = await http.post("/agent/deploy", json=body)
    assert response.status_code == 200, response.text

    [header] = recording.sent
    payload: dict[str, Any] = decode(header)
    assert BAZAAR.key in payload["extensions"]  # the client copied the declaration into what it signed
    found = extract_discovery_info(payload, payload["accepted"])
    assert found is not None
    assert (found.resource_url, found.method) == ("https://gateway.example/agent/deploy", "POST")
    assert found.description == "Deploy an application on Paddock"
    assert found.mime_type == "application/json"
