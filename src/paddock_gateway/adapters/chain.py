"""``ChainClient``: the few JSON-RPC calls payment verification, balances and x402 settlement need,
over web3.py.

Every failure below (connection refused, timeout, JSON-RPC error, malformed answer) becomes
``ChainError`` here, so the domain never sees a web3 or aiohttp exception. A call or gas estimate that
the contract itself reverts is ``CallReverted`` instead: that is an answer about the payment, not an
unreachable chain.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import aiohttp
from web3 import AsyncWeb3
from web3.exceptions import ContractLogicError, TransactionNotFound, Web3Exception
from web3.providers.rpc import AsyncHTTPProvider

BALANCE_OF_SELECTOR = "0x70a08231"


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


class ChainClient:
    def __init__(self, rpc_url: str, *, timeout_s: float = 10.0) -> None:
        self.rpc_url = rpc_url
        provider = AsyncHTTPProvider(
            rpc_url,
            request_kwargs={"timeout": aiohttp.ClientTimeout(total=timeout_s)},
            exception_retry_configuration=None,
        )
        self.w3 = AsyncWeb3(provider)
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
