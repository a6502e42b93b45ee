"""The credit ledger per wallet (§9.1): top-ups keyed by transaction hash, hourly usage entries.

Balances are integers in micro-credits (10^-6 credits). 100 credits = 1 USD, so one raw unit of a
6-decimal token (10^-6 USD) buys exactly 100 micro-credits and a top-up is exact. ``gw_wallets`` holds
the running balance, updated in the same transaction as each ``gw_credit_entries`` row, whose unique
``idempotency_key`` makes a retried top-up or a re-run metering pass a no-op.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_gateway.models import CreditEntry, Wallet

MICRO_CREDITS_PER_RAW = 100  # 10^-6 USD × 100 credits/USD = 10^-4 credits = 100 micro-credits
MICRO_CREDITS_PER_USD_MICRO = MICRO_CREDITS_PER_RAW


def usd_from_micro_credits(balance_micro: int) -> Decimal:
    """``current_credit_balance_usd``: credits / 100, rounded down to 6 decimals (exact)."""
    return Decimal(max(balance_micro, 0) // MICRO_CREDITS_PER_RAW) / Decimal(1_000_000)


def raw_from_micro_credits(balance_micro: int) -> int:
    """The balance in 10^-6 USD (raw units), rounded down — what the decision table compares."""
    return max(balance_micro, 0) // MICRO_CREDITS_PER_RAW


async def balance_micro(session: AsyncSession, wallet: str) -> int:
    value = await session.scalar(select(Wallet.balance_micro).where(Wallet.address == wallet))
    return int(value or 0)


async def lock_wallet(session: AsyncSession, wallet: str, now: dt.datetime) -> int:
    """Take the wallet's row lock (an UPDATE as the first write), creating the row if needed; returns
    the balance. On SQLite the surrounding ``transaction()`` already holds the write lock."""
    result = await session.execute(update(Wallet).where(Wallet.address == wallet).values(updated_at=now))
    if not getattr(result, "rowcount", 0):
        session.add(Wallet(address=wallet, balance_micro=0, updated_at=now))
        await session.flush()
    return await balance_micro(session, wallet)


async def _apply(
    session: AsyncSession,
    wallet: str,
    amount_micro: int,
    kind: str,
    key: str,
    now: dt.datetime,
    project_id: str | None = None,
) -> bool:
    existing = await session.scalar(select(CreditEntry.id).where(CreditEntry.idempotency_key == key))
    if existing is not None:
        return False
    session.add(
        CreditEntry(
            wallet=wallet,
            amount_micro=amount_micro,
            kind=kind,
            idempotency_key=key,
            project_id=project_id,
            created_at=now,
        )
    )
    await session.execute(
        update(Wallet)
        .where(Wallet.address == wallet)
        .values(balance_micro=Wallet.balance_micro + amount_micro, updated_at=now)
    )
    await session.flush()
    return True


async def top_up(session: AsyncSession, wallet: str, amount_raw: int, tx_hash: str, now: dt.datetime) -> bool:
    """Credit ``amount_raw`` (10^-6 USD) once per transaction hash; False if it was already credited."""
    await lock_wallet(session, wallet, now)
    return await _apply(session, wallet, amount_raw * MICRO_CREDITS_PER_RAW, "topup", f"topup:{tx_hash}", now)


async def consume(
    session: AsyncSession, wallet: str, amount_micro: int, key: str, project_id: str, now: dt.datetime
) -> int:
    """Debit up to ``amount_micro`` (never below zero) once per ``key``; returns what was debited.
    The caller holds the wallet lock (``lock_wallet``)."""
    available = await balance_micro(session, wallet)
    debit = min(amount_micro, available)
    applied = await _apply(session, wallet, -debit, "usage", key, now, project_id=project_id)
    return debit if applied else 0
