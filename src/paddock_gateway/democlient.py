"""A small client for trying the gateway on the dev chain: the README's deploy walkthrough.

    python -m paddock_gateway.democlient deploy ./my-app --name my-app [--port 3000] [--env KEY=VALUE]
    python -m paddock_gateway.democlient projects
    python -m paddock_gateway.democlient delete PROJECT_ID

``deploy`` does what an agent does against the contract: it signs each request with the wallet
(EIP-191 over ``address:timestamp_ms:nonce``), sends the directory as a ``files`` upload and gets the
402 quote, pays it with a real ERC-20 ``transfer`` on the dev chain, retries with ``X-Payment-Tx``, and
polls the status until the deployment is ``ready`` (printing the endpoint) or ``failed`` (printing the
reason). By default it pays from the dev chain's demo wallet read from ``devchain.json`` (a public
anvil test key; never use it on a real chain); ``--private-key`` pays from another one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from paddock_gateway.devchain import TRANSFER_SELECTOR, encode_call

DEFAULT_GATEWAY = "http://127.0.0.1:8082"
DEFAULT_DEVCHAIN = Path(os.environ.get("PADDOCK_DATA_DIR", "/var/lib/paddock")) / "devchain" / "devchain.json"
SKIPPED_DIRS = {".git", "node_modules", ".venv", "__pycache__"}


class DemoError(Exception):
    """The walkthrough could not go on; the message says why."""


@dataclass
class DemoWallet:
    account: LocalAccount

    @property
    def address(self) -> str:
        return str(self.account.address)

    def headers(self) -> dict[str, str]:
        timestamp, nonce = str(int(time.time() * 1000)), str(uuid.uuid4())
        message = f"{self.address}:{timestamp}:{nonce}"
        signature = bytes(self.account.sign_message(encode_defunct(text=message)).signature)
        return {
            "X-Wallet-Address": self.address,
            "X-Signature": "0x" + signature.hex(),
            "X-Timestamp": timestamp,
            "X-Nonce": nonce,
        }


def read_upload(directory: Path) -> list[dict[str, str]]:
    """Every regular file under ``directory`` (build and dependency directories skipped), base64."""
    files = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if any(part in SKIPPED_DIRS for part in relative.parts) or not path.is_file() or path.is_symlink():
            continue
        files.append({"path": relative.as_posix(), "content": base64.b64encode(path.read_bytes()).decode()})
    if not files:
        raise DemoError(f"{directory} has no files to upload")
    return files


async def rpc(http: httpx.AsyncClient, url: str, method: str, params: list[Any]) -> Any:
    payload = (
        await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    ).json()
    if "error" in payload:
        raise DemoError(f"{method}: {payload['error'].get('message', payload['error'])}")
    return payload["result"]


async def transfer(
    http: httpx.AsyncClient, wallet: DemoWallet, rpc_url: str, token: str, to: str, amount_raw: int
) -> str:
    """A signed ERC-20 ``transfer(to, amount)``; returns the transaction hash once it is mined."""
    chain_id = int(await rpc(http, rpc_url, "eth_chainId", []), 16)
    nonce = int(await rpc(http, rpc_url, "eth_getTransactionCount", [wallet.address, "pending"]), 16)
    gas_price = int(await rpc(http, rpc_url, "eth_gasPrice", []), 16)
    # A plain dict: eth-account takes one, and its TxParams wants checksummed/hex-typed strings.
    transaction: dict[str, Any] = {
        "to": token,
        "data": encode_call(TRANSFER_SELECTOR, to, amount_raw),
        "value": 0,
        "gas": 120_000,
        "maxFeePerGas": gas_price * 2 + 1,
        "maxPriorityFeePerGas": 1,
        "nonce": nonce,
        "chainId": chain_id,
    }
    signed = wallet.account.sign_transaction(transaction)
    tx_hash = str(
        await rpc(http, rpc_url, "eth_sendRawTransaction", ["0x" + bytes(signed.raw_transaction).hex()])
    )
    for _ in range(300):
        receipt = await rpc(http, rpc_url, "eth_getTransactionReceipt", [tx_hash])
        if receipt:
            if receipt.get("status") != "0x1":
                raise DemoError(f"the transfer {tx_hash} reverted")
            return tx_hash
        await asyncio.sleep(0.1)
    raise DemoError(f"the transfer {tx_hash} was not mined")


async def deploy_directory(
    gateway_url: str,
    directory: Path,
    *,
    name: str,
    wallet: DemoWallet,
    chains: dict[str, dict[str, Any]],
    port: int = 3000,
    run_envs: dict[str, str] | None = None,
    months: int = 1,
    chain: str = "base",
    token: str = "usdc",
    timeout_s: float = 900.0,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Quote, pay, deploy and wait; returns the last status body (``ready`` or ``failed``)."""
    settings: dict[str, Any] = {"port": port}
    if run_envs:
        settings["runEnvs"] = run_envs
    body = {
        "uniqueName": name,
        "displayName": name,
        "months": months,
        "settings": settings,
        "upload": {"type": "files", "files": read_upload(directory)},
    }
    async with httpx.AsyncClient(base_url=gateway_url, timeout=120) as http:
        quote = await http.post("/agent/deploy", json=body, headers=wallet.headers())
        if quote.status_code == 200:
            accepted = quote.json()  # deployed on existing credits
        else:
            if quote.status_code != 402:
                raise DemoError(f"deploy: {quote.status_code} {quote.text}")
            q = quote.json()
            say(
                f"402 quote: {q['amount_usd']} USD = {q['amount_token']} raw {token} to {q['pay_to']} on {chain}"
            )
            tx_hash = await transfer(
                http,
                wallet,
                chains[chain]["rpc_url"],
                chains[chain]["tokens"][token],
                q["pay_to"],
                int(q["amount_token"]),
            )
            say(f"paid: {tx_hash}")
            paid = await http.post(
                "/agent/deploy",
                json=body,
                headers={
                    **wallet.headers(),
                    "X-Payment-Tx": tx_hash,
                    "X-Payment-Chain": chain,
                    "X-Payment-Token": token,
                },
            )
            if paid.status_code != 200:
                raise DemoError(f"paid deploy: {paid.status_code} {paid.text}")
            accepted = paid.json()
        say(f"deploying: project {accepted['projectId']}, deployment {accepted['deploymentId']}")
        status_path = f"/agent/deploy/{accepted['projectId']}/{accepted['deploymentId']}/status"
        deadline = time.monotonic() + timeout_s
        while True:
            response = await http.get(status_path, headers=wallet.headers())
            if response.status_code != 200:
                raise DemoError(f"status: {response.status_code} {response.text}")
            status = dict(response.json())
            if status["status"] != "deploying" or time.monotonic() > deadline:
                return {**status, "projectId": accepted["projectId"]}
            await asyncio.sleep(2.0)  # 30 requests a minute per wallet and IP


async def signed(gateway_url: str, wallet: DemoWallet, method: str, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway_url, timeout=60) as http:
        return await http.request(method, path, headers=wallet.headers())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paddock_gateway.democlient", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--gateway", default=DEFAULT_GATEWAY)
    parser.add_argument(
        "--devchain", type=Path, default=DEFAULT_DEVCHAIN, help="devchain.json of the dev chain"
    )
    parser.add_argument("--private-key", default="", help="pay and sign with this key (default: demo wallet)")
    sub = parser.add_subparsers(dest="command", required=True)
    deploy = sub.add_parser("deploy", help="quote, pay on the dev chain, deploy a directory, wait")
    deploy.add_argument("directory", type=Path)
    deploy.add_argument("--name", required=True, help="uniqueName: 3-32 of a-z, 0-9, '-'")
    deploy.add_argument("--port", type=int, default=3000)
    deploy.add_argument("--months", type=int, default=1)
    deploy.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="a runEnvs entry")
    deploy.add_argument("--chain", default="base")
    deploy.add_argument("--token", default="usdc")
    sub.add_parser("projects", help="this wallet's projects")
    delete = sub.add_parser("delete", help="delete a project (its sandbox is destroyed)")
    delete.add_argument("project_id")
    args = parser.parse_args(argv)

    try:
        info = json.loads(args.devchain.read_text()) if args.devchain.exists() else {}
        key = args.private_key or info.get("demo_wallet", {}).get("private_key")
        if not key:
            raise DemoError(
                f"no --private-key and no demo wallet in {args.devchain} (is `paddock serve` running?)"
            )
        wallet = DemoWallet(Account.from_key(key))
        if args.command == "deploy":
            envs = dict(item.split("=", 1) for item in args.env if "=" in item)
            final = asyncio.run(
                deploy_directory(
                    args.gateway,
                    args.directory,
                    name=args.name,
                    wallet=wallet,
                    chains=info.get("chains", {}),
                    port=args.port,
                    run_envs=envs,
                    months=args.months,
                    chain=args.chain,
                    token=args.token,
                )
            )
            print(json.dumps(final, indent=2))
            return 0 if final["status"] == "ready" else 1
        method, path = ("GET", "/agent/projects")
        if args.command == "delete":
            method, path = "DELETE", f"/agent/projects/{args.project_id}"
        response = asyncio.run(signed(args.gateway, wallet, method, path))
        print(json.dumps(response.json(), indent=2))
        return 0 if response.status_code == 200 else 1
    except (DemoError, httpx.HTTPError, OSError, ValueError) as exc:
        print(f"democlient: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
