"""``ChainClient``: the few JSON-RPC calls payment verification, balances and x402 settlement need,
over web3.py.

Every failure below (connection refused, timeout, JSON-RPC error, malformed answer) becomes
``ChainError`` here, so the domain never sees a web3 or aiohttp exception. A call or gas estimate that
the contract itself reverts is ``CallReverted`` instead: that is an answer about the payment, not an
unreachable chain.

The transport is ``OwnSessionProvider``, not web3's ``AsyncHTTPProvider``. web3 hands out its aiohttp
sessions under one process-wide ``threading.Lock`` taken in a thread pool; a call cancelled while it
waits for that lock (a ``wait_for`` timeout, a client gone, a shutting-down loop) leaves the lock taken
by the pool thread for good, and every later chain call in the process hangs. CI saw it: a gateway
start-up stuck in ``check_chains`` for 120 s. Each ``ChainClient`` owns its session instead.

CCIP read (EIP-3668) is off. With it on, an ``eth_call`` to a contract that reverts with
``OffchainLookup`` makes web3 fetch the URLs the contract names, from the gateway's own network; the
wallets whose signatures the gateway checks are contracts a tenant deploys, so that would be an outbound
connection a tenant steers (docs/security.md, rule 1). Such a revert is just ``CallReverted`` here.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import aiohttp
from web3 import AsyncWeb3
from web3.exceptions import ContractLogicError, TransactionNotFound, Web3Exception
from web3.providers.async_base import AsyncJSONBaseProvider
from web3.types import RPCEndpoint, RPCResponse

BALANCE_OF_SELECTOR = "0x70a08231"

# A node's answer is read whole into memory; no answer to the calls below comes near this (a receipt
# with thousands of logs is a few MiB).
MAX_ANSWER_BYTES = 32 * 1024 * 1024

# Idle connections are reused for this long: under the 5 s keep-alive of common HTTP servers, so a
# request never goes out on a connection the node is closing.
IDLE_REUSE_S = 4.0


class ChainError(Exception):
    """The chain's RPC could not be reached or gave an unusable answer."""


class CallReverted(Exception):
    """The contract reverted an ``eth_call`` or ``eth_estimateGas``; the message is its reason."""


@dataclass(frozen=True)
class TxLog:
    address: str  # lowercase
    topics: tuple[str, ...]  # 0x-prefixed lowercase hex
    data: str  # 0x-prefixed lowercase hex
    removed: bool


@dataclass(frozen=True)
class Receipt:
    status: int
    block_number: int
    logs: tuple[TxLog, ...]


def _hex(value: Any) -> str:
    if isinstance(value, str):
        return value.lower() if value.startswith("0x") else "0x" + value.lower()
    return "0x" + bytes(value).hex()


class OwnSessionProvider(AsyncJSONBaseProvider):
    """JSON-RPC over HTTP(S) through one aiohttp session this provider owns (see the module's doc for
    why not web3's own). web3 still encodes the requests and formats the answers and errors."""

    global_ccip_read_enabled = False

    def __init__(self, rpc_url: str, *, timeout_s: float) -> None:
        super().__init__()
        self.rpc_url = rpc_url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        # A session belongs to the loop it was made on; a client used from another loop (a test's
        # next event loop) gets a new one.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=IDLE_REUSE_S),
                headers={"Content-Type": "application/json"},
            )
            self._session_loop = loop
        return self._session

    async def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        body = self.encode_rpc_request(method, params)
        async with self._session_now().post(self.rpc_url, data=body, timeout=self._timeout) as response:
            response.raise_for_status()
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise ChainError(f"the node's answer to {method} is over {MAX_ANSWER_BYTES} bytes")
                chunks.append(chunk)
        return self.decode_rpc_response(b"".join(chunks))

    async def disconnect(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed and self._session_loop is asyncio.get_running_loop():
            await session.close()


class ChainClient:
    def __init__(self, rpc_url: str, *, timeout_s: float = 10.0) -> None:
        self.rpc_url = rpc_url
        self.w3 = AsyncWeb3(OwnSessionProvider(rpc_url, timeout_s=timeout_s))
        self._chain_id: int | None = None

    async def _call(self, coro: Any) -> Any:
        if not self.rpc_url:
            coro.close()
            raise ChainError("no RPC URL configured")
        try:
            return await coro
        except TransactionNotFound:
            raise
        except ContractLogicError as exc:
            raise CallReverted(str(exc.message or exc)) from exc
        except (TimeoutError, Web3Exception, aiohttp.ClientError, OSError, ValueError) as exc:
            raise ChainError(f"{type(exc).__name__}: {exc}") from exc

    async def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(await self._call(self.w3.eth.chain_id))
        return self._chain_id

    async def block_number(self) -> int:
        return int(await self._call(self.w3.eth.get_block_number()))

    async def get_receipt(self, tx_hash: str) -> Receipt | None:
        """The receipt of a mined transaction; None if the node has no receipt (unknown or pending)."""
        try:
            raw = await self._call(self.w3.eth.get_transaction_receipt(tx_hash))  # type: ignore[arg-type]
        except TransactionNotFound:
            return None
        if raw is None or raw.get("blockNumber") is None:
            return None
        try:
            logs = tuple(
                TxLog(
                    address=str(log["address"]).lower(),
                    topics=tuple(_hex(topic) for topic in log["topics"]),
                    data=_hex(log["data"]),
                    removed=bool(log.get("removed", False)),
                )
                for log in raw["logs"]
            )
            return Receipt(status=int(raw["status"]), block_number=int(raw["blockNumber"]), logs=logs)
        except (KeyError, TypeError, ValueError) as exc:
            raise ChainError(f"malformed receipt: {exc}") from exc

    async def transaction_known(self, tx_hash: str) -> bool:
        """Whether the node knows the transaction at all (mined or in its mempool)."""
        try:
            tx = await self._call(self.w3.eth.get_transaction(tx_hash))  # type: ignore[arg-type]
        except TransactionNotFound:
            return False
        return tx is not None

    async def balance_of(self, token: str, holder: str) -> int:
        data = BALANCE_OF_SELECTOR + holder.lower().removeprefix("0x").rjust(64, "0")
        call = {"to": AsyncWeb3.to_checksum_address(token), "data": data}
        result = await self._call(self.w3.eth.call(call))  # type: ignore[arg-type]
        return int.from_bytes(bytes(result), "big") if len(bytes(result)) else 0

    async def call(self, to: str, data: str, *, sender: str | None = None) -> bytes:
        """``eth_call`` at the latest block; ``CallReverted`` if the contract reverts."""
        tx: dict[str, Any] = {"to": AsyncWeb3.to_checksum_address(to), "data": data}
        if sender is not None:
            tx["from"] = AsyncWeb3.to_checksum_address(sender)
        return bytes(await self._call(self.w3.eth.call(tx)))  # type: ignore[arg-type]

    async def get_code(self, address: str) -> bytes:
        """The runtime code at ``address`` (empty for an EOA or an address nothing was deployed to)."""
        code = self.w3.eth.get_code(AsyncWeb3.to_checksum_address(address))
        return bytes(await self._call(code))

    async def call_creation(self, data: str) -> bytes:
        """``eth_call`` without ``to``: runs ``data`` as contract creation code at the latest block and
        returns what the constructor returned. Nothing is deployed (a "deployless" call)."""
        return bytes(await self._call(self.w3.eth.call({"data": data})))  # type: ignore[typeddict-item]

    async def estimate_gas(self, sender: str, to: str, data: str) -> int:
        """A full simulation of the call from ``sender``; ``CallReverted`` if it would revert."""
        tx = {
            "from": AsyncWeb3.to_checksum_address(sender),
            "to": AsyncWeb3.to_checksum_address(to),
            "data": data,
        }
        return int(await self._call(self.w3.eth.estimate_gas(tx)))  # type: ignore[arg-type]

    async def pending_nonce(self, address: str) -> int:
        count = self.w3.eth.get_transaction_count(AsyncWeb3.to_checksum_address(address), "pending")
        return int(await self._call(count))

    async def gas_price(self) -> int:
        return int(await self._call(self.w3.eth.gas_price))

    async def send_raw_transaction(self, raw: bytes) -> str:
        return _hex(await self._call(self.w3.eth.send_raw_transaction(raw)))

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):  # closing is best-effort
            await self.w3.provider.disconnect()
