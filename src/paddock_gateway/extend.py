"""``POST /agent/projects/{projectId}/extend``: a wallet pays for more months of its project's runtime.

Credits belong to the wallet and every live project of it draws on them (§9), so extending a project is a
top-up of its wallet, priced as a deploy of ``months`` is, and only for a live project of the caller (404
for an unknown or deleted one, 403 for another wallet's). Without ``PAYMENT-SIGNATURE`` the answer is the
402 quote with ``PAYMENT-REQUIRED`` for this URL; with one, the payment is checked, settled and credited
exactly as a deploy's x402 payment is (``deployments.settle_x402``: one claim per authorization, 409 for a
replay, x402's reasons in 402s, nothing credited on failure), and the answer is 200 with the
``PAYMENT-RESPONSE``. The caller is authenticated by the seed's headers or by ``SIGN-IN-WITH-X``
(``siwx``), so a returning payer extends without per-request signing. Only x402 pays here: a transfer
hash (``X-Payment-Tx``) is for deploys.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from paddock_core.logging import get_logger
from paddock_gateway import credits, deployments, payments, x402
from paddock_gateway.auth import Caller
from paddock_gateway.errors import InvalidPaymentSignature, NotFound, NotOwner
from paddock_gateway.models import Project
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
