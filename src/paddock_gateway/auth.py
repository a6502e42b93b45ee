"""Wallet authentication (§3): EIP-191 signatures over ``address:timestamp:nonce``, single-use nonces.

The checks run in the contract's order and the first failure decides: headers present, their syntax,
the timestamp window, the signature, then the atomic nonce insert — so forged requests never burn a
nonce. Header values are used exactly as received: the message is built from the raw strings.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils.address import to_checksum_address
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.db import transaction
from paddock_gateway.errors import AuthError
from paddock_gateway.models import Nonce

ADDRESS_RE = re.compile(r"^0x[0-9a-fA-F]{40}$")
SIGNATURE_RE = re.compile(r"^0x[0-9a-fA-F]{130}$")
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


def signed_message(address: str, timestamp: str, nonce: str) -> str:
    return f"{address}:{timestamp}:{nonce}"


def signature_bytes(signature: str) -> bytes:
    """65 bytes r‖s‖v; a v of 0/1 becomes 27/28 (App. A.2); any other v is malformed."""
    raw = bytearray(bytes.fromhex(signature[2:]))
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


def verify_headers(headers: Mapping[str, str], now_ms: int, skew_ms: int) -> tuple[Caller, str]:
    """Steps 1–4 of §3.4; returns the caller and the lowercase nonce to consume."""
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
    signer = recover_signer(signed_message(address, timestamp, nonce), "0x" + sig.hex())
    if signer != address.lower():
        raise AuthError("auth_invalid_signature")
    return Caller(wallet=address.lower()), nonce.lower()


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
) -> Caller:
    now_ms = int(now.timestamp() * 1000)
    caller, nonce = verify_headers(headers, now_ms, skew_ms)
    await consume_nonce(sessions, caller.wallet, nonce, now)
    return caller


async def prune_nonces(sessions: async_sessionmaker[AsyncSession], now: dt.datetime, retention_s: int) -> int:
    """Forget nonces older than the retention (≥ 2 × the skew window); the timestamp check covers them."""
    cutoff = now - dt.timedelta(seconds=max(retention_s, 120))
    async with transaction(sessions) as session:
        result = await session.execute(delete(Nonce).where(Nonce.created_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)
