"""Local EVM chains for tests and ``make run``: two anvil nodes with 6-decimal test tokens.

    python -m paddock_gateway.devchain up --state-dir DIR    # start, install tokens, fund, print JSON
    python -m paddock_gateway.devchain down --state-dir DIR  # stop the nodes started by `up`

``up`` starts one anvil per chain (``base`` with chain id 8453, ``arbitrum`` with 42161) on
127.0.0.1 and a free port, installs the compiled ``devchain/contracts/TestToken.sol`` runtime code at
the **real** USDC and USDT addresses of the registry with ``anvil_setCode``, writes the token owner into
storage slot 0 with ``anvil_setStorageAt``, and mints tokens to the demo wallet. The demo wallet and
the token owner are anvil's first default account (a public, well-known test key — never use it on a
real chain); the suggested recipient is anvil's second default account. The JSON written to
``DIR/devchain.json`` holds the RPC URLs, the token addresses, the demo wallet and the ``PADDOCK_GW_*``
variables that point a gateway at these chains.

anvil comes from the npm package ``@foundry-rs/anvil-linux-amd64`` installed into
``devchain/node_modules`` (``cd devchain && npm ci``); ``PADDOCK_GW_ANVIL_BIN`` overrides the path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from eth_utils.crypto import keccak

from paddock_gateway.registry import KNOWN_CHAINS
from paddock_gateway.x402 import (
    PERMIT2_ADDRESS,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
)

REPO_DEVCHAIN_DIR = Path(__file__).resolve().parents[2] / "devchain"
ANVIL_RELATIVE = Path("node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil")
ARTIFACT_RELATIVE = Path("build/TestToken.json")
#: Which compiled contract goes at which token's address: USDC carries USDC's EIP-712 domain.
TOKEN_ARTIFACTS = {"usdc": Path("build/TestUSDC.json"), "usdt": ARTIFACT_RELATIVE}
#: The contracts x402's Permit2 method and its ``upto`` scheme need, at the addresses every x402 client
#: signs for.
PERMIT2_ARTIFACTS = {
    PERMIT2_ADDRESS: Path("build/Permit2.json"),
    X402_EXACT_PERMIT2_PROXY_ADDRESS: Path("build/X402ExactPermit2Proxy.json"),
    X402_UPTO_PERMIT2_PROXY_ADDRESS: Path("build/X402UptoPermit2Proxy.json"),
}

#: anvil's default accounts 0 and 1 (mnemonic "test test … junk"): public test keys.
DEMO_ADDRESS = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
DEMO_PRIVATE_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
RECIPIENT_ADDRESS = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
#: anvil's default account 2: the gateway's x402 settlement key on the dev chain (public test key).
SETTLEMENT_ADDRESS = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
SETTLEMENT_PRIVATE_KEY = "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"
SETTLEMENT_GAS_WEI = 100 * 10**18
DEMO_TOKENS_RAW = 1_000_000 * 10**6
OWNER_SLOT = "0x0"
MINT_SELECTOR = keccak(text="mint(address,uint256)")[:4].hex()
TRANSFER_SELECTOR = keccak(text="transfer(address,uint256)")[:4].hex()
APPROVE_SELECTOR = keccak(text="approve(address,uint256)")[:4].hex()
UINT256_MAX = 2**256 - 1
LISTENING = re.compile(r"Listening on 127\.0\.0\.1:(\d+)")


class DevChainError(RuntimeError):
    """anvil is missing, did not start, or refused a set-up call."""


def devchain_dir() -> Path:
    return Path(os.environ.get("PADDOCK_GW_DEVCHAIN_DIR", REPO_DEVCHAIN_DIR))


def anvil_binary() -> Path:
    path = Path(os.environ.get("PADDOCK_GW_ANVIL_BIN", devchain_dir() / ANVIL_RELATIVE))
    if not path.exists():
        raise DevChainError(
            f"anvil not found at {path}; run `cd devchain && npm ci` (or `make devchain-deps`)"
        )
    return path


def token_runtime_code(token: str = "usdt") -> str:
    return runtime_code(TOKEN_ARTIFACTS.get(token, ARTIFACT_RELATIVE))


def runtime_code(artifact_path: Path) -> str:
    artifact = json.loads((devchain_dir() / artifact_path).read_text())
    return str(artifact["deployedBytecode"])


def rpc(url: str, method: str, params: list[Any] | None = None, *, timeout_s: float = 10.0) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}
    response = httpx.post(url, json=body, timeout=timeout_s)
    payload = response.json()
    if "error" in payload:
        raise DevChainError(f"{method}: {payload['error']}")
    return payload["result"]


def encode_call(selector: str, address: str, amount: int) -> str:
    return "0x" + selector + address.lower().removeprefix("0x").rjust(64, "0") + f"{amount:064x}"


def wait_receipt(url: str, tx_hash: str, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        receipt = rpc(url, "eth_getTransactionReceipt", [tx_hash])
        if receipt:
            return dict(receipt)
        time.sleep(0.02)
    raise DevChainError(f"no receipt for {tx_hash}")


def send_as(url: str, sender: str, to: str, data: str, *, gas: int | None = None) -> str:
    """Send a transaction from an account anvil holds the key of (or impersonates); returns the hash."""
    tx: dict[str, Any] = {"from": sender, "to": to, "data": data}
    if gas is not None:
        tx["gas"] = hex(gas)
    return str(rpc(url, "eth_sendTransaction", [tx]))


def install_token(url: str, address: str, code: str, owner: str) -> None:
    rpc(url, "anvil_setCode", [address, code])
    rpc(
        url,
        "anvil_setStorageAt",
        [address, OWNER_SLOT, "0x" + owner.lower().removeprefix("0x").rjust(64, "0")],
    )


def mint(url: str, token: str, to: str, amount_raw: int, *, owner: str = DEMO_ADDRESS) -> str:
    tx_hash = send_as(url, owner, token, encode_call(MINT_SELECTOR, to, amount_raw))
    receipt = wait_receipt(url, tx_hash)
    if int(receipt["status"], 16) != 1:
        raise DevChainError(f"mint of {amount_raw} to {to} reverted")
    return tx_hash


def approve(url: str, token: str, owner: str, spender: str, amount_raw: int = UINT256_MAX) -> str:
    """``owner`` (an account anvil holds the key of) approves ``spender``: here, Permit2, once per token,
    as a wallet does before its first Permit2 payment."""
    tx_hash = send_as(url, owner, token, encode_call(APPROVE_SELECTOR, spender, amount_raw))
    if int(wait_receipt(url, tx_hash)["status"], 16) != 1:
        raise DevChainError(f"approve of {spender} on {token} reverted")
    return tx_hash


def fund_gas(url: str, address: str, wei: int) -> None:
    """Native currency for gas: the settlement account pays for every x402 settlement it submits."""
    rpc(url, "anvil_setBalance", [address, hex(wei)])


@dataclass
class AnvilNode:
    name: str
    chain_id: int
    rpc_url: str
    pid: int
    tokens: dict[str, str] = field(default_factory=dict)


def start_anvil(name: str, chain_id: int, state_dir: Path, *, timeout_s: float = 20.0) -> AnvilNode:
    log_path = state_dir / f"anvil-{name}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [str(anvil_binary()), "--host", "127.0.0.1", "--port", "0", "--chain-id", str(chain_id)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = LISTENING.search(log_path.read_text(errors="replace"))
        if match:
            url = f"http://127.0.0.1:{match.group(1)}"
            try:
                if int(rpc(url, "eth_chainId"), 16) == chain_id:
                    return AnvilNode(name=name, chain_id=chain_id, rpc_url=url, pid=process.pid)
            except (httpx.HTTPError, DevChainError):
                pass
        if process.poll() is not None:
            raise DevChainError(f"anvil for {name} exited: {log_path.read_text(errors='replace')[-500:]}")
        time.sleep(0.05)
    process.kill()
    raise DevChainError(f"anvil for {name} did not start within {timeout_s:.0f}s")


def up(state_dir: Path, *, chain_ids: dict[str, int] | None = None) -> dict[str, Any]:
    """Start the nodes, install the tokens, fund the demo wallet; returns (and writes) the info JSON."""
    state_dir.mkdir(parents=True, exist_ok=True)
    codes = {token: token_runtime_code(token) for token in TOKEN_ARTIFACTS}
    permit2_codes = {address: runtime_code(path) for address, path in PERMIT2_ARTIFACTS.items()}
    nodes: list[AnvilNode] = []
    try:
        for name, default_id, tokens in KNOWN_CHAINS:
            node = start_anvil(name, (chain_ids or {}).get(name, default_id), state_dir)
            nodes.append(node)
            for contract, code in permit2_codes.items():
                rpc(node.rpc_url, "anvil_setCode", [contract, code])
            for token, (_, address) in tokens.items():
                install_token(node.rpc_url, address, codes[token], DEMO_ADDRESS)
                mint(node.rpc_url, address, DEMO_ADDRESS, DEMO_TOKENS_RAW)
                approve(node.rpc_url, address, DEMO_ADDRESS, PERMIT2_ADDRESS)
                node.tokens[token] = address
            fund_gas(node.rpc_url, SETTLEMENT_ADDRESS, SETTLEMENT_GAS_WEI)
    except BaseException:
        for node in nodes:
            stop_pid(node.pid)
        raise
    info = describe(nodes)
    (state_dir / "devchain.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def describe(nodes: list[AnvilNode]) -> dict[str, Any]:
    env = {"PADDOCK_GW_RECIPIENT": RECIPIENT_ADDRESS}
    for node in nodes:
        env[f"PADDOCK_GW_RPC_URL_{node.name.upper()}"] = node.rpc_url
        env[f"PADDOCK_GW_CHAIN_ID_{node.name.upper()}"] = str(node.chain_id)
    return {
        "chains": {
            node.name: {
                "chain_id": node.chain_id,
                "rpc_url": node.rpc_url,
                "pid": node.pid,
                "tokens": node.tokens,
            }
            for node in nodes
        },
        "token_decimals": 6,
        "permit2": PERMIT2_ADDRESS,
        "x402_exact_permit2_proxy": X402_EXACT_PERMIT2_PROXY_ADDRESS,
        "x402_upto_permit2_proxy": X402_UPTO_PERMIT2_PROXY_ADDRESS,
        "demo_wallet": {
            "address": DEMO_ADDRESS,
            "private_key": DEMO_PRIVATE_KEY,
            "note": "anvil default account #0 (public test key); also the test tokens' owner; "
            "has approved Permit2 for every token",
            "tokens_raw": str(DEMO_TOKENS_RAW),
        },
        "recipient": RECIPIENT_ADDRESS,
        "settlement": {
            "address": SETTLEMENT_ADDRESS,
            "private_key": SETTLEMENT_PRIVATE_KEY,
            "note": "anvil default account #2 (public test key): the gateway's x402 settlement key",
        },
        "env": env,
    }


def stop_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return
        except ChildProcessError:
            pass
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def down(state_dir: Path) -> list[int]:
    path = state_dir / "devchain.json"
    if not path.exists():
        return []
    info = json.loads(path.read_text())
    pids = [int(chain["pid"]) for chain in info.get("chains", {}).values()]
    for pid in pids:
        stop_pid(pid)
    path.unlink()
    return pids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paddock_gateway.devchain", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("up", "down"):
        cmd = sub.add_parser(command)
        cmd.add_argument("--state-dir", type=Path, default=Path(".paddock/devchain"))
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            down(args.state_dir)
            print(json.dumps(up(args.state_dir), indent=2))
        else:
            stopped = down(args.state_dir)
            print(f"stopped {len(stopped)} anvil node(s)")
    except DevChainError as exc:
        print(f"devchain: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
