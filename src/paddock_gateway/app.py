"""The gateway's ASGI app: ``create_app(settings)`` wires the services in the lifespan.

Tests pass their own ``sandbox_provider`` (or a whole ``hosting``), ``clock`` and ``pricing_source``;
production builds them from the settings.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from sqlalchemy import func, select

from paddock_core import metrics
from paddock_core import openapi as contract_openapi
from paddock_core.db import make_engine, make_sessionmaker, upgrade
from paddock_core.http import RequestContextMiddleware
from paddock_core.logging import get_logger
from paddock_core.timeutil import Clock, utcnow
from paddock_gateway import agent_sandboxes
from paddock_gateway.adapters.chain import ChainClient, ChainError
from paddock_gateway.adapters.control_plane import ControlPlane
from paddock_gateway.adapters.hosting import (
    HostingAccessDenied,
    HostingError,
    HostingPlatform,
    SandboxProvider,
)
from paddock_gateway.adapters.ingress import IngressProbe
from paddock_gateway.adapters.sandbox_hosting import SandboxHosting
from paddock_gateway.api.errors import install_error_handlers
from paddock_gateway.api.middleware import GatewayGuard
from paddock_gateway.api.routes import EXTRA_SCHEMAS, router
from paddock_gateway.contract import CONTRACT
from paddock_gateway.metering import Metering
from paddock_gateway.models import Payment, X402Authorization
from paddock_gateway.pricing import HttpPricing, PriceCache, PricingSource, StaticPricing
from paddock_gateway.ratelimit import RateLimiter
from paddock_gateway.registry import Registry
from paddock_gateway.services import Services
from paddock_gateway.settings import GatewaySettings
from paddock_gateway.settlement import Settler
from paddock_gateway.signatures import SignatureVerifier
from paddock_gateway.upto import UptoBilling

MIGRATIONS = Path(__file__).parent / "migrations"
API_VERSION = "1.0.0"
log = get_logger("paddock.gateway")


def watch_payments(app: FastAPI, telemetry: metrics.ServiceMetrics) -> None:
    """The payment ledger's gauges, counted in the database at each scrape: payments by state (verified,
    credited, deployed) and x402 authorizations by state (settling, submitted, settled)."""
    payments = telemetry.gauge("paddock_gateway_payments", "Payments in the ledger by state.", ["state"])
    x402 = telemetry.gauge("paddock_gateway_x402_authorizations", "x402 authorizations by state.", ["state"])

    async def refresh() -> None:
        services: Services | None = getattr(app.state, "services", None)
        if services is None:
            return
        async with services.sessions() as session:
            paid = (await session.execute(select(Payment.state, func.count()).group_by(Payment.state))).all()
            authorized = (
                await session.execute(
                    select(X402Authorization.state, func.count()).group_by(X402Authorization.state)
                )
            ).all()
        for gauge, rows in ((payments, paid), (x402, authorized)):
            gauge.clear()
            for state, count in rows:
                gauge.labels(state).set(count)

    telemetry.add_refresher(refresh)


async def migrate(settings: GatewaySettings) -> None:
    await upgrade(MIGRATIONS, settings.database_url)


def pricing_source(settings: GatewaySettings) -> PricingSource:
    if settings.pricing_url:
        return HttpPricing(settings.pricing_url, settings.pricing_field)
    return StaticPricing(settings.static_monthly_usd, settings.credits_per_usd)


def default_sandbox_provider(settings: GatewaySettings) -> SandboxProvider:
    from paddock_gateway.adapters.paddock_sandboxes import PaddockSandboxProvider

    return PaddockSandboxProvider(
        settings.controlplane_url,
        settings.api_key.get_secret_value(),
        shape=settings.sandbox_shape,
        rootfs=settings.sandbox_rootfs,
        timeout_s=max(settings.install_timeout_s, settings.build_timeout_s) + 60,
    )


async def check_hosting(hosting: SandboxHosting, controlplane_url: str) -> None:
    """At start-up the control plane must accept the gateway's key; a refused key stops the gateway, since
    every deploy would fail after its payment. An unreachable control plane is only logged (it may start
    later); each deploy checks again before it quotes or takes a payment."""
    try:
        await hosting.check_access()
    except HostingAccessDenied as exc:
        log.error("gateway_credentials_refused", controlplane_url=controlplane_url)
        raise RuntimeError(
            f"refusing to start: {exc}. Set PADDOCK_GW_API_KEY to an API key of that control plane "
            "(paddock admin user create prints one); `paddock serve` provisions it itself."
        ) from exc
    except HostingError as exc:
        log.warning("controlplane_unreachable", controlplane_url=controlplane_url, error=str(exc))


async def check_chains(registry: Registry, chains: dict[str, ChainClient]) -> None:
    """At start-up each RPC must be the chain it is configured for; an unreachable one is only logged."""

    async def check(name: str) -> None:
        expected = registry.chain(name).chain_id
        try:
            actual = await chains[name].chain_id()
        except ChainError as exc:
            log.warning("chain_rpc_unreachable", chain=name, error=str(exc))
            return
        if actual != expected:
            raise RuntimeError(f"the RPC for {name} reports chain id {actual}, expected {expected}")

    await asyncio.gather(*(check(name) for name in chains))


def create_app(
    settings: GatewaySettings,
    *,
    sandbox_provider: SandboxProvider | None = None,
    hosting: HostingPlatform | None = None,
    clock: Clock = utcnow,
    pricing: PricingSource | None = None,
    run_workers: bool = True,
) -> FastAPI:
    registry = settings.registry()
    limiter = RateLimiter(
        settings.rate_limit_requests, settings.rate_limit_window_s, settings.trusted_proxies
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await migrate(settings)
        engine = make_engine(settings.database_url)
        sessions = make_sessionmaker(engine)
        chains = {
            spec.name: ChainClient(spec.rpc_url, timeout_s=settings.rpc_timeout_s)
            for spec in registry.ordered()
        }
        sandbox_hosting: SandboxHosting | None = None
        platform = hosting
        if platform is None:
            sandbox_hosting = SandboxHosting(
                sessions,
                sandbox_provider or default_sandbox_provider(settings),
                settings.secret_box(),
                clock=clock,
                install_timeout_s=settings.install_timeout_s,
                build_timeout_s=settings.build_timeout_s,
                ready_timeout_s=settings.ready_timeout_s,
                max_concurrent_builds=settings.max_concurrent_builds,
                ingress_probe=IngressProbe() if settings.verify_ingress else None,
            )
            platform = sandbox_hosting
        services = Services(
            settings=settings,
            registry=registry,
            engine=engine,
            sessions=sessions,
            chains=chains,
            hosting=platform,
            prices=PriceCache(
                pricing or pricing_source(settings),
                ttl_s=settings.price_cache_ttl_s,
                backoff_s=settings.price_retry_backoff_s,
                floor_usd=settings.min_monthly_usd,
                credits_per_usd=settings.credits_per_usd,
            ),
            limiter=limiter,
            clock=clock,
            started_at=clock(),
            settler=Settler(
                settings.settlement_private_key, receipt_timeout_s=settings.settlement_receipt_timeout_s
            ),
            signatures=SignatureVerifier(
                timeout_s=settings.contract_signature_timeout_s, ttl_s=settings.contract_signature_cache_s
            ),
        )
        plane = ControlPlane(settings) if settings.api_key.get_secret_value() else None
        services.agent_sandboxes = plane
        billing = (
            UptoBilling(
                sessions, clock, settings, registry, chains, services.settler, agent_sandboxes.running_seconds
            )
            if services.settler.configured
            else None
        )
        enforce = agent_sandboxes.Enforcer(sessions, clock, plane).enforce if plane is not None else None
        services.metering = Metering(sessions, clock, settings, services.hosting, billing, enforce)
        app.state.services = services
        try:
            await check_chains(registry, chains)
            if sandbox_hosting is not None:
                await check_hosting(sandbox_hosting, settings.controlplane_url)
                sandbox_hosting.start()
            if run_workers:
                services.metering.start()
            log.info(
                "gateway_started",
                database=engine.dialect.name,
                recipient=registry.chain("base").recipient,
                x402_settler=services.settler.address or None,  # the address only, never the key
            )
            yield
        finally:
            await services.metering.stop()
            if plane is not None:
                await plane.aclose()
            await platform.aclose()
            for client in chains.values():
                await client.aclose()
            await engine.dispose()

    app = FastAPI(
        title="Paddock deployment payment gateway",
        version=API_VERSION,
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    telemetry = metrics.from_env("gateway")  # None with PADDOCK_METRICS=0
    if telemetry is not None:
        watch_payments(app, telemetry)
    install_error_handlers(app)
    app.include_router(router)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=API_VERSION, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, model in EXTRA_SCHEMAS.items():
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(model_schema.pop("$defs", {}))
                components[name] = model_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_document() -> dict[str, Any]:
        return app.openapi()  # the document as ``contract_openapi.install`` rewrites it, made on first read

    contract_openapi.install(app, CONTRACT)  # error bodies on every status, no 422, Allow on 405

    app.add_middleware(GatewayGuard, limiter=limiter, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestContextMiddleware, service="gateway")  # ids and logs every request
    metrics.install(app, telemetry)  # outermost: counts and times every request; serves GET /metrics
    return app
