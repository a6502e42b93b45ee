"""Gateway fixtures: real anvil chains (session-wide), a real gateway on 127.0.0.1 over a fresh
database, the local sandbox fake, wallets that sign requests and pay with real ERC-20 transfers."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from paddock_core.db import transaction
from paddock_gateway import credits, devchain
from paddock_gateway.adapters.hosting import SandboxProvider
from paddock_gateway.app import create_app
from paddock_gateway.pricing import PricingSource
from paddock_gateway.services import Services
from paddock_gateway.settings import GatewaySettings
from tests.conftest import LiveServer
from tests.gateway.fakes import LocalSandboxProvider

RECIPIENT = devchain.RECIPIENT_ADDRESS
UNREACHABLE_RPC = "http://127.0.0.1:9"
TRANSFER = devchain.TRANSFER_SELECTOR


class Clock:
    """Real time plus an offset the test can move forward."""

    def __init__(self) -> None:
        self.offset = dt.timedelta()

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.offset

    def advance(self, **kwargs: float) -> None:
        self.offset += dt.timedelta(**kwargs)

    def now_ms(self) -> int:
        return int(self().timestamp() * 1000)


async def rpc(url: str, method: str, params: list[Any] | None = None) -> Any:
    async with httpx.AsyncClient(timeout=10) as http:
        payload = (
            await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
        ).json()
    if "error" in payload:
        raise RuntimeError(f"{method}: {payload['error']}")
    return payload["result"]


@dataclass
class Chain:
    name: str
    chain_id: int
    rpc_url: str
    tokens: dict[str, str]

    async def receipt(self, tx_hash: str) -> dict[str, Any] | None:
        result = await rpc(self.rpc_url, "eth_getTransactionReceipt", [tx_hash])
        return dict(result) if result else None

    async def mined(self, tx_hash: str, *, within_s: float = 10.0) -> dict[str, Any]:
        """The receipt once the transaction is mined. Anvil answers ``eth_sendTransaction`` before the
        block that holds it is sealed, so a receipt asked for at once can be missing (a CI run's
        ``fund`` read none)."""
        deadline = time.monotonic() + within_s
        while (receipt := await self.receipt(tx_hash)) is None:
            assert time.monotonic() < deadline, f"{tx_hash} was not mined within {within_s} s"
            await asyncio.sleep(0.02)
        return receipt

    async def mine(self) -> None:
        await rpc(self.rpc_url, "evm_mine")

    async def set_automine(self, enabled: bool) -> None:
        await rpc(self.rpc_url, "evm_setAutomine", [enabled])

    async def token_balance(self, token: str, holder: str) -> int:
        data = "0x70a08231" + holder.lower().removeprefix("0x").rjust(64, "0")
        return int(
            await rpc(self.rpc_url, "eth_call", [{"to": self.tokens[token], "data": data}, "latest"]), 16
        )


@dataclass
class Wallet:
    account: LocalAccount

    @property
    def address(self) -> str:
        return str(self.account.address)

    def sign(self, message: str) -> str:
        return "0x" + bytes(self.account.sign_message(encode_defunct(text=message)).signature).hex()

    def auth(self, now_ms: int, *, address: str | None = None, nonce: str | None = None) -> dict[str, str]:
        address = address or self.address
        nonce = nonce or str(uuid.uuid4())
        timestamp = str(now_ms)
        return {
            "X-Wallet-Address": address,
            "X-Signature": self.sign(f"{address}:{timestamp}:{nonce}"),
            "X-Timestamp": timestamp,
            "X-Nonce": nonce,
        }

    async def fund(self, chain: Chain, *, tokens_raw: int = 1_000 * 10**6) -> None:
        await rpc(chain.rpc_url, "anvil_setBalance", [self.address, hex(10**19)])
        for address in chain.tokens.values():
            tx = await rpc(
                chain.rpc_url,
                "eth_sendTransaction",
                [
                    {
                        "from": devchain.DEMO_ADDRESS,
                        "to": address,
                        "data": devchain.encode_call(devchain.MINT_SELECTOR, self.address, tokens_raw),
                    }
                ],
            )
            assert (await chain.mined(tx))["status"] == "0x1"

    async def send(self, chain: Chain, to: str, data: str, *, gas: int = 120_000) -> str:
        nonce = int(await rpc(chain.rpc_url, "eth_getTransactionCount", [self.address, "pending"]), 16)
        gas_price = int(await rpc(chain.rpc_url, "eth_gasPrice"), 16)
        tx = {
            "to": to,
            "data": data,
            "value": 0,
            "gas": gas,
            "maxFeePerGas": gas_price * 2 + 1,
            "maxPriorityFeePerGas": 1,
            "nonce": nonce,
            "chainId": chain.chain_id,
        }
        signed = self.account.sign_transaction(tx)
        return str(
            await rpc(chain.rpc_url, "eth_sendRawTransaction", ["0x" + bytes(signed.raw_transaction).hex()])
        )

    async def transfer(self, chain: Chain, token: str, amount_raw: int, *, to: str = RECIPIENT) -> str:
        """A real ERC-20 ``transfer(to, amount)`` (the payment); returns the tx hash once mined."""
        tx_hash = await self.send(chain, chain.tokens[token], devchain.encode_call(TRANSFER, to, amount_raw))
        await chain.mined(tx_hash)
        return tx_hash


def new_wallet() -> Wallet:
    return Wallet(Account.create())


@pytest.fixture(scope="package")
def devchains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Chain]]:
    state_dir = tmp_path_factory.mktemp("devchain")
    try:
        info = devchain.up(state_dir)
    except devchain.DevChainError as exc:
        pytest.fail(f"the dev chain could not start ({exc}); run `make devchain-deps`")
    try:
        yield {
            name: Chain(name=name, chain_id=c["chain_id"], rpc_url=c["rpc_url"], tokens=c["tokens"])
            for name, c in info["chains"].items()
        }
    finally:
        devchain.down(state_dir)


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def static_site(name: str, html: str, *, port: int, months: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "uniqueName": name,
        "displayName": "Test Site",
        "months": months,
        "settings": {"port": port},
        "upload": {"type": "files", "files": [{"path": "index.html", "content": b64(html)}]},
        **extra,
    }


def unique_name(prefix: str = "app") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Gateway:
    url: str
    http: httpx.AsyncClient
    services: Services
    provider: SandboxProvider
    clock: Clock
    settings: GatewaySettings
    chains: dict[str, Chain] = field(default_factory=dict)

    def auth(self, wallet: Wallet, **kwargs: Any) -> dict[str, str]:
        return wallet.auth(self.clock.now_ms(), **kwargs)

    async def deploy(self, wallet: Wallet, body: dict[str, Any], **headers: str) -> httpx.Response:
        return await self.http.post("/agent/deploy", json=body, headers={**self.auth(wallet), **headers})

    async def status(self, wallet: Wallet, project_id: str, deployment_id: str) -> httpx.Response:
        return await self.http.get(
            f"/agent/deploy/{project_id}/{deployment_id}/status", headers=self.auth(wallet)
        )

    async def wait_terminal(
        self, wallet: Wallet, project_id: str, deployment_id: str, timeout_s: float = 60
    ) -> dict[str, Any]:
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            response = await self.status(wallet, project_id, deployment_id)
            assert response.status_code == 200, response.text
            body = dict(response.json())
            if body["status"] != "deploying" or loop.time() > deadline:
                return body
            await asyncio.sleep(0.2)

    async def projects(self, wallet: Wallet) -> dict[str, Any]:
        response = await self.http.get("/agent/projects", headers=self.auth(wallet))
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def grant_credits(self, wallet: Wallet, usd: Decimal) -> None:
        """Credits without a chain: the same ledger entry a verified payment writes."""
        async with transaction(self.services.sessions) as session:
            await credits.top_up(
                session,
                wallet.address.lower(),
                int(usd * 1_000_000),
                "0x" + uuid.uuid4().hex * 2,
                self.clock(),
            )


def gateway_settings(tmp_path: Path, database_url: str | None = None, **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "gw",
        "database_url": database_url or f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        "recipient": RECIPIENT,
        "rpc_url_base": UNREACHABLE_RPC,
        "rpc_url_arbitrum": UNREACHABLE_RPC,
        "rpc_timeout_s": 3.0,
        "static_monthly_usd": Decimal("1.813947"),
        "ready_timeout_s": 30.0,
        "install_timeout_s": 60.0,
        "build_timeout_s": 60.0,
        "metering_interval_s": 3600.0,
    }
    values.update(overrides)
    return GatewaySettings(**values)


@asynccontextmanager
async def running_gateway(
    settings: GatewaySettings,
    tmp_path: Path,
    *,
    chains: dict[str, Chain] | None = None,
    pricing: PricingSource | None = None,
    provider: SandboxProvider | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[Gateway]:
    """A gateway on 127.0.0.1; sandboxes from ``provider`` (default: the local fake); time from ``clock``
    (default: real time plus an offset)."""
    clock = clock or Clock()
    provider = provider or LocalSandboxProvider(tmp_path / "sandboxes")
    app = create_app(settings, sandbox_provider=provider, clock=clock, pricing=pricing, run_workers=False)
    async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        yield Gateway(
            url=server.url,
            http=http,
            services=app.state.services,
            provider=provider,
            clock=clock,
            settings=settings,
            chains=chains or {},
        )


def chain_overrides(chains: dict[str, Chain]) -> dict[str, Any]:
    return {f"rpc_url_{name}": chain.rpc_url for name, chain in chains.items()}


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway whose chain RPCs are unreachable: for everything that never touches a chain."""
    async with running_gateway(gateway_settings(tmp_path), tmp_path) as gw:
        yield gw


@pytest.fixture
async def chain_gateway(tmp_path: Path, devchains: dict[str, Chain]) -> AsyncIterator[Gateway]:
    """A gateway on the local anvil chains, SQLite database."""
    settings = gateway_settings(tmp_path, **chain_overrides(devchains))
    async with running_gateway(settings, tmp_path, chains=devchains) as gw:
        yield gw


@pytest.fixture
async def paying_wallet(devchains: dict[str, Chain]) -> Wallet:
    wallet = new_wallet()
    for chain in devchains.values():
        await wallet.fund(chain)
    return wallet


def x402_settings(tmp_path: Path, chains: dict[str, Chain]) -> GatewaySettings:
    """A gateway on the local anvil chains that offers and settles x402 with the dev chain's key."""
    return gateway_settings(
        tmp_path,
        settlement_private_key=devchain.SETTLEMENT_PRIVATE_KEY,
        public_url="https://gateway.example",
        rate_limit_requests=1_000,  # x402 tests send many requests from one wallet on purpose
        **chain_overrides(chains),
    )


@pytest.fixture
async def x402_gateway(tmp_path: Path, devchains: dict[str, Chain]) -> AsyncIterator[Gateway]:
    async with running_gateway(x402_settings(tmp_path, devchains), tmp_path, chains=devchains) as gw:
        yield gw
