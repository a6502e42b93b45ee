"""Deploy input validation (§5.3): JSON, body fields, uploads, payment headers, pricing availability."""

from __future__ import annotations

import io
import zipfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from paddock_gateway.pricing import PricingError
from tests.gateway.conftest import (
    Gateway,
    b64,
    gateway_settings,
    new_wallet,
    running_gateway,
    static_site,
    unique_name,
)


def body(**changes: Any) -> dict[str, Any]:
    return {**static_site(unique_name(), "<p>hi</p>", port=8080), **changes}


def zipped(entries: dict[str, bytes], *, symlink: str | None = None) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = 0o120777 << 16
            archive.writestr(info, "/etc/passwd")
    return b64(buffer.getvalue())


async def details(gw: Gateway, payload: Any) -> list[dict[str, str]]:
    response = await gw.deploy(new_wallet(), payload)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_body"
    return list(response.json()["details"])


async def test_wrong_content_type_and_broken_json(gateway: Gateway) -> None:
    headers = gateway.auth(new_wallet())
    r = await gateway.http.post(
        "/agent/deploy", content=b"{}", headers={**headers, "Content-Type": "text/plain"}
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_json"
    headers = gateway.auth(new_wallet())
    r = await gateway.http.post(
        "/agent/deploy",
        content=b'{"a":',
        headers={**headers, "Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 400 and r.json() == {"error": "Body is not valid JSON", "code": "invalid_json"}


async def test_field_errors_name_the_field(gateway: Gateway) -> None:
    assert (await details(gateway, body(uniqueName="ab")))[0]["field"] == "uniqueName"
    assert (await details(gateway, body(uniqueName="-bad-name")))[0]["field"] == "uniqueName"
    assert (await details(gateway, body(displayName="emoji 🙂 name")))[0]["field"] == "displayName"
    for months in (1.0, "1", True, 0, 121):
        assert (await details(gateway, body(months=months)))[0]["field"] == "months", months
    assert (await details(gateway, body(settings={"port": 70000})))[0]["field"] == "settings.port"
    assert (await details(gateway, body(settings={"runEnvs": {"1BAD": "x"}})))[0][
        "field"
    ] == "settings.runEnvs"
    assert (await details(gateway, [1, 2]))[0]["field"] == "body"
    missing = await details(gateway, {"displayName": "Name"})
    assert {d["field"] for d in missing} >= {"uniqueName", "upload"}


async def test_file_paths_and_base64_are_strict(gateway: Gateway) -> None:
    def files(*items: dict[str, str]) -> dict[str, Any]:
        return body(upload={"type": "files", "files": list(items)})

    ok = {"path": "index.html", "content": b64("x")}
    for bad_path in ("../etc/passwd", "/abs", "a//b", "a/./b", "a\\b", "a\x01b"):
        found = await details(gateway, files(ok, {"path": bad_path, "content": ""}))
        assert found[0]["field"] == "upload.files[1].path", bad_path
    for bad_content in ("aGk", "aGk=\n", "a-_=", "aGk*"):
        found = await details(gateway, files({"path": "a.txt", "content": bad_content}))
        assert found[0]["field"] == "upload.files[0].content", bad_content
    assert (await details(gateway, files(ok, ok)))[0]["field"] == "upload.files"
    assert (await details(gateway, body(upload={"type": "tarball"})))[0]["field"] == "upload"
    assert (await details(gateway, body(upload={"type": "files", "files": []})))[0]["field"] == "upload.files"


async def test_zip_uploads_reject_traversal_links_and_bombs(gateway: Gateway) -> None:
    def z(data: str) -> dict[str, Any]:
        return body(upload={"type": "zip", "data": data, "filename": "code.zip"})

    assert (await details(gateway, z(b64(b"not a zip"))))[0]["field"] == "upload.data"
    traversal = await details(gateway, z(zipped({"../evil.sh": b"rm -rf /"})))
    assert traversal[0]["field"] == "upload.data" and "evil.sh" in traversal[0]["message"]
    link = await details(gateway, z(zipped({"index.html": b"x"}, symlink="passwd")))
    assert "symbolic link" in link[0]["message"]
    bomb = await details(gateway, z(zipped({"index.html": b"x", "zeros.bin": bytes(50 * 1024 * 1024)})))
    assert "zip bomb" in bomb[0]["message"]
    no_dir = body(settings={"directoryPath": "web"})
    assert (await details(gateway, no_dir))[0]["field"] == "settings.directoryPath"


async def test_payment_header_syntax(gateway: Gateway) -> None:
    wallet = new_wallet()
    cases = {
        "invalid_tx_hash": {"X-Payment-Tx": "0x1234"},
        "unsupported_chain": {"X-Payment-Chain": "ethereum"},
        "unsupported_token": {"X-Payment-Token": "dai"},
        "invalid_header": {"X-Use-Existing-Credits": "yes"},
    }
    for expected, headers in cases.items():
        response = await gateway.deploy(wallet, body(), **headers)
        assert response.status_code == 400 and response.json()["code"] == expected


class BrokenPricing:
    async def monthly_credits(self) -> Decimal:
        raise PricingError("upstream down")


async def test_no_price_ever_is_503(tmp_path: Path) -> None:
    async with running_gateway(gateway_settings(tmp_path), tmp_path, pricing=BrokenPricing()) as gw:
        response = await gw.deploy(new_wallet(), body())
        assert response.status_code == 503 and response.json()["code"] == "pricing_unavailable"
        invalid = await gw.deploy(new_wallet(), body(uniqueName="x"))
        assert invalid.status_code == 400  # validation comes before pricing


async def test_unknown_path_and_method(gateway: Gateway) -> None:
    missing = await gateway.http.get("/agent/nothing-here")
    assert missing.status_code == 404 and missing.json() == {"error": "Not found", "code": "not_found"}
    wrong = await gateway.http.put("/agent/chains")
    assert wrong.status_code == 405 and wrong.json()["code"] == "method_not_allowed"


async def test_public_lookups(gateway: Gateway) -> None:
    assert (await gateway.http.get("/health")).json() == {"status": "ok"}
    chains = (await gateway.http.get("/agent/chains")).json()
    assert [c["chain"] for c in chains["chains"]] == ["base", "arbitrum"]
    recipients = (await gateway.http.get("/agent/recipients")).json()
    assert [r["address"] for r in recipients["recipients"]] == [gateway.settings.recipient] * 2
    assert recipients["updated_at"].endswith("Z")
    doc = (await gateway.http.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1") and doc["info"]["version"] == "1.0.0"
    assert "/agent/deploy" in doc["paths"] and "DeployRequest" in doc["components"]["schemas"]
    bad = await gateway.http.get("/agent/balance/0x123")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_address"
    chain = await gateway.http.get(f"/agent/balance/{'0x' + '1' * 40}", params={"chain": "solana"})
    assert chain.status_code == 400 and chain.json()["code"] == "unsupported_chain"
    down = await gateway.http.get(f"/agent/balance/{'0x' + '1' * 40}")
    assert down.status_code == 502 and down.json()["code"] == "upstream_unavailable"


async def test_balance_reads_the_chain(chain_gateway: Gateway) -> None:
    wallet = new_wallet()
    await wallet.fund(chain_gateway.chains["arbitrum"], tokens_raw=18_000_000)
    response = await chain_gateway.http.get(
        f"/agent/balance/{wallet.address.lower()}", params={"chain": "ARBITRUM"}
    )
    assert response.status_code == 200
    assert response.json() == {
        "address": wallet.address,
        "chain": "arbitrum",
        "chain_id": 42161,
        "balances": [
            {
                "token": "usdc",
                "symbol": "USDC",
                "address": "0xaf88d065e77c8cC2239327C5EDb3A432268e5831",
                "balance": "18.000000",
                "balance_raw": "18000000",
                "decimals": 6,
            },
            {
                "token": "usdt",
                "symbol": "USDT",
                "address": "0xFd086bC7CD5C481DCC9C85ebE478A1C0b69FCbb9",
                "balance": "18.000000",
                "balance_raw": "18000000",
                "decimals": 6,
            },
        ],
    }
