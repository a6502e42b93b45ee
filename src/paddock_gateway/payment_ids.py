"""x402's ``payment-identifier`` extension (coinbase/x402 ``specs/extensions/payment_identifier.md``): a
paid deploy that carries an ``id`` is answered once per (wallet, id).

| the same wallet sends the id … | answer |
|---|---|
| for the first time | processed as usual; a 200 is kept (body and ``PAYMENT-RESPONSE``) |
| again, paying the same (same offer terms and payer) | the kept 200, unchanged; nothing is settled or charged again |
| again, while the first request still runs | waits for it, then the kept 200 (or goes on itself if the first failed) |
| again, paying something else (another amount, asset, network …) | 409 ``payment_already_processed`` |
| again, after the first failed once its settlement was sent (502 not yet mined, or a failure after the credit) | the very same signed payment goes on (and settles or waits for that transaction, once); a re-signed one is 409 naming the transaction |

"The same payment" compares the accepted offer's terms and the payer, not the signature: x402 clients
sign afresh on every retry (a new nonce and deadline), and that fresh signature is never settled. A
request that fails before its settlement is sent forgets the id (nothing was charged), so a retry runs
in full; one that fails after keeps it (``sent``), so no second payment is ever taken under it. Ids are per wallet: a
wallet never sees another's answers.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.db import transaction
from paddock_gateway.models import X402PaymentId

#: A ``pending`` row older than this belongs to a request that died without forgetting it.
PENDING_STALE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Answer:
    """The kept 200 of a paid deploy."""

    project_id: str
    deployment_id: str
    message: str
    payment_response: str


@dataclass(frozen=True)
class Seen:
    state: str  # pending | done | sent
    terms: str
    nonce: str | None
    tx_hash: str | None
    answer: Answer | None


async def find(sessions: async_sessionmaker[AsyncSession], wallet: str, payment_id: str) -> Seen | None:
    async with sessions() as session:
        row = await session.get(X402PaymentId, (wallet, payment_id))
    if row is None:
        return None
    answer = None
    if row.state == "done" and row.project_id and row.deployment_id:
        answer = Answer(row.project_id, row.deployment_id, row.message or "", row.payment_response or "")
    return Seen(row.state, row.terms, row.nonce, row.tx_hash, answer)


async def reserve(
    sessions: async_sessionmaker[AsyncSession], wallet: str, payment_id: str, terms: str, now: dt.datetime
) -> bool:
    """Take the id on for this request; False if another request has (or had) it."""
    try:
        async with transaction(sessions) as session:
            session.add(
                X402PaymentId(
                    wallet=wallet,
                    payment_id=payment_id,
                    terms=terms,
                    state="pending",
                    created_at=now,
                    updated_at=now,
                )
            )
    except IntegrityError:
        return False
    return True


async def take_over(
    sessions: async_sessionmaker[AsyncSession], wallet: str, payment_id: str, now: dt.datetime
) -> bool:
    """Take over a ``pending`` row older than ``PENDING_STALE`` (its request died without forgetting
    it); True for exactly one of any racers, since the winner's update makes the row fresh."""
    async with transaction(sessions) as session:
        result = await session.execute(
            update(X402PaymentId)
            .where(
                X402PaymentId.wallet == wallet,
                X402PaymentId.payment_id == payment_id,
                X402PaymentId.state == "pending",
                X402PaymentId.updated_at < now - PENDING_STALE,
            )
            .values(updated_at=now)
        )
    return getattr(result, "rowcount", 0) == 1


async def resume_sent(
    sessions: async_sessionmaker[AsyncSession], wallet: str, payment_id: str, nonce: str, now: dt.datetime
) -> bool:
    """Take a ``sent`` row back to ``pending`` for a retry of the very same authorization; True for
    exactly one of any racers."""
    async with transaction(sessions) as session:
        result = await session.execute(
            update(X402PaymentId)
            .where(
                X402PaymentId.wallet == wallet,
                X402PaymentId.payment_id == payment_id,
                X402PaymentId.state == "sent",
                X402PaymentId.nonce == nonce,
            )
            .values(state="pending", updated_at=now)
        )
    return getattr(result, "rowcount", 0) == 1


async def mark_sent(
    sessions: async_sessionmaker[AsyncSession],
    wallet: str,
    payment_id: str,
    nonce: str,
    tx_hash: str,
    now: dt.datetime,
) -> None:
    async with transaction(sessions) as session:
        await session.execute(
            update(X402PaymentId)
            .where(X402PaymentId.wallet == wallet, X402PaymentId.payment_id == payment_id)
            .values(state="sent", nonce=nonce, tx_hash=tx_hash, updated_at=now)
        )


async def remember(
    sessions: async_sessionmaker[AsyncSession],
    wallet: str,
    payment_id: str,
    answer: Answer,
    tx_hash: str,
    now: dt.datetime,
) -> None:
    async with transaction(sessions) as session:
        await session.execute(
            update(X402PaymentId)
            .where(X402PaymentId.wallet == wallet, X402PaymentId.payment_id == payment_id)
            .values(
                state="done",
                project_id=answer.project_id,
                deployment_id=answer.deployment_id,
                message=answer.message,
                payment_response=answer.payment_response,
                tx_hash=tx_hash,
                updated_at=now,
            )
        )


async def forget(sessions: async_sessionmaker[AsyncSession], wallet: str, payment_id: str) -> None:
    async with transaction(sessions) as session:
        await session.execute(
            delete(X402PaymentId).where(
                X402PaymentId.wallet == wallet,
                X402PaymentId.payment_id == payment_id,
                X402PaymentId.state == "pending",
            )
        )
