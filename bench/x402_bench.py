"""Paying for a deploy: x402 (signature, settled by the gateway) vs the transfer-hash flow, same run.

    .venv/bin/python -m bench.x402_bench            # 20 deploys each way
    .venv/bin/python -m bench.x402_bench -n 50 --json

Both flows run against one real gateway on 127.0.0.1 and the real anvil dev chains (automine: a block
per transaction, so chain time is near zero here; on Base a block is ~2 s and both flows wait for one).
Hosting is a stub that accepts every deploy at once: the rows measure payment, not builds.

Rows (milliseconds, from the client's side):
- floor: ``GET /health`` (one gateway round trip) and ``eth_blockNumber`` (one RPC round trip);
- quote: the first ``POST /agent/deploy`` → 402, the same call in both flows;
- x402: sign the EIP-3009 authorization; the paying call (verify, settle, receipt, top up, deploy → 200);
  and the whole 402 → settled → deploying;
- transfer: sign, send and await the receipt of the wallet's own ERC-20 transfer; the paying call with
  ``X-Payment-Tx`` (verify the receipt, top up, deploy → 200); and the whole 402 → deploying.

Prints a table; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from bench.stats import summarize
from paddock import eip3009
from paddock_core.logging import configure_logging
from paddock_gateway import devchain
from paddock_gateway.adapters.hosting import (
    DeploymentHandle,
    DeploymentState,
    DeployOptions,
    ProjectSpec,
    UploadedFile,
)
from paddock_gateway.app import create_app
from paddock_gateway.settings import GatewaySettings

TRANSFER = devchain.TRANSFER_SELECTOR


class AcceptingHosting:
    """Accepts every deploy at once, so the rows time the payment path and nothing else."""

    async def create_deployment(
        self, project: ProjectSpec, files: Sequence[UploadedFile], options: DeployOptions
    ) -> DeploymentHandle:
        return DeploymentHandle(project_id=str(uuid.uuid4()), deployment_id=str(uuid.uuid4()))

    async def deployment_status(self, project_id: str, deployment_id: str) -> DeploymentState:
        return DeploymentState(status="active", url="http://127.0.0.1:1")

    async def pause_project(self, project_id: str) -> None:
        return None

    async def resume_project(self, project_id: str) -> None:
        return None

    async def delete_project(self, project_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def rpc(http: httpx.AsyncClient, url: str, method: str, params: list[Any] | None = None) -> Any:
    payload = (
        await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    ).json()
    if "error" in payload:
        raise RuntimeError(f"{method}: {payload['error']}")
    return payload["result"]


def auth(account: LocalAccount) -> dict[str, str]:
    timestamp, nonce = str(int(time.time() * 1000)), str(uuid.uuid4())
    message = f"{account.address}:{timestamp}:{nonce}"
    signature = bytes(account.sign_message(encode_defunct(text=message)).signature)
    return {
        "X-Wallet-Address": account.address,
        "X-Signature": "0x" + signature.hex(),
        "X-Timestamp": timestamp,
        "X-Nonce": nonce,
    }


def body() -> dict[str, Any]:
    return {
        "uniqueName": f"bench-{uuid.uuid4().hex[:12]}",
        "displayName": "Bench Site",
        "upload": {"type": "files", "files": [{"path": "index.html", "content": "aGk="}]},
    }


def sign_x402(account: LocalAccount, offer: dict[str, Any], chain_id: int) -> str:
    nonce = os.urandom(32)
    typed = eip3009.transfer_with_authorization(
        name=offer["extra"]["name"],
        version=offer["extra"]["version"],
        chain_id=chain_id,
        verifying_contract=offer["asset"],
        sender=account.address,
        to=offer["payTo"],
        value=int(offer["amount"]),
        valid_after=0,
        valid_before=int(time.time()) + int(offer["maxTimeoutSeconds"]),
        nonce=nonce,
    )
    message = typed["message"]
    signature = bytes(account.sign_typed_data(full_message=typed).signature)
    authorization = {k: str(v) for k, v in message.items() if k != "nonce"} | {"nonce": "0x" + nonce.hex()}
    payload = {
        "x402Version": 2,
        "accepted": offer,
        "payload": {"signature": "0x" + signature.hex(), "authorization": authorization},
    }
    return base64.b64encode(json.dumps(payload).encode()).decode()


async def fund(http: httpx.AsyncClient, chain: dict[str, Any], address: str) -> None:
    url = chain["rpc_url"]
    await rpc(http, url, "anvil_setBalance", [address, hex(10**19)])
    call = devchain.encode_call(devchain.MINT_SELECTOR, address, 10_000 * 10**6)
    await rpc(
        http,
        url,
        "eth_sendTransaction",
        [{"from": devchain.DEMO_ADDRESS, "to": chain["tokens"]["usdc"], "data": call}],
    )


async def transfer(
    http: httpx.AsyncClient, account: LocalAccount, chain: dict[str, Any], to: str, amount: int
) -> str:
    url = chain["rpc_url"]
    nonce = int(await rpc(http, url, "eth_getTransactionCount", [account.address, "pending"]), 16)
    gas_price = int(await rpc(http, url, "eth_gasPrice"), 16)
    tx = {
        "to": chain["tokens"]["usdc"],
        "data": devchain.encode_call(TRANSFER, to, amount),
        "value": 0,
        "gas": 100_000,
        "maxFeePerGas": gas_price * 2 + 1,
        "maxPriorityFeePerGas": 1,
        "nonce": nonce,
        "chainId": chain["chain_id"],
    }
    signed = account.sign_transaction(tx)
    tx_hash = str(
        await rpc(http, url, "eth_sendRawTransaction", ["0x" + bytes(signed.raw_transaction).hex()])
    )
    while not await rpc(http, url, "eth_getTransactionReceipt", [tx_hash]):
        await asyncio.sleep(0.005)
    return tx_hash


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


async def run(runs: int, state_dir: Path) -> dict[str, dict[str, Any]]:
    info = devchain.up(state_dir)
    base = info["chains"]["base"]
    settings = GatewaySettings(
        data_dir=state_dir / "gw",
        database_url=f"sqlite+aiosqlite:///{state_dir / 'gateway.db'}",
        devchain_file=state_dir / "devchain.json",
        static_monthly_usd=Decimal("2.00"),
        rate_limit_requests=100_000,
        metering_interval_s=3600.0,
    )
    app = create_app(settings, hosting=AcceptingHosting(), run_workers=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    rows: dict[str, list[float]] = {}

    def add(row: str, value: float) -> None:
        rows.setdefault(row, []).append(value)

    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            for _ in range(runs):
                start = time.perf_counter()
                await http.get("/health")
                add("floor: GET /health", ms_since(start))
                start = time.perf_counter()
                await rpc(http, base["rpc_url"], "eth_blockNumber")
                add("floor: eth_blockNumber", ms_since(start))

            for _ in range(runs):  # x402 and transfer interleaved, each with a fresh wallet
                for flow in ("x402", "transfer"):
                    account: LocalAccount = Account.create()
                    await fund(http, base, account.address)
                    deploy = body()
                    start = time.perf_counter()
                    quote = await http.post("/agent/deploy", json=deploy, headers=auth(account))
                    assert quote.status_code == 402, quote.text
                    add("quote: 402", ms_since(start))
                    if flow == "x402":
                        signed_at = time.perf_counter()
                        required = json.loads(base64.b64decode(quote.headers["PAYMENT-REQUIRED"]))
                        offer = next(
                            o for o in required["accepts"] if o["network"] == f"eip155:{base['chain_id']}"
                        )
                        header = sign_x402(account, offer, base["chain_id"])
                        add("x402: sign authorization", ms_since(signed_at))
                        paid_at = time.perf_counter()
                        paid = await http.post(
                            "/agent/deploy",
                            json=deploy,
                            headers={**auth(account), "PAYMENT-SIGNATURE": header},
                        )
                        add("x402: paying call (settle + deploy)", ms_since(paid_at))
                    else:
                        sent_at = time.perf_counter()
                        q = quote.json()
                        tx_hash = await transfer(http, account, base, q["pay_to"], int(q["amount_token"]))
                        add("transfer: sign + send + mined", ms_since(sent_at))
                        paid_at = time.perf_counter()
                        paid = await http.post(
                            "/agent/deploy", json=deploy, headers={**auth(account), "X-Payment-Tx": tx_hash}
                        )
                        add("transfer: paying call (verify + deploy)", ms_since(paid_at))
                    assert paid.status_code == 200 and paid.json()["status"] == "deploying", paid.text
                    add(f"{flow}: 402 → settled → deploying", ms_since(start))
    finally:
        server.should_exit = True
        await task
        devchain.down(state_dir)
    return {row: summarize(values) for row, values in rows.items()}


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'row':<44} {'n':>4} {'p50 ms':>9} {'p90 ms':>9} {'max ms':>9}"]
    for row, stats in results.items():
        lines.append(
            f"{row:<44} {stats['n']:>4} {stats['p50']:>9.1f} {stats['p90']:>9.1f} {stats['max']:>9.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="x402-bench-") as tmp:
        results = asyncio.run(run(args.runs, Path(tmp)))
    print(json.dumps(results, indent=2) if args.json else table(results))


if __name__ == "__main__":
    main()
