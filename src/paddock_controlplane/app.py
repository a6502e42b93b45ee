"""The control-plane ASGI app: ``create_app(settings)`` wires services in the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from paddock_core.crypto import SecretBox
from paddock_core.db import make_engine, make_sessionmaker, upgrade
from paddock_core.logging import get_logger
from paddock_controlplane import reconciler
from paddock_controlplane.api.errors import install_error_handlers
from paddock_controlplane.api.middleware import RequestContextMiddleware
from paddock_controlplane.api.routes import catalog, internal, probes
from paddock_controlplane.services import Services
from paddock_controlplane.settings import ControlPlaneSettings

MIGRATIONS = Path(__file__).parent / "migrations"
log = get_logger("paddock.controlplane")


async def migrate(settings: ControlPlaneSettings) -> None:
    await upgrade(MIGRATIONS, settings.database_url)


def create_app(settings: ControlPlaneSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await migrate(settings)
        engine = make_engine(settings.database_url)
        services = Services(
            settings=settings,
            engine=engine,
            sessions=make_sessionmaker(engine),
            secret_box=SecretBox(settings.secret_key.get_secret_value() or "paddock-dev-insecure-key"),
        )
        app.state.services = services
        loop = reconciler.Reconciler(services, [reconciler.host_liveness_pass])
        await loop.run_once()
        loop.start()
        log.info("controlplane_started", region=settings.region, database=engine.dialect.name)
        try:
            yield
        finally:
            await loop.stop()
            await engine.dispose()

    app = FastAPI(
        title="Paddock sandbox control plane",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    install_error_handlers(app)
    for module in (probes, catalog, internal):
        app.include_router(module.router)
    app.add_middleware(RequestContextMiddleware, service="controlplane")
    return app
