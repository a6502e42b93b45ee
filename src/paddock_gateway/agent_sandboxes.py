"""``/agent/sandboxes``: a wallet with no account rents a sandbox by x402 and drives it with a sandbox
access token (control-plane spec §12.1).

``POST /agent/sandboxes`` takes ``{shape?, rootfs?, seconds?}``. Unpaid, it answers 402 with
``PAYMENT-REQUIRED`` offering ``exact`` for a fixed block of ``seconds`` of running and ``upto`` for a
maximum of ``seconds`` of running, settled by the second of real runtime. Price: the control plane's own
per-second compute price (§13.3: 0.0504 USD per vCPU-hour + 0.0162 USD per GiB-hour, quota shapes for
their fraction of a vCPU), per second of the shape, rounded up to a whole 10^-6 USD (``rate_raw``);
the amount is ``seconds × rate_raw``. Paid, the gateway creates the sandbox on the control plane under its
own account (named by the wallet and an id), mints the sandbox's access token and answers 201 with
``{sandbox_id, access_token, control_plane_url, expires_at, payment}``.

The wallet then lists, pauses, resumes and deletes it here (seed signed headers or SIWx). Running time
is recorded as intervals (``AgentSandboxRun``); paused time is free. The metering worker (``enforce``)
pauses a sandbox whose paid time is used up (``exact``: ``block_s`` seconds of running; ``upto``: the
authorisation is due or ended) and marks it ``spent``; a spent sandbox cannot be resumed and is kept
until the wallet deletes it. An ``upto`` authorisation is settled by ``upto.UptoBilling`` exactly once,
for ``running seconds × rate_raw`` (``running_seconds`` is its ``Runtime``), when the sandbox is deleted
or its authorisation falls due.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import paddock
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import Clock, as_utc
from paddock_gateway import deployments, payments, settlement, upto, x402
from paddock_gateway.adapters.control_plane import ControlPlane
from paddock_gateway.auth import Caller
from paddock_gateway.errors import (
    GatewayError,
    InvalidBody,
    InvalidPaymentSignature,
    NotFound,
    NotOwner,
    PaymentRequired,
    UpstreamUnavailable,
)
from paddock_gateway.models import AgentSandbox, AgentSandboxRun, Payment, X402Upto
from paddock_gateway.pricing import Price
from paddock_gateway.services import Services
from paddock_gateway.uploads import parse_model

log = get_logger("paddock.gateway.agent_sandboxes")

MAX_SECONDS = 30 * 24 * 3600
DEFAULT_SECONDS = 3600
RESOURCE = "/agent/sandboxes"


class SandboxFailed(GatewayError):
    status, code, message = 502, "sandbox_failed", "The sandbox could not be created"


class SandboxSpent(GatewayError):
    status, code, message = 409, "sandbox_spent", "The sandbox's paid time is used up"


class SandboxesDisabled(GatewayError):
    """The gateway has no control-plane account key (``PADDOCK_GW_API_KEY``): there is nothing to rent."""

    status, code, message = 404, "sandboxes_disabled", "Wallet sandboxes are not enabled on this gateway"


class SandboxDeleted(GatewayError):
    status, code, message = 409, "sandbox_deleted", "The sandbox is deleted"


class RentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shape: StrictStr | None = Field(default=None, min_length=1, max_length=64)
    rootfs: StrictStr | None = Field(default=None, min_length=1, max_length=128)
    seconds: StrictInt = Field(default=DEFAULT_SECONDS, ge=1, le=MAX_SECONDS)


def running_s(row: AgentSandbox, now: dt.datetime) -> int:
    open_s = 0
    if row.running_since is not None:
        open_s = max(int((now - as_utc(row.running_since)).total_seconds()), 0)
    return row.run_s + open_s


async def running_seconds(
    session: AsyncSession, sandbox_id: str, start: dt.datetime, end: dt.datetime
) -> int | None:
    """``upto.Runtime``: the running seconds of a wallet's sandbox within [start, end]; None for a project."""
    if await session.get(AgentSandbox, sandbox_id) is None:
        return None
    total = 0
    for run in await session.scalars(select(AgentSandboxRun).where(AgentSandboxRun.sandbox_id == sandbox_id)):
        lo = max(as_utc(run.started_at), start)
        hi = min(as_utc(run.ended_at) if run.ended_at is not None else end, end)
        total += max(int((hi - lo).total_seconds()), 0)
    return total


def view(row: AgentSandbox, now: dt.datetime, services: Services) -> dict[str, Any]:
    used = running_s(row, now)
    return {
        "sandbox_id": row.id,
        "name": row.name,
        "state": row.state,
        "shape": row.shape,
        "rootfs": row.rootfs,
        "scheme": row.scheme,
        "price_per_second_raw": row.rate_raw,
        "paid_seconds": row.block_s,
        "running_seconds": used,
        "remaining_seconds": max(row.block_s - used, 0),
        "control_plane_url": services.settings.controlplane_url.rstrip("/"),
        "created_at": as_utc(row.created_at).isoformat(),
    }


def control_plane(services: Services) -> ControlPlane:
    plane = services.agent_sandboxes
    if plane is None:
        raise SandboxesDisabled()
    return plane


async def rent(
    services: Services, body: bytes, content_type: str | None, headers: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    request = parse_model(body or b"{}", content_type or "application/json", RentRequest)
    plane = control_plane(services)
    shape = request.shape or services.settings.sandbox_shape
    rootfs = request.rootfs or services.settings.sandbox_rootfs
    rate = await plane.rate(shape)
    if rate is None:
        raise InvalidBody([{"field": "shape", "message": f"unknown shape {shape!r}"}])
    amount = request.seconds * rate
    price = Price(monthly_raw=amount, months=1, amount_raw=amount)
    raw_payment = headers.get("payment-signature")
    if raw_payment is None:
        raise quote(services, amount, request.seconds, shape)
    if not services.settler.configured:
        raise InvalidPaymentSignature("header", "x402 payments are not enabled on this gateway")
    signed = x402.parse_payment_signature(raw_payment)
    caller = Caller(wallet=signed.authorization.payer)
    now = services.clock()
    if signed.scheme == x402.UPTO:
        offer, signed, taken = await deployments.authorize_upto(
            services, caller, price, signed, period=request.seconds
        )
        try:
            sandbox, token = await create(plane, caller, shape, rootfs)
        except BaseException:
            await settlement.release(services.sessions, taken)
            raise
        row = await upto.record(
            services.sessions,
            services.settings,
            taken,
            offer,
            signed,
            sandbox.id,
            caller.wallet,
            amount,
            1,
            now,
            period=request.seconds,
        )
        tx_hash, upto_id, expires = None, row.id, as_utc(row.due_at)
        payment: dict[str, Any] = {
            "scheme": "upto",
            "network": offer.network,
            "authorized_raw": signed.authorization.value,
            "settled": "by the second of running, when the sandbox is deleted or the authorisation is due",
        }
    else:
        offer, tx_hash = await deployments.settle_x402(services, caller, price, signed)
        # The ledger row leaves ``verified`` at once: the same hash sent as X-Payment-Tx to a deploy is then
        # 409 already processed, never credited a second time.
        await mark_payment(services, tx_hash, "verified", "rented", now)
        try:
            sandbox, token = await create(plane, caller, shape, rootfs)
        except BaseException:
            # The money moved: it becomes the wallet's credits (usable for deploys), never lost.
            await mark_payment(services, tx_hash, "rented", "verified", now)
            await payments.credit(services.sessions, tx_hash, caller.wallet, services.clock())
            raise
        upto_id, expires = None, now + dt.timedelta(seconds=request.seconds)
        payment = {"scheme": "exact", "network": offer.network, "transaction": tx_hash, "amount_raw": amount}
    async with transaction(services.sessions) as session:
        session.add(
            AgentSandbox(
                id=sandbox.id,
                wallet=caller.wallet,
                name=sandbox.name or sandbox.id,
                shape=shape,
                rootfs=rootfs,
                scheme=signed.scheme,
                rate_raw=rate,
                block_s=request.seconds,
                amount_raw=amount,
                tx_hash=tx_hash,
                upto_id=upto_id,
                state="running",
                run_s=0,
                running_since=now,
                created_at=now,
                updated_at=now,
            )
        )
        session.add(AgentSandboxRun(sandbox_id=sandbox.id, started_at=now))
    if services.metering is not None:
        services.metering.wake()
    log.info("agent_sandbox_created", sandbox_id=sandbox.id, wallet=caller.wallet, scheme=signed.scheme)
    answer = {
        "sandbox_id": sandbox.id,
        "access_token": token,
        "control_plane_url": plane.url,
        "expires_at": expires.isoformat(),
        "payment": {**payment, "price_per_second_raw": rate, "seconds": request.seconds},
    }
    response_headers = x402.settlement_response(
        success=True, network=offer.network, payer=caller.address, transaction=tx_hash or ""
    )
    return answer, response_headers


async def mark_payment(services: Services, tx_hash: str, expected: str, state: str, now: dt.datetime) -> None:
    async with transaction(services.sessions) as session:
        await session.execute(
            update(Payment)
            .where(Payment.tx_hash == tx_hash, Payment.state == expected)
            .values(state=state, updated_at=now)
        )


def quote(services: Services, amount: int, seconds: int, shape: str) -> PaymentRequired:
    required = PaymentRequired(
        amount_token=str(amount),
        amount_usd=float(Price(amount, 1, amount).amount_usd),
        seconds=seconds,
        shape=shape,
    )
    if services.settler.configured:
        offer = x402.payment_required(
            services.registry,
            amount,
            deployments.public_base(services) + RESOURCE,
            description=f"A Paddock sandbox ({shape}) for {seconds} s of running",
            discovery=False,
            upto=upto.terms(services.settings, services.settler.address, 1, period=seconds),
        )
        required.headers[x402.PAYMENT_REQUIRED] = x402.encode_header(offer)
        required.headers.update(x402.EXPOSE_HEADERS)
    return required


async def create(
    plane: ControlPlane, caller: Caller, shape: str, rootfs: str
) -> tuple[paddock.AsyncSandbox, str]:
    """The sandbox under the gateway's account, named by the wallet and an id, and its access token."""
    name = f"w-{caller.wallet[2:14]}-{uuid.uuid4().hex[:12]}"
    try:
        sandbox = await plane.client.sandboxes.create(shape, rootfs=rootfs, name=name, ingress_enabled=False)
    except paddock.TransportError as exc:
        raise UpstreamUnavailable("the control plane is unavailable") from exc
    except paddock.PaddockError as exc:
        log.warning("agent_sandbox_create_failed", wallet=caller.wallet, error=str(exc))
        raise SandboxFailed() from exc
    try:
        token = await sandbox.create_access_token()
    except paddock.PaddockError as exc:
        with contextlib.suppress(paddock.PaddockError):
            await sandbox.destroy()
        raise SandboxFailed() from exc
    assert token.token is not None
    return sandbox, token.token


async def owned(services: Services, caller: Caller, sandbox_id: str) -> AgentSandbox:
    if not 0 < len(sandbox_id) <= 64:
        raise NotFound("Sandbox not found")
    async with services.sessions() as session:
        row = await session.get(AgentSandbox, sandbox_id)
    if row is None:
        raise NotFound("Sandbox not found")
    if row.wallet != caller.wallet:
        raise NotOwner("Forbidden: wallet is not the sandbox's payer")
    return row


async def list_sandboxes(services: Services, caller: Caller) -> dict[str, Any]:
    now = services.clock()
    async with services.sessions() as session:
        rows = await session.scalars(
            select(AgentSandbox)
            .where(AgentSandbox.wallet == caller.wallet, AgentSandbox.state != "deleted")
            .order_by(AgentSandbox.created_at)
        )
        return {"sandboxes": [view(row, now, services) for row in rows]}


async def close_run(session: AsyncSession, row: AgentSandbox, end: dt.datetime, state: str) -> None:
    if row.running_since is not None:
        since = as_utc(row.running_since)
        end = max(end, since)
        row.run_s += int((end - since).total_seconds())
        row.running_since = None
        await session.execute(
            update(AgentSandboxRun)
            .where(AgentSandboxRun.sandbox_id == row.id, AgentSandboxRun.ended_at.is_(None))
            .values(ended_at=end)
        )
    row.state, row.updated_at = state, end


async def funded(session: AsyncSession, row: AgentSandbox, now: dt.datetime) -> bool:
    """Whether paid time is left: ``exact``, running seconds under the block; ``upto``, the authorisation
    still open and not due."""
    if row.scheme == x402.UPTO:
        auth = await session.get(X402Upto, row.upto_id) if row.upto_id else None
        return auth is not None and auth.state == "open" and as_utc(auth.due_at) > now
    return running_s(row, now) < row.block_s


async def pause(services: Services, caller: Caller, sandbox_id: str) -> dict[str, Any]:
    row = await owned(services, caller, sandbox_id)
    if row.state == "deleted":
        raise SandboxDeleted()
    if row.state == "running":
        sandbox = await control_plane(services).sandbox(row.id)
        await transition(sandbox.pause)
        now = services.clock()
        async with transaction(services.sessions) as session:
            fresh = await session.get(AgentSandbox, row.id)
            assert fresh is not None
            if fresh.state == "running":
                await close_run(session, fresh, now, "paused")
            row = fresh
    return view(row, services.clock(), services)


async def resume(services: Services, caller: Caller, sandbox_id: str) -> dict[str, Any]:
    row = await owned(services, caller, sandbox_id)
    if row.state == "deleted":
        raise SandboxDeleted()
    now = services.clock()
    async with services.sessions() as session:
        if row.state == "spent" or not await funded(session, row, now):
            raise SandboxSpent()
    if row.state == "paused":
        sandbox = await control_plane(services).sandbox(row.id)
        await transition(sandbox.resume)
        now = services.clock()
        async with transaction(services.sessions) as session:
            fresh = await session.get(AgentSandbox, row.id)
            assert fresh is not None
            if fresh.state == "paused":
                fresh.state, fresh.running_since, fresh.updated_at = "running", now, now
                session.add(AgentSandboxRun(sandbox_id=fresh.id, started_at=now))
            row = fresh
    return view(row, services.clock(), services)


async def transition(action: Any) -> None:
    try:
        await action()
    except paddock.TransportError as exc:
        raise UpstreamUnavailable("the control plane is unavailable") from exc
    except paddock.PaddockError as exc:
        raise SandboxFailed(f"The control plane refused: {exc}") from exc


async def delete(services: Services, caller: Caller, sandbox_id: str) -> dict[str, Any]:
    row = await owned(services, caller, sandbox_id)
    if row.state != "deleted":
        plane = control_plane(services)
        try:
            sandbox = await plane.client.sandboxes.get(row.id)
            await sandbox.destroy()
        except paddock.NotFoundError:
            pass  # already gone (the token holder may destroy it too)
        except paddock.TransportError as exc:
            raise UpstreamUnavailable("the control plane is unavailable") from exc
        except paddock.PaddockError as exc:
            raise SandboxFailed(f"The control plane refused: {exc}") from exc
        now = services.clock()
        async with transaction(services.sessions) as session:
            fresh = await session.get(AgentSandbox, row.id)
            assert fresh is not None
            await close_run(session, fresh, now, "deleted")
            fresh.deleted_at = now
            row = fresh
        if row.upto_id is not None:
            await upto.stop(services.sessions, row.id, now)
        if services.metering is not None:
            services.metering.wake()  # the upto authorisation is settled on the next pass
        log.info("agent_sandbox_deleted", sandbox_id=row.id, wallet=row.wallet)
    return view(row, services.clock(), services)


class Enforcer:
    """The metering worker's part: pause the running sandboxes whose paid time is used up."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], clock: Clock, plane: ControlPlane) -> None:
        self.sessions, self.clock, self.plane = sessions, clock, plane

    async def enforce(self) -> list[str]:
        now = self.clock()
        async with self.sessions() as session:
            rows = list(await session.scalars(select(AgentSandbox).where(AgentSandbox.state == "running")))
            spent = [row for row in rows if not await funded(session, row, now)]
        paused: list[str] = []
        for row in spent:
            try:
                sandbox = await self.plane.client.sandboxes.get(row.id)
                await sandbox.pause()
            except paddock.NotFoundError:
                pass
            except paddock.PaddockError as exc:
                log.warning("agent_sandbox_pause_failed", sandbox_id=row.id, error=str(exc))
                continue
            # The runtime ends where the paid time did: the block's last second, or the authorisation's due.
            end = now
            if row.scheme != x402.UPTO and row.running_since is not None:
                end = as_utc(row.running_since) + dt.timedelta(seconds=max(row.block_s - row.run_s, 0))
            async with transaction(self.sessions) as session:
                fresh = await session.get(AgentSandbox, row.id)
                if fresh is None or fresh.state != "running":
                    continue
                await close_run(session, fresh, min(end, now), "spent")
            paused.append(row.id)
            log.info("agent_sandbox_spent", sandbox_id=row.id, wallet=row.wallet)
        return paused
