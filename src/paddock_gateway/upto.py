"""x402 ``upto`` for runtime: a deploy or an extension paid by an authorised maximum, settled later for
what the project consumed, exactly once and never above the maximum.

What the payer signs (coinbase/x402 ``mechanisms/evm/upto``) is a Permit2 ``PermitWitnessTransferFrom``
whose spender is x402's upto proxy, for ``permitted.amount`` = the maximum, with the witness
``Witness(address to,address facilitator,uint256 validAfter)``: only the facilitator it names (the
gateway's settlement key) may settle it, for any amount up to the maximum, once (Permit2 spends the
nonce).

The gateway takes it in four steps:

1. ``check`` (no chain, no database): scheme ``upto``, one of the 402's ``upto`` offers (network, USDC),
   the upto proxy as spender, the recipient as ``witness.to``, this gateway's key as
   ``witness.facilitator``, the caller's wallet as ``from``, a deadline that covers the period and the
   settlement window, ``validAfter`` passed, a maximum of at least the period's price, the offer's token.
   Then the signature (``settlement.check_signature``: ECDSA, else EIP-1271/ERC-6492).
2. The claim of the Permit2 nonce (``settlement.claim``, shared with ``exact``: a nonce is taken once
   whichever scheme carries it; a replay is 409).
3. ``verify_on_chain``: the nonce is unused, the allowance to Permit2 and the balance cover the maximum,
   and ``settle(maximum)`` from the settlement key simulates. Nothing is sent.
4. ``record``: a ``gw_x402_upto`` row for the project, ``open``, with its period
   (``months × upto_month_s``) and its ``due_at``.

The project's runtime is then billed against the authorisation by the second, not against the wallet's
credits: ``consumed = min(maximum, ⌊seconds × price / period_s⌋)``. The metering worker (``UptoBilling``)
settles it once, when the first of these comes:

- the period ends (``due_at``; earlier if the permit's deadline would otherwise be too close);
- the consumption reaches the maximum (with a maximum of exactly the price, that is the period's end);
- the project is deleted (``stop``: consumption ends then, settled on the next pass, which ``stop`` wakes).

A row leaves ``open`` by one conditional UPDATE (``open`` → ``settling``): of any number of concurrent
workers, on SQLite or PostgreSQL, exactly one settles it; the others settle nothing. The amount is
computed once, by that worker, capped at the maximum; zero moves nothing on chain. The transaction goes
through the upto proxy from the settlement key; its hash is recorded (``submitted``) before its receipt is
awaited, so a receipt that is late is awaited on a later pass instead of sending again (the chain would
refuse a second one anyway: the nonce is spent). A precheck that fails at settlement (the payer spent
its balance or revoked the allowance) marks it ``failed`` with x402's reason; an unreachable RPC returns
it to ``open`` for the next pass.

When an authorisation is settled or failed and its project is still live, the project goes back to the
wallet's credits from that moment (``metered_until``); with none, the metering pass pauses it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import Clock, as_utc
from paddock_gateway import permit2, settlement
from paddock_gateway.adapters.chain import ChainClient, ChainError
from paddock_gateway.errors import PaymentVerificationFailed, UpstreamUnavailable
from paddock_gateway.models import Project, X402Authorization, X402Upto
from paddock_gateway.registry import Registry
from paddock_gateway.settings import GatewaySettings
from paddock_gateway.settlement import Claim, Precheck, SettlementCall, Settler
from paddock_gateway.x402 import (
    PERMIT2_ADDRESS,
    UPTO,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
    Offer,
    Permit2Authorization,
    SignedPayment,
    UptoTerms,
    upto_offers,
)

log = get_logger("paddock.gateway.upto")

#: x402's upto reasons (coinbase/x402 ``mechanisms/evm/constants.py``).
UPTO_INVALID_SCHEME = "invalid_upto_evm_scheme"
UPTO_FACILITATOR_MISMATCH = "upto_facilitator_mismatch"
UPTO_SETTLEMENT_EXCEEDS_AMOUNT = "invalid_upto_evm_payload_settlement_exceeds_amount"
UPTO_TRANSACTION_FAILED = "invalid_upto_evm_transaction_failed"
#: x402's upto facilitator's answer to a payload that is not an upto Permit2 one.
UNSUPPORTED_PAYLOAD = "unsupported_payload_type"
#: The largest maximum the ledger holds (a signed BIGINT); a larger one is refused as the wrong amount.
MAX_AUTHORIZED_RAW = 2**63 - 1
#: The states in which an authorisation still funds its project.
FUNDING = ("open", "settling", "submitted", "confirming")
#: A worker that has held a row this long in ``settling`` or ``confirming`` is presumed dead (``recover``).
STALE_MIN_S = 600


def period_s(settings: GatewaySettings, months: int) -> int:
    return months * settings.upto_month_s


def terms(
    settings: GatewaySettings, facilitator: str, months: int, *, period: int | None = None
) -> UptoTerms:
    """The 402's ``upto`` terms: the permit must outlast the period by the settlement window. ``period``
    (seconds) replaces ``months`` for what is not priced by the month (a wallet's sandbox)."""
    span = period if period is not None else period_s(settings, months)
    return UptoTerms(facilitator=facilitator, max_timeout_s=span + settings.upto_settle_window_s)


def consumed_raw(seconds: int, price_raw: int, period: int, authorized_raw: int) -> int:
    """What ``seconds`` of runtime cost at ``price_raw`` per ``period`` seconds, capped at the maximum."""
    return min(authorized_raw, max(seconds, 0) * price_raw // period)


def check(
    registry: Registry,
    settings: GatewaySettings,
    facilitator: str,
    payment: SignedPayment,
    wallet: str,
    price_raw: int,
    months: int,
    now_s: int,
    *,
    period: int | None = None,
) -> Offer:
    """Step 1 but the signature, in x402's verification order (the gateway's sender rule after the
    recipient, as for ``exact``). 402 with x402's reason on the first failure."""

    def failed(reason: str) -> PaymentVerificationFailed:
        return settlement.rejected(reason, payment, price_raw)

    auth = payment.authorization
    if payment.scheme != UPTO:
        raise failed(UPTO_INVALID_SCHEME)
    if not isinstance(auth, Permit2Authorization) or auth.facilitator is None:
        raise failed(UNSUPPORTED_PAYLOAD)  # an EIP-3009 or exact Permit2 payload under ``upto``
    span = period if period is not None else period_s(settings, months)
    offers = upto_offers(registry, terms(settings, facilitator, months, period=span))
    on_network = [offer for offer in offers if offer.network == payment.network]
    if not on_network:
        raise failed(settlement.NETWORK_MISMATCH)
    offer = next((o for o in on_network if o.token.address.lower() == payment.asset), None)
    if offer is None:
        raise failed(settlement.ASSET_MISMATCH)
    recipient = offer.chain.recipient.lower()
    if auth.spender != X402_UPTO_PERMIT2_PROXY_ADDRESS.lower():
        raise failed(settlement.PERMIT2_INVALID_SPENDER)
    if payment.pay_to != recipient or auth.to != recipient:
        raise failed(settlement.PERMIT2_RECIPIENT_MISMATCH)
    if auth.facilitator != facilitator.lower():
        raise failed(UPTO_FACILITATOR_MISMATCH)
    if auth.payer != wallet:
        raise failed(settlement.SENDER_MISMATCH)
    # The deadline must outlast the period and half the settlement window: the gateway settles at the
    # period's end, or earlier (``due``) if the deadline is closer than a quarter window to it.
    if auth.deadline < now_s + span + settings.upto_settle_window_s // 2:
        raise failed(settlement.PERMIT2_DEADLINE_EXPIRED)
    if auth.valid_after > now_s:
        raise failed(settlement.PERMIT2_NOT_YET_VALID)
    if not price_raw <= auth.value <= MAX_AUTHORIZED_RAW:
        raise failed(settlement.PERMIT2_AMOUNT_MISMATCH)
    if auth.token != offer.token.address.lower():
        raise failed(settlement.PERMIT2_TOKEN_MISMATCH)
    return offer


def settle_call(auth: Permit2Authorization, amount: int, signature: bytes, token: str) -> SettlementCall:
    """The upto proxy's ``settle(permit, amount, …)``, with what must hold first for ``amount``."""
    payer_word = bytes.fromhex(auth.payer.removeprefix("0x").rjust(64, "0"))
    return SettlementCall(
        to=X402_UPTO_PERMIT2_PROXY_ADDRESS,
        data=permit2.settle_upto_calldata(auth, amount, signature),
        prechecks=(
            Precheck(
                PERMIT2_ADDRESS,
                permit2.nonce_bitmap_call(auth),
                lambda word: permit2.nonce_used(word, auth),
                settlement.PERMIT2_NONCE_USED,
            ),
            Precheck(
                token,
                permit2.allowance_call(auth),
                lambda allowed: allowed < amount,
                settlement.PERMIT2_ALLOWANCE_REQUIRED,
            ),
            Precheck(
                token,
                "0x" + (settlement.BALANCE_OF + payer_word).hex(),
                lambda held: held < amount,
                settlement.INSUFFICIENT_BALANCE,
            ),
        ),
    )


async def verify_on_chain(
    settler: Settler, client: ChainClient, offer: Offer, payment: SignedPayment, price_raw: int
) -> None:
    """Step 3: the nonce is unused, the allowance and the balance cover the maximum, and settling the
    maximum simulates from the settlement key. Sends nothing."""
    auth = payment.authorization
    assert isinstance(auth, Permit2Authorization)
    call = settle_call(auth, auth.value, payment.signature, offer.token.address)
    await settler.prepare(
        client, offer.chain, call, lambda reason: settlement.rejected(reason, payment, price_raw), auth.payer
    )


def permit_record(payment: SignedPayment) -> dict[str, Any]:
    auth = payment.authorization
    assert isinstance(auth, Permit2Authorization) and auth.facilitator is not None
    return {
        "token": auth.token,
        "amount": str(auth.value),
        "spender": auth.spender,
        "nonce": str(auth.nonce),
        "deadline": str(auth.deadline),
        "to": auth.to,
        "facilitator": auth.facilitator,
        "validAfter": str(auth.valid_after),
        "signature": "0x" + payment.signature.hex(),
    }


def authorization_of(row: X402Upto) -> tuple[Permit2Authorization, bytes]:
    permit = row.permit
    auth = Permit2Authorization(
        payer=row.payer,
        token=permit["token"],
        value=int(permit["amount"]),
        spender=permit["spender"],
        nonce=int(permit["nonce"]),
        deadline=int(permit["deadline"]),
        to=permit["to"],
        valid_after=int(permit["validAfter"]),
        facilitator=permit["facilitator"],
    )
    return auth, bytes.fromhex(permit["signature"][2:])


def due_at(settings: GatewaySettings, started: dt.datetime, period: int, deadline_s: int) -> dt.datetime:
    """The period's end, or a quarter settlement window before the permit's deadline if that is earlier."""
    latest = min(deadline_s - settings.upto_settle_window_s // 4, 2**40)
    return min(started + dt.timedelta(seconds=period), dt.datetime.fromtimestamp(latest, dt.UTC))


async def record(
    sessions: async_sessionmaker[AsyncSession],
    settings: GatewaySettings,
    taken: Claim,
    offer: Offer,
    payment: SignedPayment,
    project_id: str,
    wallet: str,
    price_raw: int,
    months: int,
    now: dt.datetime,
    *,
    period: int | None = None,
) -> X402Upto:
    """Step 4: the authorisation funds ``project_id`` from ``now``; its claim is marked ``authorized``.
    ``period`` (seconds) replaces ``months`` for a wallet's sandbox (``agent_sandboxes``)."""
    auth = payment.authorization
    assert isinstance(auth, Permit2Authorization)
    if period is None:
        period = period_s(settings, months)
    row = X402Upto(
        id=str(uuid.uuid4()),
        project_id=project_id,
        wallet=wallet,
        network=offer.network,
        chain=offer.chain.name,
        token=offer.token.name,
        payer=auth.payer,
        nonce=auth.nonce_key,
        permit=permit_record(payment),
        authorized_raw=auth.value,
        price_raw=price_raw,
        period_s=period,
        started_at=now,
        due_at=due_at(settings, now, period, auth.deadline),
        state="open",
        created_at=now,
        updated_at=now,
    )
    async with transaction(sessions) as session:
        session.add(row)
        await session.execute(
            update(X402Authorization)
            .where(settlement.where(taken))
            .values(state="authorized", updated_at=now)
        )
    log.info(
        "upto_authorized",
        project_id=project_id,
        wallet=wallet,
        authorized_raw=auth.value,
        price_raw=price_raw,
        period_s=period,
    )
    return row


async def funding(session: AsyncSession, project_id: str) -> X402Upto | None:
    """The authorisation that funds the project now, if any."""
    result = await session.scalars(
        select(X402Upto).where(X402Upto.project_id == project_id, X402Upto.state.in_(FUNDING)).limit(1)
    )
    return result.first()


async def ledger(sessions: async_sessionmaker[AsyncSession], project_id: str) -> list[X402Upto]:
    async with sessions() as session:
        rows = await session.scalars(
            select(X402Upto).where(X402Upto.project_id == project_id).order_by(X402Upto.created_at)
        )
        return list(rows)


async def stop(sessions: async_sessionmaker[AsyncSession], project_id: str, now: dt.datetime) -> bool:
    """The project is deleted: its open authorisation stops consuming now and is due now."""
    async with transaction(sessions) as session:
        result = await session.execute(
            update(X402Upto)
            .where(X402Upto.project_id == project_id, X402Upto.state == "open", X402Upto.stopped_at.is_(None))
            .values(stopped_at=now, due_at=now, updated_at=now)
        )
    return bool(getattr(result, "rowcount", 0))


#: The running seconds of what an authorisation funds between two instants, or None when it is a project
#: (whose runtime is wall time): ``agent_sandboxes.running_seconds`` for a wallet's sandbox.
Runtime = Callable[[AsyncSession, str, dt.datetime, dt.datetime], Awaitable[int | None]]


@dataclass(frozen=True)
class Settled:
    """One settlement this worker made: the amount moved (0: nothing sent) and its transaction."""

    upto_id: str
    amount_raw: int
    tx_hash: str | None
    reason: str


class UptoBilling:
    """Settles due ``upto`` authorisations. Any number of these may run against one database (several
    gateway processes): a row is settled by the one whose UPDATE takes it out of ``open``."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        clock: Clock,
        settings: GatewaySettings,
        registry: Registry,
        chains: dict[str, ChainClient],
        settler: Settler,
        runtime: Runtime | None = None,
    ) -> None:
        self.sessions = sessions
        self.runtime = runtime
        self.clock = clock
        self.settings = settings
        self.registry = registry
        self.chains = chains
        self.settler = settler

    async def next_due(self) -> dt.datetime | None:
        async with self.sessions() as session:
            value = await session.scalar(
                select(X402Upto.due_at).where(X402Upto.state == "open").order_by(X402Upto.due_at).limit(1)
            )
        return as_utc(value) if value is not None else None

    def stale_after(self) -> dt.timedelta:
        """How long a row may sit in ``settling`` or ``confirming`` before its worker is presumed dead."""
        return dt.timedelta(seconds=max(STALE_MIN_S, 4 * self.settler.receipt_timeout_s))

    async def recover(self) -> None:
        """Rows whose worker died mid-way: ``confirming`` goes back to ``submitted`` (its receipt is awaited
        again); ``settling`` goes back to ``open`` only if the Permit2 nonce is still unused on chain, so
        nothing was mined (the amount is recomputed identically: the consumption ended at ``due_at`` or
        ``stopped_at``). A settlement still pending in a mempool can then be sent a second time, but only
        one of the two can move money: the nonce is spent by the first to be mined."""
        cutoff = self.clock() - self.stale_after()
        async with transaction(self.sessions) as session:
            await session.execute(
                update(X402Upto)
                .where(X402Upto.state == "confirming", X402Upto.updated_at < cutoff)
                .values(state="submitted")
            )
        async with self.sessions() as session:
            stuck = list(
                await session.scalars(
                    select(X402Upto).where(X402Upto.state == "settling", X402Upto.updated_at < cutoff)
                )
            )
        for row in stuck:
            auth, _ = authorization_of(row)
            try:
                word = await self.chains[row.chain].call(PERMIT2_ADDRESS, permit2.nonce_bitmap_call(auth))
            except ChainError:
                continue
            if permit2.nonce_used(int.from_bytes(word or b"\0", "big"), auth):
                continue  # it was mined: leave it for an operator (the row says how much, not which tx)
            await self._set(row.id, "settling", state="open")
            log.warning("upto_settlement_recovered", upto_id=row.id, project_id=row.project_id)

    async def settle_due(self) -> list[Settled]:
        """Settle every open authorisation that is due, and await the receipts of those sent earlier."""
        await self.recover()
        now = self.clock()
        async with self.sessions() as session:
            due = list(
                await session.scalars(
                    select(X402Upto.id).where(X402Upto.state == "open", X402Upto.due_at <= now)
                )
            )
            submitted = list(await session.scalars(select(X402Upto.id).where(X402Upto.state == "submitted")))
        done: list[Settled] = []
        for upto_id in due:
            settled = await self.settle(upto_id)
            if settled is not None:
                done.append(settled)
        for upto_id in submitted:
            settled = await self.confirm(upto_id)
            if settled is not None:
                done.append(settled)
        return done

    async def settle(self, upto_id: str) -> Settled | None:
        """Settle one authorisation if it is open and due; None when another worker has it (or had it),
        or it is not due. The amount is computed here, once, and never exceeds the maximum."""
        now = self.clock()
        async with transaction(self.sessions) as session:
            taken = await session.execute(
                update(X402Upto)
                .where(X402Upto.id == upto_id, X402Upto.state == "open", X402Upto.due_at <= now)
                .values(state="settling", updated_at=now)
            )
            if getattr(taken, "rowcount", 0) != 1:
                return None
            row = await session.get(X402Upto, upto_id)
            assert row is not None
            started, due = as_utc(row.started_at), as_utc(row.due_at)
            end = min(now, due) if row.stopped_at is None else as_utc(row.stopped_at)
            seconds = max(int((end - started).total_seconds()), 0)
            if self.runtime is not None:  # a wallet's sandbox: only its running time counts
                measured = await self.runtime(session, row.project_id, started, end)
                seconds = seconds if measured is None else min(seconds, measured)
            amount = consumed_raw(seconds, row.price_raw, row.period_s, row.authorized_raw)
            if row.stopped_at is not None:
                reason = "deleted"
            elif seconds >= row.period_s:
                reason = "period_end"
            elif amount >= row.authorized_raw:
                reason = "exhausted"
            else:
                reason = "deadline"  # settled early: the permit's deadline was near
            row.consumed_s, row.reason, row.settled_raw = seconds, reason, amount
            snapshot = (row.chain, row.network, row.project_id, row.wallet)
            auth, signature = authorization_of(row)
        chain_name, network, project_id, wallet = snapshot
        if amount > auth.value:  # unreachable by construction; the proxy would refuse it too
            await self._finish(upto_id, "failed", None, end, error=UPTO_SETTLEMENT_EXCEEDS_AMOUNT)
            return None
        if amount == 0:
            await self._finish(upto_id, "settled", None, end)
            log.info("upto_settled", upto_id=upto_id, project_id=project_id, amount_raw=0, reason=reason)
            return Settled(upto_id, 0, None, reason)
        chain = self.registry.chain(chain_name)
        client = self.chains[chain_name]
        call = settle_call(auth, amount, signature, auth.token)

        def failed(code: str) -> PaymentVerificationFailed:
            return PaymentVerificationFailed(
                reason=code,
                network=network,
                payer=auth.payer,
                required_amount_token=str(amount),
                authorized_amount_token=str(auth.value),
            )

        try:
            tx_hash = await self.settler.send(client, chain, call, failed, auth.payer)
        except PaymentVerificationFailed as exc:
            code = str(exc.extra.get("reason") or UPTO_TRANSACTION_FAILED)
            log.warning("upto_settlement_refused", upto_id=upto_id, project_id=project_id, reason=code)
            await self._finish(upto_id, "failed", None, end, error=code)
            return None
        except (UpstreamUnavailable, ChainError) as exc:
            log.warning("upto_settlement_deferred", upto_id=upto_id, error=str(exc))
            await self._set(upto_id, "settling", state="open")  # nothing was sent: the next pass retries
            return None
        await self._set(upto_id, "settling", state="submitted", tx_hash=tx_hash)
        log.info("upto_submitted", upto_id=upto_id, project_id=project_id, wallet=wallet, tx_hash=tx_hash)
        return await self.confirm(upto_id)

    async def confirm(self, upto_id: str) -> Settled | None:
        """Await the receipt of a sent settlement (taken by one worker: ``submitted`` → ``confirming``);
        back to ``submitted`` if it is not mined yet."""
        now = self.clock()
        async with transaction(self.sessions) as session:
            taken = await session.execute(
                update(X402Upto)
                .where(X402Upto.id == upto_id, X402Upto.state == "submitted")
                .values(state="confirming", updated_at=now)
            )
            if getattr(taken, "rowcount", 0) != 1:
                return None
            row = await session.get(X402Upto, upto_id)
            assert row is not None and row.tx_hash is not None and row.settled_raw is not None
            tx_hash, amount, chain_name, reason = row.tx_hash, row.settled_raw, row.chain, row.reason or ""
            auth, _ = authorization_of(row)
            started = as_utc(row.started_at)
            end = started + dt.timedelta(seconds=row.consumed_s or 0)
        try:
            receipt = await self.settler.receipt(self.chains[chain_name], tx_hash)
        except ChainError:
            receipt = None
        if receipt is None:
            await self._set(upto_id, "confirming", state="submitted")
            return None
        moved = receipt.status == 1 and any(
            entry.address == auth.token
            and entry.topics[:3]
            == (
                settlement.TRANSFER_TOPIC,
                "0x" + auth.payer.removeprefix("0x").rjust(64, "0"),
                "0x" + auth.to.removeprefix("0x").rjust(64, "0"),
            )
            and not entry.removed
            and int(entry.data, 16) == amount
            for entry in receipt.logs
        )
        if not moved:
            await self._finish(upto_id, "failed", tx_hash, end, error=UPTO_TRANSACTION_FAILED)
            return None
        await self._finish(upto_id, "settled", tx_hash, end)
        log.info("upto_settled", upto_id=upto_id, amount_raw=amount, tx_hash=tx_hash, reason=reason)
        return Settled(upto_id, amount, tx_hash, reason)

    async def _set(self, upto_id: str, expected: str, **values: object) -> None:
        async with transaction(self.sessions) as session:
            await session.execute(
                update(X402Upto)
                .where(X402Upto.id == upto_id, X402Upto.state == expected)
                .values(updated_at=self.clock(), **values)
            )

    async def _finish(
        self, upto_id: str, state: str, tx_hash: str | None, end: dt.datetime, *, error: str | None = None
    ) -> None:
        """``settled`` or ``failed``: the Permit2 claim follows, and a live project goes back to the
        wallet's credits from ``end`` (the metering pass pauses it if there are none)."""
        now = self.clock()
        async with transaction(self.sessions) as session:
            row = await session.get(X402Upto, upto_id)
            assert row is not None
            row.state, row.tx_hash, row.error, row.settled_at, row.updated_at = (
                state,
                tx_hash,
                error,
                now,
                now,
            )
            if state == "failed":
                row.settled_raw = 0 if tx_hash is None else row.settled_raw
            await session.execute(
                update(X402Authorization)
                .where(
                    X402Authorization.network == row.network,
                    X402Authorization.asset == PERMIT2_ADDRESS.lower(),
                    X402Authorization.payer == row.payer,
                    X402Authorization.nonce == row.nonce,
                )
                .values(state="settled" if state == "settled" else "failed", tx_hash=tx_hash, updated_at=now)
            )
            await session.execute(
                update(Project)
                .where(Project.id == row.project_id, Project.state.in_(("live", "paused")))
                .values(metered_until=end)
            )
