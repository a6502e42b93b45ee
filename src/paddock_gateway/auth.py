"""Wallet authentication (§3): EIP-191 signatures over ``address:timestamp:nonce``, single-use nonces.

The checks run in the contract's order and the first failure decides: headers present, their syntax,
the timestamp window, the signature, then the atomic nonce insert — so forged requests never burn a
nonce. Header values are used exactly as received: the message is built from the raw strings.

The signature is an EOA's if it recovers (ECDSA) to ``X-Wallet-Address``: no chain is read. Otherwise
the address may be a smart wallet: ``authenticate`` asks its ``contract_check`` (EIP-1271 on chain, or
ERC-6492 for a wallet not deployed yet, see ``signatures``), so ``X-Signature`` may be longer than 65
bytes. A 65-byte signature is read as (r, s, v) and its v must be 0, 1, 27 or 28.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.db import transaction
from paddock_gateway.adapters.chain import ChainError
from paddock_gateway.errors import AuthError
from paddock_gateway.models import Nonce
from paddock_gateway.signatures import Verdict

ADDRESS_RE = re.compile(r"^0x[0-9a-fA-F]{40}$")
#: 65 bytes (an EOA's r ‖ s ‖ v) up to 2 KiB (a contract wallet's, an ERC-6492 wrapper with its factory call).
MAX_SIGNATURE_BYTES = 2048
SIGNATURE_RE = re.compile(r"^0x(?:[0-9a-fA-F]{2}){65,2048}$")
TIMESTAMP_RE = re.compile(r"^[0-9]+$")
MAX_TIMESTAMP_DIGITS = 19  # longer values are syntactically fine but necessarily outside the window
NONCE_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
HEADERS = ("x-wallet-address", "x-signature", "x-timestamp", "x-nonce")


@dataclass(frozen=True)
class Caller:
    """The authenticated wallet: ``wallet`` is lowercase, ``address`` is EIP-55."""

    wallet: str

    @property
    def address(self) -> str:
        return to_checksum_address(self.wallet)


#: A smart wallet's check: (address, EIP-191 digest, signature) → the chain's verdict.
ContractCheck = Callable[[str, bytes, bytes], Awaitable[Verdict]]


def signed_message(address: str, timestamp: str, nonce: str) -> str:
    return f"{address}:{timestamp}:{nonce}"


def eip191_digest(message: str) -> bytes:
    """What personal_sign signs: keccak256("\\x19Ethereum Signed Message:\\n" ‖ len ‖ message)."""
    raw = message.encode()
    return keccak(b"\x19Ethereum Signed Message:\n" + str(len(raw)).encode() + raw)


def signature_bytes(signature: str) -> bytes:
    """65 bytes r‖s‖v: a v of 0/1 becomes 27/28 (App. A.2), any other v is malformed. Longer signatures
    (a contract wallet's) are returned as sent."""
    raw = bytearray(bytes.fromhex(signature[2:]))
    if len(raw) != 65:
        return bytes(raw)
    if raw[64] in (0, 1):
        raw[64] += 27
    if raw[64] not in (27, 28):
        raise AuthError("auth_malformed")
    return bytes(raw)


def recover_signer(message: str, signature: str) -> str | None:
    """The lowercase address that signed ``message`` (EIP-191 personal_sign), or None if unrecoverable."""
    sig = signature_bytes(signature)
    try:
        return str(Account.recover_message(encode_defunct(text=message), signature=sig)).lower()
    except Exception:  # eth_keys raises several types for invalid r/s values
        return None


@dataclass(frozen=True)
class SignedHeaders:
    """Steps 1–3 passed: the message as built from the raw headers and its signature."""

    address: str
    message: str
    signature: bytes
    nonce: str  # lowercase


def parse_headers(headers: Mapping[str, str], now_ms: int, skew_ms: int) -> SignedHeaders:
    """Steps 1–3 of §3.4: presence, syntax, timestamp window."""
    values = [headers.get(name) for name in HEADERS]
    if any(value is None for value in values):
        raise AuthError("auth_missing")
    address, signature, timestamp, nonce = (str(value) for value in values)
    if not (
        ADDRESS_RE.match(address)
        and SIGNATURE_RE.match(signature)
        and TIMESTAMP_RE.match(timestamp)
        and NONCE_RE.match(nonce)
    ):
        raise AuthError("auth_malformed")
    sig = signature_bytes(signature)  # may raise auth_malformed for a bad v
    if len(timestamp.lstrip("0")) > MAX_TIMESTAMP_DIGITS or abs(now_ms - int(timestamp)) > skew_ms:
        raise AuthError("auth_expired")
    return SignedHeaders(address, signed_message(address, timestamp, nonce), sig, nonce.lower())


def verify_headers(headers: Mapping[str, str], now_ms: int, skew_ms: int) -> tuple[Caller, str]:
    """Steps 1–4 of §3.4 for an EOA (no chain read); returns the caller and the lowercase nonce."""
    signed = parse_headers(headers, now_ms, skew_ms)
    if not eoa_signed(signed):
        raise AuthError("auth_invalid_signature")
    return Caller(wallet=signed.address.lower()), signed.nonce


def eoa_signed(signed: SignedHeaders) -> bool:
    return len(signed.signature) == 65 and (
        recover_signer(signed.message, "0x" + signed.signature.hex()) == signed.address.lower()
    )


async def verify_signature(signed: SignedHeaders, contract_check: ContractCheck | None) -> Caller:
    """Step 4: ECDSA recovery; failing that, the smart wallet's own answer on chain (if the gateway can
    ask one). A wallet that refuses, or a chain that cannot be asked, is 401 with the ``reason``."""
    caller = Caller(wallet=signed.address.lower())
    if eoa_signed(signed):
        return caller
    if contract_check is None:
        raise AuthError("auth_invalid_signature")
    try:
        verdict = await contract_check(signed.address, eip191_digest(signed.message), signed.signature)
    except ChainError as exc:
        raise AuthError("auth_invalid_signature", reason="contract_signature_unverifiable") from exc
    if not verdict.valid:
        if verdict.scheme == "eoa":  # no code on any chain and no ERC-6492 wrapper: an EOA's mismatch
            raise AuthError("auth_invalid_signature")
        raise AuthError("auth_invalid_signature", reason=verdict.reason)
    return caller


async def consume_nonce(
    sessions: async_sessionmaker[AsyncSession], wallet: str, nonce: str, now: dt.datetime
) -> None:
    """Step 5: an atomic insert of (wallet, nonce); a duplicate key means a replay."""
    try:
        async with transaction(sessions) as session:
            session.add(Nonce(wallet=wallet, nonce=nonce, created_at=now))
    except IntegrityError as exc:
        raise AuthError("auth_nonce_reused") from exc


async def authenticate(
    sessions: async_sessionmaker[AsyncSession],
    headers: Mapping[str, str],
    now: dt.datetime,
    *,
    skew_ms: int,
    contract_check: ContractCheck | None = None,
) -> Caller:
    now_ms = int(now.timestamp() * 1000)
    signed = parse_headers(headers, now_ms, skew_ms)
    caller = await verify_signature(signed, contract_check)
    await consume_nonce(sessions, caller.wallet, signed.nonce, now)
    return caller


async def prune_nonces(sessions: async_sessionmaker[AsyncSession], now: dt.datetime, retention_s: int) -> int:
    """Forget nonces older than the retention (≥ 2 × the skew window); the timestamp check covers them."""
    cutoff = now - dt.timedelta(seconds=max(retention_s, 120))
    async with transaction(sessions) as session:
        result = await session.execute(delete(Nonce).where(Nonce.created_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)
