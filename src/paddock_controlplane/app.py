"""The control-plane ASGI app: ``create_app(settings)`` wires services in the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from paddock_controlplane.edge import contract, ingress, sshgate
from paddock_controlplane.edge.api.errors import install_error_handlers
from paddock_controlplane.edge.api.routes import audit as audit_routes
from paddock_controlplane.edge.api.routes import bodies, catalog, commands, internal, probes, sandboxes
from paddock_controlplane.edge.api.routes import computer as computer_routes
from paddock_controlplane.edge.api.routes import disks as disk_routes
from paddock_controlplane.edge.api.routes import logs as log_routes
from paddock_controlplane.edge.api.routes import metrics as metrics_routes
from paddock_controlplane.edge.api.routes import networks as network_routes
from paddock_controlplane.edge.api.routes import processes as process_routes
from paddock_controlplane.edge.api.routes import shell as shell_routes
from paddock_controlplane.edge.api.routes import snapshots as snapshot_routes
from paddock_controlplane.edge.api.routes import templates as template_routes
from paddock_controlplane.edge.api.routes import volumes as volume_routes
from paddock_controlplane.edge.api.routes import webhooks as webhook_routes
from paddock_controlplane.edge.auditing import AuditMiddleware
from paddock_controlplane.edge.console import mount_console
from paddock_controlplane.edge.e2b import listener as e2b_listener
from paddock_controlplane.edge.e2b.edge import listener as edge_listener
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.hotcache import (
    StatusWatch,
    TTLCache,
    drop_changed_sandboxes,
    forget_changes,
    wake_watchers,
)
from paddock_controlplane.records.models import Sandbox, Template, WebhookDelivery
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import host_reports
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_controlplane.workers import reconciler
from paddock_controlplane.workers.audit_writer import AuditWriter
from paddock_controlplane.workers.sandbox_metrics import MetricsWorker
from paddock_controlplane.workers.template_builds import TemplateBuilder
from paddock_controlplane.workers.webhook_delivery import DeliveryWorker
from paddock_core import errors, metrics, openapi
from paddock_core.bodylimit import BodyLimit
from paddock_core.crypto import SecretBox
from paddock_core.db import PointReads, make_engine, make_sessionmaker, upgrade
from paddock_core.fastlane import FastLane
from paddock_core.http import RequestContextMiddleware
from paddock_core.logging import get_logger
from paddock_core.timeutil import Clock, utcnow

MIGRATIONS = Path(__file__).parent / "records" / "migrations"
event.listen(Session, "after_flush", drop_changed_sandboxes)
event.listen(Session, "after_commit", wake_watchers)
event.listen(Session, "after_rollback", forget_changes)
log = get_logger("paddock.controlplane")
#: The sandbox operations timed from their API calls (``paddock_sandbox_operation_duration_seconds``).
OPERATIONS = {
    ("POST", "/v1/sandboxes"): "create",
    ("POST", "/v1/sandboxes/{sandbox_id}/fork"): "fork",
    ("POST", "/v1/sandboxes/{sandbox_id}/pause"): "pause",
    ("POST", "/v1/sandboxes/{sandbox_id}/resume"): "resume",
    ("DELETE", "/v1/sandboxes/{sandbox_id}"): "destroy",
}


def watch_state(app: FastAPI, telemetry: metrics.ServiceMetrics) -> None:
    """The gauges read from the database at each scrape: sandboxes by state, the webhook outbox's
    pending deliveries and templates by build status."""
    by_state = telemetry.gauge("paddock_sandboxes", "Sandboxes by state.", ["state"])
    outbox = telemetry.gauge("paddock_webhook_outbox_pending", "Webhook deliveries waiting to be sent.")
    templates = telemetry.gauge("paddock_templates", "Templates by build status.", ["status"])

    async def refresh() -> None:
        services: Services | None = getattr(app.state, "services", None)
        if services is None:
            return
        async with services.sessions() as session:
            states = (
                await session.execute(select(Sandbox.status, func.count()).group_by(Sandbox.status))
            ).all()
            pending = await session.scalar(
                select(func.count()).select_from(WebhookDelivery).where(WebhookDelivery.status == "pending")
            )
            builds = (
                await session.execute(select(Template.status, func.count()).group_by(Template.status))
            ).all()
        by_state.clear()
        for state, count in states:
            by_state.labels(state).set(count)
        outbox.set(pending or 0)
        templates.clear()
        for status, count in builds:
            templates.labels(status).set(count)

    telemetry.add_refresher(refresh)


async def migrate(settings: ControlPlaneSettings) -> None:
    await upgrade(MIGRATIONS, settings.database_url)


def create_app(settings: ControlPlaneSettings, *, clock: Clock = utcnow) -> FastAPI:
    """The app; ``clock`` is injectable so billing, idle auto-pause and retention are testable."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await migrate(settings)
        engine = make_engine(settings.database_url)
        running_cache: TTLCache[Sandbox] = TTLCache(settings.hot_cache_ttl_s)
        ingress_cache: TTLCache[object] = TTLCache(settings.hot_cache_ttl_s)
        sessions = make_sessionmaker(engine)
        status_watch = StatusWatch()
        sessions.configure(
            info={
                "running_cache": running_cache,
                "ingress_cache": ingress_cache,
                "status_watch": status_watch,
            }
        )
        services = Services(
            settings=settings,
            engine=engine,
            sessions=sessions,
            reads=PointReads(settings.database_url, sessions),
            principals=TTLCache(settings.hot_cache_ttl_s),
            running=running_cache,
            secret_box=SecretBox(settings.secret_key.get_secret_value() or "paddock-dev-insecure-key"),
            clock=clock,
            status_watch=status_watch,
        )
        app.state.services = services

        async def on_heartbeat(beat: dict[str, Any]) -> dict[str, Any] | None:
            runtime = (beat.get("labels") or {}).get("paddock.io/runtime")
            hostlink.forget_if_changed(services, str(beat["id"]), str(beat["url"]), runtime)
            summary = await host_reports.apply_host_report(services, beat)
            return {"hibernated_summary": summary} if summary is not None else None

        services.on_heartbeat = on_heartbeat
        loop = reconciler.Reconciler(services, reconciler.PASSES)
        await loop.run_once()
        loop.start()
        auditor = AuditWriter(services)  # the audit trail's queue, egress polls and retention
        auditor.start()
        deliveries = DeliveryWorker.from_services(services) if settings.webhook_worker_enabled else None
        if deliveries:
            deliveries.start()
        builder = TemplateBuilder(services) if settings.template_worker_enabled else None
        if builder:
            builder.start()
        sampler = MetricsWorker(services)  # per-sandbox metrics; idle with metrics_interval_s 0
        sampler.start()
        proxy = await ingress.start(services, ingress_cache)
        e2b = await e2b_listener.start(services)
        edge = await edge_listener.start(services)
        ssh = None
        if settings.ssh_port:
            key_file = settings.ssh_host_key_file or settings.data_dir / "ssh_host_key"
            ssh = await sshgate.start(
                services, settings.ssh_host or settings.host, settings.ssh_port, key_file
            )
        log.info("controlplane_started", region=settings.region, database=engine.dialect.name)
        try:
            yield
        finally:
            if ssh:
                await ssh.stop()
            if edge:
                await edge.stop()
            if e2b:
                await e2b.stop()
            if proxy:
                await proxy.stop()
            await sampler.stop()
            if builder:
                await builder.stop()
            if deliveries:
                await deliveries.stop()
            await loop.stop()
            await auditor.stop()
            await hostlink.close_all(services)
            services.reads.dispose()
            await engine.dispose()

    app = FastAPI(
        title="Paddock sandbox control plane",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    telemetry = metrics.from_env("controlplane", ops=OPERATIONS)  # None with PADDOCK_METRICS=0
    if telemetry is not None:
        watch_state(app, telemetry)
    install_error_handlers(app)
    for module in (
        probes,
        catalog,
        internal,
        sandboxes,
        commands,
        audit_routes,
        network_routes,
        process_routes,
        computer_routes,
        shell_routes,
        disk_routes,
        template_routes,
        snapshot_routes,
        volume_routes,
        webhook_routes,
        metrics_routes,
        log_routes,
    ):
        app.include_router(module.router)
    # GET / → /console, /console, its assets and its shell socket (docs/console.md); not in the contract.
    mount_console(app)
    openapi.install(app, contract.CONTRACT)  # the document as served: real statuses, envelopes, bodies
    # Added before the request log, so it runs inside it: every fast-lane request is logged too.
    app.add_middleware(
        FastLane, routes=metrics.tag_fast_routes(telemetry, [*commands.FAST_ROUTES, *sandboxes.FAST_ROUTES])
    )
    # Outside the fast lane, so both lanes' calls on a sandbox are in the audit trail.
    app.add_middleware(AuditMiddleware)
    # Outside the fast lane, which reads bodies too: every body is bounded before it is buffered.
    app.add_middleware(
        BodyLimit,
        default_bytes=bodies.MAX_BODY_BYTES,
        routes=bodies.BODY_ROUTES,
        refuse=bodies.body_too_large,
        render=bodies.render_refusal,
        too_slow=errors.RequestTimeout,
    )
    app.add_middleware(
        RequestContextMiddleware,
        service="controlplane",
        quiet_paths=frozenset({"/internal/v1/hosts/heartbeat"}),
    )
    metrics.install(app, telemetry)  # outermost: counts and times every request; serves GET /metrics
    return app
