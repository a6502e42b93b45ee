"""``POST /agent/deploy`` after authentication (§5.3.3 steps 4–8): validation, payment headers, name
availability, price, then the paid path (§7–§8), the x402 path (Appendix B.4) or the credit path with
the decision table (§6). Both paid paths end the same way: a ledger row in state ``verified``, then
``credit_and_start``. An x402 payment with a ``payment-identifier`` id is answered once per (wallet, id)
(``payment_ids``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from paddock_core.logging import get_logger
from paddock_gateway import credits, payment_ids, payments, projects, settlement, siwx, upto, x402
from paddock_gateway.adapters.hosting import (
    AccessCheck,
    DeploymentHandle,
    HostingAccessDenied,
    HostingError,
    HostingUnavailable,
    ProjectSpec,
)
from paddock_gateway.auth import Caller
from paddock_gateway.errors import (
    DeployFailed,
    DeployFailedAfterTopup,
    GatewayError,
    InvalidHeader,
    InvalidPaymentSignature,
    MixedPaymentMethods,
    NameTaken,
    PaymentAlreadyProcessed,
    PaymentRequired,
    UnsupportedChain,
    UnsupportedToken,
    UpstreamUnavailable,
)
from paddock_gateway.pricing import Price
from paddock_gateway.registry import CHAIN_NAMES, TOKEN_NAMES, normalise_name
from paddock_gateway.schemas import DeployAccepted
from paddock_gateway.services import Services
from paddock_gateway.uploads import DeployInput, deploy_input

log = get_logger("paddock.gateway.deploy")

STARTED = "Deployment started. Poll status for updates."
AUTHORIZED = (
    "Payment authorised up to {max_usd} USD for {months} month(s); the runtime consumed is settled at the "
    "period's end or when the project is deleted. Deployment started. Poll status for updates."
)
PAID = "Payment verified and credits added. Deployment started. Poll status for updates."


@dataclass(frozen=True)
class PaymentHeaders:
    tx_hash: str | None
    chain: str
    token: str
    use_existing_credits: bool
    x402: x402.SignedPayment | None = None


@dataclass(frozen=True)
class Deployed:
    """The 200 body and the response headers that go with it (``PAYMENT-RESPONSE`` after x402)."""

    body: DeployAccepted
    headers: dict[str, str] = field(default_factory=dict)
    tx_hash: str | None = None  # the x402 settlement's


def payment_headers(headers: Mapping[str, str], default_chain: str) -> PaymentHeaders:
    """Step 5: the syntax of every payment header, checked even without ``X-Payment-Tx``."""
    raw_tx = headers.get("x-payment-tx")
    tx_hash = payments.normalise_tx_hash(raw_tx) if raw_tx is not None else None
    chain = normalise_name(headers.get("x-payment-chain", default_chain), CHAIN_NAMES)
    if chain is None:
        raise UnsupportedChain()
    token = normalise_name(headers.get("x-payment-token", "usdc"), TOKEN_NAMES)
    if token is None:
        raise UnsupportedToken()
    opt_in = headers.get("x-use-existing-credits", "false").strip().lower()
    if opt_in not in ("true", "false"):
        raise InvalidHeader()
    raw_x402 = headers.get("payment-signature")
    if raw_x402 is not None and tx_hash is not None:
        raise MixedPaymentMethods()
    signed = x402.parse_payment_signature(raw_x402) if raw_x402 is not None else None
    return PaymentHeaders(
        tx_hash=tx_hash, chain=chain, token=token, use_existing_credits=opt_in == "true", x402=signed
    )


async def deploy(
    services: Services, caller: Caller, body: bytes, content_type: str | None, headers: Mapping[str, str]
) -> Deployed:
    request = deploy_input(body, content_type)
    pay = payment_headers(headers, services.registry.default_chain)
    if pay.x402 is not None and not services.settler.configured:
        raise InvalidPaymentSignature("header", "x402 payments are not enabled on this gateway")
    if pay.x402 is not None and pay.x402.payment_id is not None:
        return await deploy_identified(services, caller, request, pay, pay.x402, pay.x402.payment_id)
    return await deploy_checked(services, caller, request, pay)


async def deploy_checked(
    services: Services, caller: Caller, request: DeployInput, pay: PaymentHeaders
) -> Deployed:
    """Steps 6–8: name, price, platform, then the paid, x402 or credit path."""
    if await projects.name_taken(services, request.request.uniqueName):
        raise NameTaken()
    price = await services.prices.price(request.request.months)
    await ensure_can_deploy(services)
    if pay.tx_hash is not None:
        return Deployed(await deploy_paid(services, caller, request, price, pay, pay.tx_hash))
    if pay.x402 is not None and pay.x402.scheme == x402.UPTO:
        return await deploy_upto(services, caller, request, price, pay.x402)
    if pay.x402 is not None:
        return await deploy_settled(services, caller, request, price, pay.x402)
    return Deployed(await deploy_on_credits(services, caller, request, price, pay.use_existing_credits))


#: How often a retry polls for the answer of a first request that is still running, and how much longer
#: than a settlement's receipt wait it waits at most.
IDENTIFIED_POLL_S = 0.1
IDENTIFIED_WAIT_MARGIN_S = 60.0


async def deploy_identified(
    services: Services,
    caller: Caller,
    request: DeployInput,
    pay: PaymentHeaders,
    signed: x402.SignedPayment,
    payment_id: str,
) -> Deployed:
    """x402's ``payment-identifier``: the first request with (wallet, id) runs, and its 200 is what every
    retry of the same payment gets (see ``payment_ids``); nothing is settled or charged twice."""
    sessions, wallet = services.sessions, caller.wallet
    give_up = time.monotonic() + services.settler.receipt_timeout_s + IDENTIFIED_WAIT_MARGIN_S
    while True:
        seen = await payment_ids.find(sessions, wallet, payment_id)
        if seen is not None and seen.terms != signed.terms:
            raise PaymentAlreadyProcessed(tx_hash=seen.tx_hash)  # the same id for another payment
        if seen is not None and seen.answer is not None:
            log.info("payment_identifier_replayed", wallet=wallet, tx_hash=seen.tx_hash)
            return replayed(seen.answer, seen.tx_hash)
        now = services.clock()
        nonce = signed.authorization.nonce_key
        if seen is not None and seen.state == "sent":
            if seen.nonce == nonce and await payment_ids.resume_sent(
                sessions, wallet, payment_id, nonce, now
            ):
                break  # the same authorization again: its claim settles it, or waits for its transaction
            if seen.nonce != nonce:  # a new signature: never a second payment under this id
                raise PaymentAlreadyProcessed(tx_hash=seen.tx_hash)
        if seen is None and await payment_ids.reserve(sessions, wallet, payment_id, signed.terms, now):
            break
        if seen is not None and await payment_ids.take_over(sessions, wallet, payment_id, now):
            break
        if time.monotonic() > give_up:  # the first request is still running: its payment is taken
            raise PaymentAlreadyProcessed(tx_hash=None)
        await asyncio.sleep(IDENTIFIED_POLL_S)
    try:
        deployed = await deploy_checked(services, caller, request, pay)
    except BaseException as exc:
        sent = exc.extra.get("tx_hash") if isinstance(exc, GatewayError) else None
        if sent:  # the settlement went out (502 unmined, a failure after the credit, a spent claim)
            await payment_ids.mark_sent(
                sessions, wallet, payment_id, signed.authorization.nonce_key, sent, services.clock()
            )
        else:
            await payment_ids.forget(sessions, wallet, payment_id)  # nothing was charged: a retry runs
        raise
    answer = payment_ids.Answer(
        project_id=deployed.body.projectId,
        deployment_id=deployed.body.deploymentId,
        message=deployed.body.message,
        payment_response=deployed.headers[x402.PAYMENT_RESPONSE],
    )
    await payment_ids.remember(sessions, wallet, payment_id, answer, deployed.tx_hash or "", services.clock())
    return deployed


def replayed(answer: payment_ids.Answer, tx_hash: str | None) -> Deployed:
    body = DeployAccepted(
        projectId=answer.project_id, deploymentId=answer.deployment_id, message=answer.message
    )
    headers = {x402.PAYMENT_RESPONSE: answer.payment_response, **x402.EXPOSE_HEADERS}
    return Deployed(body, headers, tx_hash)


async def ensure_can_deploy(services: Services) -> None:
    """Before a quote or a payment: the platform must accept the gateway's credentials, or the wallet
    would pay for a deploy that cannot start (verified, topped up, then refused upstream). 502
    ``upstream_unavailable`` as for an unreachable platform: nothing has changed, retrying later works."""
    if not isinstance(services.hosting, AccessCheck):
        return
    try:
        await services.hosting.check_access()
    except HostingError as exc:
        log.warning("hosting_not_ready", error=str(exc), access_denied=isinstance(exc, HostingAccessDenied))
        raise UpstreamUnavailable("the hosting platform is unavailable") from exc


async def wallet_position(services: Services, wallet: str) -> tuple[int, int]:
    """(balance in micro-credits, active projects); (0, 0) if either lookup fails (§6: fail closed)."""
    try:
        async with services.sessions() as session:
            balance = await credits.balance_micro(session, wallet)
        return balance, await projects.active_count(services, wallet)
    except Exception as exc:
        log.warning("credit_lookup_failed", wallet=wallet, error=type(exc).__name__)
        return 0, 0


def quote(
    services: Services,
    price: Price,
    balance_micro: int,
    active: int,
    *,
    warn: bool,
    resource: str = "/agent/deploy",
    description: str = "Deploy an application on Paddock",
) -> PaymentRequired:
    registry = services.registry
    default = registry.chain(registry.default_chain)
    fields: dict[str, Any] = {
        "amount_usd": float(price.amount_usd),
        "amount_token": price.amount_token,
        "token": "usdc",
        "decimals": 6,
        "pay_to": default.recipient,
        "payment_chain": default.name,
        "supported_chains": registry.supported_chains(),
        "current_credit_balance_usd": float(credits.usd_from_micro_credits(balance_micro)),
        "active_projects": active,
    }
    if warn:
        fields["warning"] = (
            f"You have {active} active project(s) sharing credits. Paying extends total runtime. To deploy on "
            "existing credits instead (this reduces the other projects' runtime), retry with header "
            "X-Use-Existing-Credits: true"
        )
    required = PaymentRequired(**fields)
    if services.settler.configured:  # offer x402 only when the gateway can settle it
        extensions = {
            siwx.SIGN_IN_WITH_X: siwx.declaration(
                public_base(services), registry, services.clock(), "/agent/projects"
            )
        }
        offer = x402.payment_required(
            registry,
            price.amount_raw,
            public_base(services) + resource,
            extensions=extensions,
            description=description,
            discovery=resource == "/agent/deploy",  # bazaar describes the deploy; see ``bazaar``
            upto=upto.terms(services.settings, services.settler.address, price.months),
        )
        required.headers[x402.PAYMENT_REQUIRED] = x402.encode_header(offer)
        required.headers.update(x402.EXPOSE_HEADERS)
    return required


def public_base(services: Services) -> str:
    """The gateway's public origin from configuration, never from the request (B.4)."""
    settings = services.settings
    return (settings.public_url or f"http://127.0.0.1:{settings.port}").rstrip("/")


async def deploy_on_credits(
    services: Services, caller: Caller, request: DeployInput, price: Price, opt_in: bool
) -> DeployAccepted:
    """The decision table (§6), cases A–D."""
    balance, active = await wallet_position(services, caller.wallet)
    enough = credits.raw_from_micro_credits(balance) >= price.amount_raw
    if not enough:
        raise quote(services, price, balance, active, warn=False)  # D
    if active and not opt_in:
        raise quote(services, price, balance, active, warn=True)  # C
    try:
        handle = await start(services, caller, request, price)
    except (HostingError, projects.NameConflict) as exc:
        log.warning("deploy_failed", wallet=caller.wallet, error=str(exc))
        if isinstance(exc, HostingUnavailable):
            raise UpstreamUnavailable("the hosting platform is unavailable") from exc
        raise DeployFailed() from exc
    message = STARTED
    if active:  # B
        message = (
            f"Deployment started on existing credits. This will reduce runtime of your {active} other "
            "active project(s). Poll status for updates."
        )
    return DeployAccepted(projectId=handle.project_id, deploymentId=handle.deployment_id, message=message)


async def deploy_paid(
    services: Services, caller: Caller, request: DeployInput, price: Price, pay: PaymentHeaders, tx_hash: str
) -> DeployAccepted:
    """§7–§8: ledger check, verification, record, top-up, deploy."""
    existing = payments.check_reuse(await payments.find(services.sessions, tx_hash), caller.wallet)
    if existing is None:
        chain = services.registry.chain(pay.chain)
        verified = await payments.verify_transfer(
            services.chain_client(pay.chain),
            chain,
            chain.token(pay.token),
            tx_hash,
            caller.wallet,
            price.amount_raw,
        )
        await payments.record_verified(services.sessions, verified, services.clock())
        log.info(
            "payment_verified",
            wallet=caller.wallet,
            tx_hash=tx_hash,
            chain=pay.chain,
            amount_raw=verified.amount_raw,
        )
    return await credit_and_start(services, caller, request, price, tx_hash)


async def deploy_settled(
    services: Services, caller: Caller, request: DeployInput, price: Price, signed: x402.SignedPayment
) -> Deployed:
    """Appendix B.4: settle (``settle_x402``), then the same top-up and deploy as §7–§8."""
    offer, tx_hash = await settle_x402(services, caller, price, signed)
    accepted = await credit_and_start(services, caller, request, price, tx_hash)
    headers = x402.settlement_response(
        success=True, network=offer.network, payer=caller.address, transaction=tx_hash
    )
    return Deployed(accepted, headers, tx_hash)


async def authorize_upto(
    services: Services, caller: Caller, price: Price, signed: x402.SignedPayment, *, period: int | None = None
) -> tuple[x402.Offer, x402.SignedPayment, settlement.Claim]:
    """An ``upto`` payment (``upto``): check, signature, the nonce's claim, then the chain (nonce unused,
    allowance and balance cover the maximum, settling it simulates). Nothing is sent; the claim is
    released on any failure. The caller records the authorisation for its project, or releases it."""
    now_s = int(services.clock().timestamp())
    offer = upto.check(
        services.registry,
        services.settings,
        services.settler.address,
        signed,
        caller.wallet,
        price.amount_raw,
        price.months,
        now_s,
        period=period,
    )
    client = services.chain_client(offer.chain.name)
    signed = await settlement.check_signature(services.signatures, client, offer, signed, price.amount_raw)
    taken = await settlement.claim(services.sessions, signed, services.clock())
    try:
        await upto.verify_on_chain(services.settler, client, offer, signed, price.amount_raw)
    except BaseException:
        await settlement.release(services.sessions, taken)
        raise
    return offer, signed, taken


async def deploy_upto(
    services: Services, caller: Caller, request: DeployInput, price: Price, signed: x402.SignedPayment
) -> Deployed:
    """A deploy paid by ``upto``: the authorisation is taken on, the deploy starts, and the project's
    runtime is billed against the authorisation (nothing is credited to the wallet, nothing moves yet).
    A deploy that fails to start releases the authorisation: nothing was or will be charged."""
    offer, signed, taken = await authorize_upto(services, caller, price, signed)
    # The metering pass must not see the new project before its authorisation (it would pause a live
    # project of a wallet without credits): it waits for the start and the record.
    guard = services.metering.lock if services.metering is not None else contextlib.nullcontext()
    async with guard:
        try:
            handle = await start(services, caller, request, price)
        except (HostingError, projects.NameConflict) as exc:
            await settlement.release(services.sessions, taken)
            log.warning("deploy_failed", wallet=caller.wallet, error=str(exc), scheme=x402.UPTO)
            if isinstance(exc, HostingUnavailable):
                raise UpstreamUnavailable("the hosting platform is unavailable") from exc
            raise DeployFailed() from exc
        await upto.record(
            services.sessions,
            services.settings,
            taken,
            offer,
            signed,
            handle.project_id,
            caller.wallet,
            price.amount_raw,
            price.months,
            services.clock(),
        )
    if services.metering is not None:
        services.metering.wake()  # the worker's next wake-up includes this authorisation's due time
    message = AUTHORIZED.format(max_usd=price_usd(signed.authorization.value), months=price.months)
    accepted = DeployAccepted(projectId=handle.project_id, deploymentId=handle.deployment_id, message=message)
    headers = x402.settlement_response(success=True, network=offer.network, payer=caller.address)
    return Deployed(accepted, headers, None)


def price_usd(raw: int) -> str:
    return str(Decimal(raw) / Decimal(1_000_000))


async def settle_x402(
    services: Services, caller: Caller, price: Price, signed: x402.SignedPayment
) -> tuple[x402.Offer, str]:
    """Check, claim, settle on chain, then a ledger row in state ``verified``; returns the offer and the
    settlement's hash.

    The claim is released on every failure before a successful receipt (nothing moved, nothing
    credited, the authorization may be tried again). A settlement sent but not mined in time keeps it
    as ``submitted`` (502 naming the hash), since the transaction may still land: the same
    authorization sent again waits for that transaction instead of sending another."""
    now_s = int(services.clock().timestamp())
    offer = settlement.check(services.registry, signed, caller.wallet, price.amount_raw, now_s)
    client = services.chain_client(offer.chain.name)
    signed = await settlement.check_signature(services.signatures, client, offer, signed, price.amount_raw)
    taken = await settlement.claim(services.sessions, signed, services.clock())
    try:
        if taken.submitted_tx is not None:  # an earlier request sent it: wait for that one
            tx_hash = await services.settler.await_settlement(
                client, offer, signed, price.amount_raw, taken.submitted_tx
            )
        else:
            tx_hash = await services.settler.settle(client, offer, signed, price.amount_raw)
    except UpstreamUnavailable as exc:
        if "tx_hash" in exc.extra:
            await settlement.mark(
                services.sessions, taken, "submitted", exc.extra["tx_hash"], services.clock()
            )
        else:
            await settlement.release(services.sessions, taken)
        raise
    except Exception:
        await settlement.release(services.sessions, taken)
        raise
    await settlement.mark(services.sessions, taken, "settled", tx_hash, services.clock())
    verified = payments.VerifiedPayment(
        tx_hash=tx_hash,
        wallet=caller.wallet,
        chain=offer.chain.name,
        token=offer.token.name,
        amount_raw=signed.authorization.value,
    )
    await payments.record_verified(services.sessions, verified, services.clock())
    log.info(
        "payment_settled",
        wallet=caller.wallet,
        tx_hash=tx_hash,
        chain=offer.chain.name,
        amount_raw=verified.amount_raw,
        method="x402",
        transfer_method=signed.method,
    )
    return offer, tx_hash


async def credit_and_start(
    services: Services, caller: Caller, request: DeployInput, price: Price, tx_hash: str
) -> DeployAccepted:
    """§8: ``verified → credited`` with the top-up, then the deploy (a failure after it is §8.4)."""
    credited_raw = await payments.credit(services.sessions, tx_hash, caller.wallet, services.clock())
    if services.metering is not None:
        services.metering.wake()
    try:
        handle = await start(services, caller, request, price)
    except (HostingError, projects.NameConflict) as exc:
        log.warning("deploy_failed_after_topup", wallet=caller.wallet, tx_hash=tx_hash, error=str(exc))
        raise DeployFailedAfterTopup(
            tx_hash=tx_hash, credited_usd=float(Decimal(credited_raw) / Decimal(1_000_000))
        ) from exc
    await payments.mark_deployed(
        services.sessions, tx_hash, handle.project_id, handle.deployment_id, services.clock()
    )
    return DeployAccepted(projectId=handle.project_id, deploymentId=handle.deployment_id, message=PAID)


async def start(services: Services, caller: Caller, request: DeployInput, price: Price) -> DeploymentHandle:
    body = request.request
    spec = ProjectSpec(
        name=body.uniqueName,
        display_name=body.displayName,
        description=body.description,
        wallet=caller.wallet,
    )
    handle = await services.hosting.create_deployment(spec, request.files, request.options)
    fields: dict[str, object] = {
        "name": body.uniqueName,
        "display_name": body.displayName,
        "description": body.description,
        "monthly_raw": price.monthly_raw,
    }
    try:
        await projects.record(services, caller, handle, fields)
    except projects.NameConflict:
        try:
            await services.hosting.delete_project(handle.project_id)
        except HostingError:
            log.warning("orphan_cleanup_failed", project_id=handle.project_id)
        raise
    log.info(
        "deploy_started",
        wallet=caller.wallet,
        project_id=handle.project_id,
        deployment_id=handle.deployment_id,
    )
    return handle
