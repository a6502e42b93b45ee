"""The host agent's ASGI app: wiring in the lifespan, bearer-token auth, one error handler.

    app = create_app(HostAgentSettings(token=...))

Start-up prepares the host (cgroups, forwarding, nftables), builds the guest agent if its binary is
missing or stale, re-adopts the sandboxes recorded in the state directory, fills the warm pool and
starts the heartbeat. Shutdown stops the background work and leaves every sandbox running for the
next agent process to adopt.
"""

from __future__ import annotations

import asyncio
import fcntl
import hmac
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Lifespan

from paddock_core import metrics
from paddock_core.bodylimit import BodyLimit
from paddock_core.fastlane import FastLane
from paddock_core.logging import get_logger
from paddock_hostagent import capacity, errors
from paddock_hostagent.builds import BuildManager
from paddock_hostagent.channelserver import ChannelEndpoint
from paddock_hostagent.drivers.base import SandboxRuntime
from paddock_hostagent.drivers.build.buildah import Buildah
from paddock_hostagent.drivers.net.bridges import BridgeNetworks
from paddock_hostagent.drivers.net.dns import Upstream
from paddock_hostagent.drivers.net.egress_rules import EgressFirewall
from paddock_hostagent.drivers.net.network import NetworkManager
from paddock_hostagent.drivers.runtime.oci import OciOptions, OciRuntime
from paddock_hostagent.drivers.runtime.ocispec import IoLimits
from paddock_hostagent.drivers.runtime.pool import ImagePoolConfig
from paddock_hostagent.drivers.storage import rootdisks
from paddock_hostagent.drivers.storage.s3mounts import S3Mounter
from paddock_hostagent.drivers.vm.qemu import QemuOptions, QemuRuntime
from paddock_hostagent.egress import EgressService
from paddock_hostagent.guest.build import ensure_agent_binary
from paddock_hostagent.host import network_manager, prepare_machine
from paddock_hostagent.images import ImageStore
from paddock_hostagent.middleware import RequestLogMiddleware
from paddock_hostagent.processes import router as process_router
from paddock_hostagent.records import RecordStore
from paddock_hostagent.registrar import Registrar
from paddock_hostagent.routes import (
    BODY_ROUTES,
    MAX_BODY_BYTES,
    body_too_large,
    error_response,
    fast_routes,
    render_refusal,
    router,
    validation_reasons,
)
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.settings import HostAgentSettings
from paddock_hostagent.volumeroutes import router as volume_router

log = get_logger(__name__)
MIB = 1 << 20


def watch_capacity(app: FastAPI, telemetry: metrics.ServiceMetrics) -> None:
    """The host's gauges, read from ``app.state.manager`` at each scrape (``capacity.py``'s accounting)."""
    gauge = telemetry.gauge
    memory_promised = gauge("paddock_host_memory_promised_bytes", "Memory limits promised to sandboxes.")
    memory_free = gauge("paddock_host_memory_free_bytes", "Memory limit this host can still promise.")
    disk_promised = gauge("paddock_host_disk_promised_bytes", "Disk sizes promised to sandboxes.")
    disk_free = gauge("paddock_host_disk_free_bytes", "Disk this host can still promise.")
    sandboxes = gauge("paddock_host_sandboxes", "Sandboxes on this host.")
    pool = gauge(
        "paddock_host_pool_slots",
        "Warm-pool slots ready (parked: with a sandbox of the pool image booted; images: sandboxes "
        "parked by the per-image pools).",
        ["kind"],
    )
    pool_memory = gauge(
        "paddock_host_pool_memory_bytes",
        "Host memory the parked sandboxes of the warm pools hold (their cgroups' usage).",
    )
    pool_budget = gauge(
        "paddock_host_pool_memory_budget_bytes", "What the per-image pools' parked sandboxes may hold."
    )

    async def refresh() -> None:
        manager: SandboxManager | None = getattr(app.state, "manager", None)
        if manager is None:
            return
        memory = manager.memory_view()
        memory_promised.set(memory.promised_mib * MIB)
        memory_free.set(memory.free_mib * MIB)
        disk = manager.disk_view()
        if disk is not None:
            disk_promised.set(disk.promised.limit_mib * MIB)
            disk_free.set(disk.free_mib * MIB)
        info = manager.info()
        sandboxes.set(info.vm_count)
        pool.labels("warm").set(info.warm_slots)
        pool.labels("parked").set(info.parked_slots)
        slots = getattr(manager.runtime, "pool", None)
        if slots is not None:
            pool.labels("images").set(slots.images_count)
            pool_memory.set(slots.held_bytes())
            pool_budget.set(slots.images.budget_bytes if slots.images is not None else 0)

    telemetry.add_refresher(refresh)


class StateDirBusyError(RuntimeError):
    """Another host agent process holds this state directory."""


def lock_state_dir(settings: HostAgentSettings) -> IO[str]:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    handle = open(settings.state_dir / "agent.lock", "w")  # noqa: SIM115 - held for the app's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise StateDirBusyError(f"another host agent is using {settings.state_dir}") from exc
    return handle


def _disk_mounter(settings: HostAgentSettings, network: NetworkManager) -> S3Mounter | None:
    """S3 disks need s3fs and /dev/fuse; without them the host still runs sandboxes, and says why it
    cannot mount when asked. s3fs resolves through the sandboxes' resolver, from their namespaces."""
    mounter = S3Mounter(settings.state_dir / "disks", resolv_conf=network.resolv_conf())
    if not mounter.available():
        log.warning("disks_unavailable", reason="s3fs or /dev/fuse missing")
        return None
    return mounter


def _oci_runtime(
    settings: HostAgentSettings,
    runtime_name: str,
    runsc_platform: str,
    guest_binary: Path,
    network: NetworkManager,
    images: ImageStore,
    *,
    pool_size: int | None = None,
) -> OciRuntime:
    """The container and gVisor tiers: crun, runc or runsc under the OCI driver."""

    def pool_rootfs() -> Path | None:
        """The pool image's root filesystem once it is on this host (never built for the pool)."""
        if settings.pool_image and images.is_cached(settings.pool_image):
            return images.rootfs_path(settings.pool_image)
        return None

    runtime = OciRuntime(
        OciOptions(
            state_dir=settings.state_dir,
            runtime=runtime_name,
            runsc_platform=runsc_platform or "ptrace",
            guest_binary=guest_binary,
            network=network,
            filesystem=rootdisks.choose_filesystem(settings.disk_fs),
            pool_size=settings.pool_size if pool_size is None else pool_size,
            pool_disk_mib=settings.pool_disk_mib,
            boot_timeout_s=settings.boot_timeout_s,
            runtime_root=settings.runtime_root,
            pool_rootfs=pool_rootfs,
            sandbox_pids_max=settings.sandbox_pids_max,
            pids_budget=settings.pids_budget,
            io=IoLimits(
                settings.disk_read_bps,
                settings.disk_write_bps,
                settings.disk_read_iops,
                settings.disk_write_iops,
            ),
        )
    )
    runtime.pool.configure_images(
        ImagePoolConfig(
            budget_bytes=capacity.pool_budget_bytes(settings.pool_memory_pct),
            per_kind_max=settings.pool_kind_max,
        )
    )
    return runtime


async def build_manager(settings: HostAgentSettings) -> SandboxManager:
    network = network_manager(settings)
    facts = await asyncio.to_thread(prepare_machine, settings.runtime, network, settings.runsc_platform)
    firewall = EgressFirewall(settings.nft_table, settings.subnet, network.gateway)
    await asyncio.to_thread(firewall.setup_host)
    upstreams = [item for item in settings.dns_upstream.split(",") if item.strip()]
    egress = EgressService(
        firewall, network.gateway, [Upstream.parse(item) for item in upstreams or network.upstream_servers()]
    )
    guest_binary = await asyncio.to_thread(ensure_agent_binary, settings.state_dir / "guest")
    images = ImageStore.from_settings(settings)
    runtime: OciRuntime | QemuRuntime
    vm = QemuRuntime(
        QemuOptions(
            state_dir=settings.state_dir,
            guest_binary=guest_binary,
            network=network,
            boot_timeout_s=max(settings.boot_timeout_s, settings.vm_boot_timeout_s),
            runtime_root=settings.runtime_root,
            accel=settings.vm_accel,
        )
    )
    # The driver of the other tier stops and destroys the sandboxes it made before the host switched
    # (docs/isolation.md); it never starts one. The OCI one serves runsc's and crun's records alike.
    retired: dict[str, SandboxRuntime]
    if facts.runtime == "qemu":  # the VM tier (docs/isolation-vm.md)
        runtime = vm
        oci = _oci_runtime(settings, "runc", "", guest_binary, network, images, pool_size=0)
        retired = {oci.name: oci}
    else:
        runtime = _oci_runtime(settings, facts.runtime, facts.runsc_platform, guest_binary, network, images)
        retired = {vm.name: vm}
    bridges = BridgeNetworks(runtime.layout_tag, settings.nft_table, settings.private_network_pool)
    await asyncio.to_thread(bridges.setup_host)
    manager = SandboxManager(
        settings,
        runtime,
        images,
        RecordStore(settings.state_dir / "sandboxes"),
        bridges=bridges,
        egress=egress,
        disks=_disk_mounter(settings, network),
        retired=retired,
    )
    manager.runtime_label = facts.runtime
    if Buildah.available():  # templates need buildah (scripts/setup-host.sh installs it)
        manager.builds = BuildManager(
            manager.images,
            Buildah(settings.state_dir / "buildah", shutil.which(facts.build_runtime) or facts.build_runtime),
            settings.image_dir / ".builds",  # next to the images: the result is renamed into place
            network=network,
            egress=egress,
            in_use=manager.uses_image,
            # Beside the image cache: the catalog's images as buildah images, once per host for every
            # account's builds (drivers/build/basestore.py).
            base_store=settings.image_dir / ".builder-base",
        )
    await manager.start()
    return manager


def create_app(settings: HostAgentSettings) -> FastAPI:
    token = settings.require_token().get_secret_value().encode()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lock = lock_state_dir(settings)
        try:
            manager = await build_manager(settings)
            registrar = Registrar(settings, manager)
            app.state.manager = manager
            app.state.registrar = registrar
            registrar.start()
            log.info(
                "host_agent_started",
                host_id=settings.id,
                runtime=manager.runtime_label,
                sandboxes=len(manager.views()),
            )
            try:
                yield
            finally:
                await registrar.stop()
                await manager.close()
        finally:
            lock.close()

    def authorized(header: str) -> bool:
        scheme, _, presented = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token)

    return api_app(authorized, lifespan)


def api_app(authorized: Callable[[str], bool], lifespan: Lifespan[FastAPI] | None = None) -> FastAPI:
    """The internal API (routes, fast lane, kept channel, request log, error handlers) over
    ``app.state.manager``, which ``lifespan`` sets (tests set it themselves)."""

    async def require_token(request: Request) -> None:
        if not authorized(request.headers.get("authorization", "")):
            raise errors.Unauthorized("missing or invalid bearer token")

    app = FastAPI(title="Paddock host agent", version="1", lifespan=lifespan)
    telemetry = metrics.from_env("hostagent")  # None with PADDOCK_METRICS=0
    if telemetry is not None:
        watch_capacity(app, telemetry)
    app.include_router(router, dependencies=[Depends(require_token)])
    app.include_router(process_router, dependencies=[Depends(require_token)])
    app.include_router(volume_router, dependencies=[Depends(require_token)])
    app.add_middleware(FastLane, routes=metrics.tag_fast_routes(telemetry, fast_routes(authorized)))
    app.add_middleware(  # outside the fast lane, which reads bodies too
        BodyLimit,
        default_bytes=MAX_BODY_BYTES,
        routes=BODY_ROUTES,
        refuse=body_too_large,
        render=render_refusal,
        too_slow=errors.RequestTimeout,
    )
    app.add_middleware(RequestLogMiddleware)
    app.add_middleware(ChannelEndpoint, authorized=authorized)  # one WebSocket, logged by itself
    metrics.install(app, telemetry)  # outermost: counts and times every request; serves GET /metrics

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.exception_handler(errors.HostAgentServerError)
    async def domain_error(request: Request, exc: errors.HostAgentServerError) -> Response:
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(400, "bad_request", validation_reasons(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> Response:
        request_id = uuid.uuid4().hex[:12]
        log.error("unhandled_error", request_id=request_id, path=request.url.path, exc_info=exc)
        return error_response(500, "internal", f"internal error (request {request_id})")

    return app
