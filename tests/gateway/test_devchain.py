"""The dev-chain command: two anvil nodes with 6-decimal tokens at the registry's real addresses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from eth_utils.crypto import keccak

from paddock_gateway import devchain, x402
from paddock_gateway.registry import KNOWN_CHAINS
from paddock_gateway.settings import GatewaySettings

pytestmark = [pytest.mark.chain, pytest.mark.slow]


NAME = "0x" + keccak(text="name()")[:4].hex()
VERSION = "0x" + keccak(text="version()")[:4].hex()


def abi_string(text: str) -> str:
    """The ABI encoding of a returned ``string`` (offset, length, padded bytes)."""
    data = text.encode()
    return "0x" + f"{32:064x}" + f"{len(data):064x}" + data.hex().ljust(64, "0")


def call(url: str, to: str, data: str) -> int:
    return int(devchain.rpc(url, "eth_call", [{"to": to, "data": data}, "latest"]), 16)


def test_up_writes_a_usable_file_and_down_stops_the_nodes(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "paddock_gateway.devchain"]
    up = subprocess.run(
        [*run, "up", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        assert info == json.loads((tmp_path / "devchain.json").read_text())
        for name, chain_id, tokens in KNOWN_CHAINS:
            chain = info["chains"][name]
            assert int(devchain.rpc(chain["rpc_url"], "eth_chainId"), 16) == chain_id
            for token, (_, address) in tokens.items():
                assert chain["tokens"][token] == address
                assert call(chain["rpc_url"], address, "0x313ce567") == 6  # decimals()
                holder = devchain.DEMO_ADDRESS.lower()[2:].rjust(64, "0")
                assert call(chain["rpc_url"], address, "0x70a08231" + holder) == devchain.DEMO_TOKENS_RAW
                # allowance(demo, Permit2): the demo wallet can pay by Permit2 at once
                allowance = "0xdd62ed3e" + holder + x402.PERMIT2_ADDRESS.lower()[2:].rjust(64, "0")
                assert call(chain["rpc_url"], address, allowance) == devchain.UINT256_MAX
            for contract in (x402.PERMIT2_ADDRESS, x402.X402_EXACT_PERMIT2_PROXY_ADDRESS):
                code = devchain.rpc(chain["rpc_url"], "eth_getCode", [contract, "latest"])
                assert code == devchain.runtime_code(devchain.PERMIT2_ARTIFACTS[contract])
            assert info["permit2"] == x402.PERMIT2_ADDRESS
            assert info["x402_exact_permit2_proxy"] == x402.X402_EXACT_PERMIT2_PROXY_ADDRESS
            usdc = chain["tokens"]["usdc"]
            assert devchain.rpc(
                chain["rpc_url"], "eth_call", [{"to": usdc, "data": NAME}, "latest"]
            ) == abi_string("USD Coin")
            assert devchain.rpc(
                chain["rpc_url"], "eth_call", [{"to": usdc, "data": VERSION}, "latest"]
            ) == abi_string("2")
            gas = int(
                devchain.rpc(chain["rpc_url"], "eth_getBalance", [devchain.SETTLEMENT_ADDRESS, "latest"]), 16
            )
            assert gas == devchain.SETTLEMENT_GAS_WEI
        settings = GatewaySettings(devchain_file=tmp_path / "devchain.json")
        assert settings.settlement_private_key.get_secret_value() == devchain.SETTLEMENT_PRIVATE_KEY
        assert settings.rpc_url_base == info["chains"]["base"]["rpc_url"]
        assert settings.registry().chain("arbitrum").recipient == devchain.RECIPIENT_ADDRESS
    finally:
        down = subprocess.run(
            [*run, "down", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
        )
    assert down.returncode == 0 and "stopped 2" in down.stdout
    with pytest.raises(httpx.HTTPError):
        devchain.rpc(info["chains"]["base"]["rpc_url"], "eth_chainId", timeout_s=1)
