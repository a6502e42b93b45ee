"""On-chain payment verification (§7, rules V1–V11) and the payment ledger (§8).

``verify_transfer`` reads the chain through a ``ChainClient`` only and never writes anything; a
failure raises ``PaymentVerificationFailed`` with the §7.2 ``reason`` (V10: no record, so the same
hash can be submitted again). The ledger functions make a hash single-use:

- ``record_verified`` inserts the row in state ``verified``; the primary key on the lowercased hash
  turns a concurrent duplicate into ``PaymentAlreadyProcessed`` (409).
- ``credit`` moves ``verified → credited`` with a conditional UPDATE **and** tops up in the same
  transaction, so of any number of racing requests exactly one gets to credit and deploy.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.db import transaction
from paddock_gateway import credits
from paddock_gateway.adapters.chain import ChainClient, ChainError, Receipt
from paddock_gateway.errors import (
    InvalidTxHash,
    PaymentAlreadyProcessed,
    PaymentVerificationFailed,
    TopupFailed,
    UpstreamUnavailable,
)
from paddock_gateway.models import Payment
from paddock_gateway.registry import ChainSpec, TokenSpec

TX_HASH_RE = re.compile(r"^0x[0-9a-fA-F]{64}$")
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


@dataclass(frozen=True)
class VerifiedPayment:
    tx_hash: str
    wallet: str
    chain: str
    token: str
    amount_raw: int


def normalise_tx_hash(value: str) -> str:
    """V1: the syntax check; the hash is lowercased for storage and comparison."""
    if not TX_HASH_RE.match(value):
        raise InvalidTxHash()
    return value.lower()


def topic_address(topic: str) -> str:
    return "0x" + topic[-40:].lower()


def matching_transfers(receipt: Receipt, token_address: str, recipient: str, wallet: str) -> tuple[int, bool]:
    """V6/V7: the summed value of Transfer logs from the token to the recipient sent by ``wallet``, and
    whether logs matched everything but the sender."""
    total, other_sender = 0, False
    for log in receipt.logs:
        if (
            log.removed
            or log.address != token_address.lower()
            or len(log.topics) != 3
            or log.topics[0] != TRANSFER_TOPIC
            or topic_address(log.topics[2]) != recipient.lower()
        ):
            continue
        if topic_address(log.topics[1]) != wallet:
            other_sender = True
            continue
        try:
            total += int(log.data, 16) if log.data not in ("0x", "") else 0
        except ValueError:
            continue
    return total, other_sender


async def verify_transfer(
    client: ChainClient,
    chain: ChainSpec,
    token: TokenSpec,
    tx_hash: str,
    wallet: str,
    required_raw: int,
) -> VerifiedPayment:
    """V3–V9 against the chain named in ``X-Payment-Chain``; ``ChainError`` becomes 502."""

    def failed(reason: str, received: int | None = None) -> PaymentVerificationFailed:
        return PaymentVerificationFailed(
            reason=reason,
            tx_hash=tx_hash,
            chain=chain.name,
            token=token.name,
            required_amount_token=str(required_raw),
            received_amount_token=None if received is None else str(received),
        )

    try:
        if await client.chain_id() != chain.chain_id:  # V3: the RPC must be the named chain
            raise UpstreamUnavailable(f"the RPC for {chain.name} is not chain {chain.chain_id}")
        receipt = await client.get_receipt(tx_hash)
        if receipt is None:  # V4
            raise failed("tx_pending" if await client.transaction_known(tx_hash) else "tx_not_found")
        if receipt.status != 1:
            raise failed("tx_reverted")
        latest = await client.block_number()  # V5
        if latest - receipt.block_number + 1 < chain.confirmations:
            raise failed("insufficient_confirmations")
    except ChainError as exc:
        raise UpstreamUnavailable(f"the {chain.name} RPC is unavailable") from exc
    received, other_sender = matching_transfers(receipt, token.address, chain.recipient, wallet)  # V6
    if received == 0:
        raise failed("sender_mismatch" if other_sender else "no_matching_transfer")
    if received < required_raw:  # V7, V8 (same raw amount for both tokens), V9
        raise failed("amount_insufficient", received)
    return VerifiedPayment(
        tx_hash=tx_hash, wallet=wallet, chain=chain.name, token=token.name, amount_raw=received
    )


async def find(sessions: async_sessionmaker[AsyncSession], tx_hash: str) -> Payment | None:
    async with sessions() as session:
        return await session.get(Payment, tx_hash)


def already_processed(tx_hash: str) -> PaymentAlreadyProcessed:
    return PaymentAlreadyProcessed(tx_hash=tx_hash)


def check_reuse(record: Payment | None, wallet: str) -> Payment | None:
    """V2 / §8.2: None for a new hash, the record when this wallet may resume it, else 409."""
    if record is None:
        return None
    if record.state == "verified" and record.wallet == wallet:
        return record
    raise already_processed(record.tx_hash)


async def record_verified(
    sessions: async_sessionmaker[AsyncSession], payment: VerifiedPayment, now: dt.datetime
) -> None:
    try:
        async with transaction(sessions) as session:
            session.add(
                Payment(
                    tx_hash=payment.tx_hash,
                    wallet=payment.wallet,
                    chain=payment.chain,
                    token=payment.token,
                    amount_raw=payment.amount_raw,
                    state="verified",
                    created_at=now,
                    updated_at=now,
                )
            )
    except IntegrityError as exc:
        raise already_processed(payment.tx_hash) from exc


async def credit(
    sessions: async_sessionmaker[AsyncSession], tx_hash: str, wallet: str, now: dt.datetime
) -> int:
    """``verified → credited`` plus the top-up, atomically; returns the credited raw amount.

    Raises 409 if another request got there first, ``TopupFailed`` if the database refused.
    """
    try:
        async with transaction(sessions) as session:
            result = await session.execute(
                update(Payment)
                .where(Payment.tx_hash == tx_hash, Payment.wallet == wallet, Payment.state == "verified")
                .values(state="credited", updated_at=now)
            )
            if not getattr(result, "rowcount", 0):
                raise already_processed(tx_hash)
            amount_raw = await session.scalar(select(Payment.amount_raw).where(Payment.tx_hash == tx_hash))
            await credits.top_up(session, wallet, int(amount_raw or 0), tx_hash, now)
            return int(amount_raw or 0)
    except PaymentAlreadyProcessed:
        raise
    except Exception as exc:
        raise TopupFailed(tx_hash=tx_hash) from exc


async def mark_deployed(
    sessions: async_sessionmaker[AsyncSession],
    tx_hash: str,
    project_id: str,
    deployment_id: str,
    now: dt.datetime,
) -> None:
    async with transaction(sessions) as session:
        await session.execute(
            update(Payment)
            .where(Payment.tx_hash == tx_hash)
            .values(state="deployed", project_id=project_id, deployment_id=deployment_id, updated_at=now)
        )
