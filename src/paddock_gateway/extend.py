"""``POST /agent/projects/{projectId}/extend``: a wallet pays for more months of its project's runtime.

Credits belong to the wallet and every live project of it draws on them (§9), so extending a project is a
top-up of its wallet, priced as a deploy of ``months`` is, and only for a live project of the caller (404
for an unknown or deleted one, 403 for another wallet's). Without ``PAYMENT-SIGNATURE`` the answer is the
402 quote with ``PAYMENT-REQUIRED`` for this URL; with one, the payment is checked, settled and credited
exactly as a deploy's x402 payment is (``deployments.settle_x402``: one claim per authorization, 409 for a
replay, x402's reasons in 402s, nothing credited on failure), and the answer is 200 with the
``PAYMENT-RESPONSE``. An ``upto`` payment (``upto``) credits nothing: it funds this project's runtime
from now for ``months``, settled by consumption later; while one does, another is 409
``upto_already_open``. The caller is authenticated by the seed's headers or by ``SIGN-IN-WITH-X``
(``siwx``), so a returning payer extends without per-request signing. Only x402 pays here: a transfer
hash (``X-Payment-Tx``) is for deploys.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from paddock_core.logging import get_logger
from paddock_gateway import credits, deployments, payments, upto, x402
from paddock_gateway.auth import Caller
from paddock_gateway.errors import InvalidPaymentSignature, NotFound, NotOwner, UptoAlreadyOpen
from paddock_gateway.models import Project
from paddock_gateway.pricing import Price
from paddock_gateway.schemas import ExtendAccepted, ExtendRequest
from paddock_gateway.services import Services
from paddock_gateway.uploads import parse_model

log = get_logger("paddock.gateway.extend")


def usd(raw: int) -> float:
    """Raw token units (6 decimals) as USD."""
    return float(Decimal(raw) / Decimal(1_000_000))


async def extend(
    services: Services,
    caller: Caller,
    project_id: str,
    body: bytes,
    content_type: str | None,
    headers: Mapping[str, str],
) -> tuple[ExtendAccepted, dict[str, str]]:
    request = parse_model(body, content_type, ExtendRequest)
    raw_payment = headers.get("payment-signature")
    signed = x402.parse_payment_signature(raw_payment) if raw_payment is not None else None
    if signed is not None and not services.settler.configured:
        raise InvalidPaymentSignature("header", "x402 payments are not enabled on this gateway")
    if not 0 < len(project_id) <= 128:
        raise NotFound("Project not found")
    async with services.sessions() as session:
        project = await session.get(Project, project_id)
    if project is None or project.state in ("deleting", "deleted"):
        raise NotFound("Project not found")
    if project.wallet != caller.wallet:
        raise NotOwner("Forbidden: wallet is not the deployer")
    price = await services.prices.price(request.months)
    if signed is None:
        balance, active = await deployments.wallet_position(services, caller.wallet)
        raise deployments.quote(
            services,
            price,
            balance,
            active,
            warn=False,
            resource=f"/agent/projects/{project_id}/extend",
            description=f"Extend the runtime of Paddock project {project.name} by {request.months} month(s)",
        )
    if signed.scheme == x402.UPTO:
        return await extend_upto(services, caller, project, request.months, price, signed)
    offer, tx_hash = await deployments.settle_x402(services, caller, price, signed)
    credited_raw = await payments.credit(services.sessions, tx_hash, caller.wallet, services.clock())
    if services.metering is not None:
        services.metering.wake()  # a project paused for lack of credits resumes
    async with services.sessions() as session:
        balance = await credits.balance_micro(session, caller.wallet)
    log.info(
        "project_extended",
        project_id=project_id,
        wallet=caller.wallet,
        months=request.months,
        tx_hash=tx_hash,
    )
    accepted = ExtendAccepted(
        projectId=project_id,
        months=request.months,
        amount_usd=usd(credited_raw),
        current_credit_balance_usd=float(credits.usd_from_micro_credits(balance)),
        message=f"Payment settled; the wallet's credits now cover {request.months} more month(s) of this project.",
    )
    response_headers = x402.settlement_response(
        success=True, network=offer.network, payer=caller.address, transaction=tx_hash
    )
    return accepted, response_headers


async def extend_upto(
    services: Services,
    caller: Caller,
    project: Project,
    months: int,
    price: Price,
    signed: x402.SignedPayment,
) -> tuple[ExtendAccepted, dict[str, str]]:
    """The project's runtime for ``months`` from now is billed against an ``upto`` authorisation."""
    async with services.sessions() as session:
        if await upto.funding(session, project.id) is not None:
            raise UptoAlreadyOpen()
    offer, signed, taken = await deployments.authorize_upto(services, caller, price, signed)
    await upto.record(
        services.sessions,
        services.settings,
        taken,
        offer,
        signed,
        project.id,
        caller.wallet,
        price.amount_raw,
        months,
        services.clock(),
    )
    if services.metering is not None:
        services.metering.wake()  # a project paused for lack of credits resumes on the authorisation
    async with services.sessions() as session:
        balance = await credits.balance_micro(session, caller.wallet)
    log.info("project_extended", project_id=project.id, wallet=caller.wallet, months=months, scheme=x402.UPTO)
    accepted = ExtendAccepted(
        projectId=project.id,
        months=months,
        amount_usd=0.0,  # nothing is charged now: the runtime consumed is settled later
        current_credit_balance_usd=float(credits.usd_from_micro_credits(balance)),
        message=(
            f"Payment authorised up to {usd(signed.authorization.value)} USD; this project's next {months} "
            "month(s) of runtime are settled by consumption at the period's end or when it is deleted."
        ),
    )
    return accepted, x402.settlement_response(success=True, network=offer.network, payer=caller.address)
