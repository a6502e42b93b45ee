"""Smart-wallet signatures: EIP-1271 checked on chain, ERC-6492 for wallets not deployed yet.

An EOA's signature is checked locally (ECDSA recovery) by whoever asks first: wallet auth (``auth``),
x402 payments (``settlement``) and SIWx (``siwx``). Only when it does not recover to the claimed address
do they ask ``SignatureVerifier``, which reads the chain through the gateway's ``ChainClient``:

- the address has code: EIP-1271, ``isValidSignature(hash, signature)`` must return ``0x1626ba7e`` (an
  ERC-6492-wrapped signature of a wallet that has since been deployed is unwrapped first);
- no code, and the signature ends with ERC-6492's magic suffix (``abi.encode(factory, factoryCalldata,
  signature) ‖ 0x6492…6492``): the gateway's ``ValidateSigOffchain`` creation code
  (``devchain/contracts/UniversalSigValidator.sol``, packaged as ``sig_validator.json``) runs in one
  ``eth_call`` without ``to``: its constructor calls the factory (deploying the wallet in that call's
  scratch state only) and then ``isValidSignature``, and returns one word, 1 or 0. Nothing is deployed;
- no code and no suffix: nothing more to check (the ECDSA recovery already failed).

Each check is bounded by ``timeout_s`` and its answer is kept ``ttl_s`` per (chain, address, hash,
signature), at most ``max_entries`` of them; an RPC that fails or times out raises ``ChainError``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode as abi_encode
from eth_keys.datatypes import Signature
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from paddock_gateway.adapters.chain import CallReverted, ChainClient, ChainError

EIP1271_MAGIC = bytes.fromhex("1626ba7e")
ERC6492_SUFFIX = bytes.fromhex("6492" * 16)
IS_VALID_SIGNATURE = keccak(text="isValidSignature(bytes32,bytes)")[:4]
VALIDATOR_ARTIFACT = Path(__file__).with_name("sig_validator.json")

EOA, EIP1271, EIP6492 = "eoa", "eip1271", "eip6492"


@dataclass(frozen=True)
class Verdict:
    """What the chain said: ``valid``; ``scheme`` (``eip1271`` for a deployed wallet, ``eip6492`` for a
    counterfactual one, ``eoa`` when the address has no code and nothing more could be tried);
    ``deployed`` whether the address has code; ``signature`` the one the wallet itself accepts (the
    inner signature of an ERC-6492 wrapper once the wallet exists, else the signature as sent)."""

    valid: bool
    scheme: str
    deployed: bool
    signature: bytes

    @property
    def reason(self) -> str:
        """Why a signature was refused, for the 401's ``reason``."""
        return f"{self.scheme}_signature_rejected" if self.scheme != EOA else "signature_mismatch"


def recover(digest: bytes, signature: bytes) -> str | None:
    """The lowercase address whose key made the 65-byte (r, s, v) ``signature`` over ``digest``; None
    if it is not one (another length, a v other than 0/1/27/28, invalid r or s)."""
    if len(signature) != 65:
        return None
    v = signature[64] - 27 if signature[64] >= 27 else signature[64]
    if v not in (0, 1):
        return None
    try:
        key = Signature(signature_bytes=signature[:64] + bytes([v])).recover_public_key_from_msg_hash(digest)
    except Exception:  # eth_keys raises several types for invalid r/s values
        return None
    return str(key.to_checksum_address()).lower()


def is_erc6492(signature: bytes) -> bool:
    return len(signature) > 32 and signature[-32:] == ERC6492_SUFFIX


def unwrap_erc6492(signature: bytes) -> tuple[str, bytes, bytes] | None:
    """(factory, factory calldata, inner signature) of a wrapped signature; None if it is malformed."""
    try:
        factory, calldata, inner = abi_decode(["address", "bytes", "bytes"], signature[:-32])
    except Exception:  # eth_abi raises several decoding errors
        return None
    return str(factory).lower(), bytes(calldata), bytes(inner)


def wrap_erc6492(factory: str, factory_calldata: bytes, signature: bytes) -> bytes:
    """The ERC-6492 wrapper a counterfactual wallet signs with (the tests' and any client's helper)."""
    wrapped = abi_encode(
        ["address", "bytes", "bytes"], [to_checksum_address(factory), factory_calldata, signature]
    )
    return wrapped + ERC6492_SUFFIX


@cache
def validator_creation_code() -> bytes:
    artifact = json.loads(VALIDATOR_ARTIFACT.read_text())
    return bytes.fromhex(str(artifact["bytecode"]).removeprefix("0x"))


def validator_call(address: str, digest: bytes, signature: bytes) -> str:
    """Creation code of ``ValidateSigOffchain`` followed by its constructor's arguments."""
    args = abi_encode(["address", "bytes32", "bytes"], [to_checksum_address(address), digest, signature])
    return "0x" + (validator_creation_code() + args).hex()


def is_valid_signature_call(digest: bytes, signature: bytes) -> str:
    return "0x" + (IS_VALID_SIGNATURE + abi_encode(["bytes32", "bytes"], [digest, signature])).hex()


class SignatureVerifier:
    """EIP-1271 and ERC-6492 checks through a ``ChainClient``, bounded in time, their answers cached."""

    def __init__(self, *, timeout_s: float = 5.0, ttl_s: float = 30.0, max_entries: int = 10_000) -> None:
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._answers: OrderedDict[tuple[str, str, bytes, bytes], tuple[float, Verdict]] = OrderedDict()

    async def verify(self, client: ChainClient, address: str, digest: bytes, signature: bytes) -> Verdict:
        """Whether the contract at ``address`` (or the one ERC-6492 says will be there) accepts
        ``signature`` over ``digest``. ``ChainError`` if the chain cannot say within ``timeout_s``."""
        key = (client.rpc_url, address.lower(), digest, keccak(signature))
        now = time.monotonic()
        kept = self._answers.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        try:
            verdict = await asyncio.wait_for(self._verify(client, address, digest, signature), self.timeout_s)
        except TimeoutError as exc:
            raise ChainError(f"no answer within {self.timeout_s:g}s") from exc
        self._answers[key] = (now + self.ttl_s, verdict)
        self._answers.move_to_end(key)
        while len(self._answers) > self.max_entries:
            self._answers.popitem(last=False)
        return verdict

    async def _verify(self, client: ChainClient, address: str, digest: bytes, signature: bytes) -> Verdict:
        wrapped = unwrap_erc6492(signature) if is_erc6492(signature) else None
        code = await client.get_code(address)
        if code:
            inner = wrapped[2] if wrapped is not None else signature
            try:
                answer = await client.call(address, is_valid_signature_call(digest, inner))
            except CallReverted:
                answer = b""
            return Verdict(answer[:4] == EIP1271_MAGIC, EIP1271, True, inner)
        if wrapped is not None:
            try:
                answer = await client.call_creation(validator_call(address, digest, signature))
            except CallReverted:
                answer = b""
            return Verdict(int.from_bytes(answer[:32] or b"\0", "big") == 1, EIP6492, False, signature)
        return Verdict(False, EOA, False, signature)

    async def verify_on_any(
        self, clients: list[ChainClient], address: str, digest: bytes, signature: bytes
    ) -> Verdict:
        """For a signature bound to no chain (wallet auth): valid if the wallet on any of the gateway's
        chains accepts it, tried in the registry's order. ``ChainError`` only if no chain said yes and at
        least one could not be asked."""
        results = await asyncio.gather(
            *(self.verify(client, address, digest, signature) for client in clients), return_exceptions=True
        )
        verdicts = [result for result in results if isinstance(result, Verdict)]
        for verdict in verdicts:
            if verdict.valid:
                return verdict
        for result in results:
            if isinstance(result, ChainError):
                raise result
            if isinstance(result, BaseException):
                raise result
        deployed = [verdict for verdict in verdicts if verdict.deployed]
        return (deployed or verdicts)[0]
