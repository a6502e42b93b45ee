"""``ChainClient`` against a real anvil chain: calls cancelled midway (a ``wait_for`` timeout, a client
that went away) leave later calls working, and a contract reverting with EIP-3668 ``OffchainLookup``
is a plain revert that sends the gateway nowhere."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import pytest
from eth_abi.abi import encode as abi_encode
from eth_utils.address import to_checksum_address

from paddock_gateway.adapters.chain import MAX_ANSWER_BYTES, CallReverted, ChainClient, ChainError
from tests.gateway.conftest import Chain, rpc

OFFCHAIN_LOOKUP_SELECTOR = bytes.fromhex("556f1830")  # OffchainLookup(address,string[],bytes,bytes4,bytes)


def reverting_code(payload: bytes) -> bytes:
    """Runtime code that reverts with ``payload`` on any call: CODECOPY the bytes after this 15-byte
    header into memory, then REVERT with them."""
    n = len(payload).to_bytes(2, "big")
    header = b"\x61" + n + b"\x61\x00\x0f" + b"\x60\x00" + b"\x39" + b"\x61" + n + b"\x60\x00" + b"\xfd"
    assert len(header) == 15
    return header + payload


async def test_calls_cancelled_midway_do_not_stop_later_calls(devchains: dict[str, Chain]) -> None:
    chain = devchains["base"]
    clients = [ChainClient(chain.rpc_url) for _ in range(4)]
    try:
        # Cancel at each point a call can be in: not started, getting its connection, waiting on
        # the node. One call of each round runs to the end.
        for steps in range(8):
            calls = [asyncio.ensure_future(client.block_number()) for client in clients]
            for _ in range(steps):
                await asyncio.sleep(0)
            for call in calls[1:]:
                call.cancel()
            finished = await asyncio.gather(*calls, return_exceptions=True)
            assert isinstance(finished[0], int), finished[0]
    finally:
        for client in clients:
            await client.aclose()
    fresh = ChainClient(chain.rpc_url)
    try:
        assert await asyncio.wait_for(fresh.chain_id(), 10) == chain.chain_id
        assert await asyncio.wait_for(clients[1].chain_id(), 10) == chain.chain_id  # closed, used again
    finally:
        await fresh.aclose()
        await clients[1].aclose()


async def test_an_offchain_lookup_revert_is_a_revert_and_fetches_nothing(
    devchains: dict[str, Chain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's wallet contract can revert with ``OffchainLookup`` naming any URL; a CCIP-reading
    client would look the host up and fetch it from the gateway's network. Name lookups are recorded
    (and refused, so nothing leaves this machine even if the client did try)."""
    chain = devchains["base"]
    lookups: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def recording_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".test"):
            lookups.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "refused by the test")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording_getaddrinfo)
    address = to_checksum_address("0x" + uuid.uuid4().hex + "0" * 8)
    payload = OFFCHAIN_LOOKUP_SELECTOR + abi_encode(
        ["address", "string[]", "bytes", "bytes4", "bytes"],
        [address, ["https://ccip.paddock.test/{sender}/{data}.json"], b"\x12\x34", b"\xab\xcd\xef\x01", b""],
    )
    await rpc(chain.rpc_url, "anvil_setCode", [address, "0x" + reverting_code(payload).hex()])
    client = ChainClient(chain.rpc_url)
    try:
        with pytest.raises(CallReverted):
            await client.call(address, "0x12345678")
        assert await client.get_code(address) == reverting_code(payload)  # the contract is there
    finally:
        await client.aclose()
    assert lookups == []


async def test_an_answer_over_the_bound_is_refused() -> None:
    """A node (or something posing as one) that sends an endless answer costs the gateway at most
    ``MAX_ANSWER_BYTES`` of memory, then a ``ChainError``."""

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"[" + b" " * 65_535
        try:
            for _ in range(MAX_ANSWER_BYTES // len(chunk) + 8):
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ChainClient(f"http://127.0.0.1:{port}", timeout_s=60)
    try:
        with pytest.raises(ChainError, match="over"):
            await client.block_number()
    finally:
        await client.aclose()
        server.close()
