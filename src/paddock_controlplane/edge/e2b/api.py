"""E2B's control API (e2b-dev/infra ``spec/openapi.yml``) on Paddock: the routes the unmodified E2B SDKs
call, each parsing E2B's request and calling the control plane's own domain functions (``lifecycle``,
``suspension``, ``destruction``, ``queries``) exactly as the ``/v1`` routes do. Paddock API keys work
unchanged in ``X-API-Key``. Errors are E2B's ``{"code", "message"}`` (``e2b.errors``); what is not built
answers 501 (docs/e2b.md has the table)."""

from __future__ import annotations

import datetime as dt
import re
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import select

from paddock_controlplane.edge.api.routes.bodies import MAX_BODY_BYTES, optional_body
from paddock_controlplane.edge.auditing import AuditMiddleware
from paddock_controlplane.edge.e2b import (
    audit_targets,
    callers,
    fresh_start,
    identity,
    params,
    sandbox_logs,
    schemas,
    store,
    template_catalog,
)
from paddock_controlplane.edge.e2b import errors as e2b_errors
from paddock_controlplane.edge.e2b import snapshots as e2b_snapshots
from paddock_controlplane.edge.e2b import start_command as e2b_start
from paddock_controlplane.edge.e2b import templates as e2b_templates
from paddock_controlplane.edge.e2b import volume_content as e2b_volume_content
from paddock_controlplane.edge.e2b import volumes as e2b_volumes
from paddock_controlplane.edge.e2b.store import E2bSandbox
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import audit, queries, sandbox_metrics
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.principals import Principal
from paddock_controlplane.records.schemas.sandboxes import CreateSandboxRequest, ForkSandboxRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.snapshots import ID_PREFIX as SNAPSHOT_PREFIX
from paddock_controlplane.records.states import BOOTED, SandboxStatus
from paddock_controlplane.sandboxes import destruction, lifecycle, suspension, traffic
from paddock_core import errors
from paddock_core.bodylimit import BodyLimit, BodyRoute
from paddock_core.db import transaction
from paddock_core.http import RequestContextMiddleware
from paddock_core.timeutil import as_utc, rfc3339
from paddock_hostagent.schemas import MAX_LOG_TAIL_LINES, VOLUME_FILE_BYTES

router = APIRouter()

#: The shape an E2B sandbox boots with: E2B's default sandbox has 2 vCPUs, and 2 GiB leaves the code
#: interpreter's kernels room.
DEFAULT_SHAPE = "s-2vcpu-2gb"
#: How long a create, pause or resume waits for the sandbox to settle before answering.
SETTLE_S = 60.0
#: A list page is at most this long (E2B's own maximum).
MAX_LIMIT = 100
#: ``endAt`` of a sandbox with no E2B lifetime (created through ``/v1``): it lives until it is destroyed.
NEVER = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
_ID_RE = re.compile(r"^[a-z0-9_-]{1,64}$")


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _cutoff(services: Services) -> dt.datetime:
    return services.clock() - dt.timedelta(hours=services.settings.retention_destroyed_h)


async def _visible(services: Services, user_id: str, sandbox_id: str, wait: str | None = None) -> Sandbox:
    """The caller's sandbox while E2B would show it (running or paused); 404 otherwise, as E2B answers
    for a killed one."""
    if not _ID_RE.match(sandbox_id):
        raise errors.NotFound(f"sandbox {sandbox_id!r} not found")
    how = queries.Wait(wait, SETTLE_S) if wait else None
    sandbox = await queries.get_when(services, user_id, sandbox_id, _cutoff(services), how)
    if sandbox.status not in schemas.STATES:
        raise errors.NotFound(f"sandbox {sandbox_id!r} not found")
    return sandbox


def _template_of(sandbox: Sandbox, row: E2bSandbox | None) -> str:
    return row.template_id if row is not None else identity.template_for_rootfs(sandbox.rootfs)


def _end_of(sandbox: Sandbox) -> dt.datetime:
    """E2B's ``endAt`` from the native lifetime: ``end_at``, when it paused (its clock stopped), or
    never for a sandbox with no lifetime."""
    if sandbox.end_at is not None:
        return as_utc(sandbox.end_at)
    if schemas.STATES.get(sandbox.status) == "paused" and sandbox.timeout_s:
        return as_utc(sandbox.paused_at or sandbox.created_at)
    return NEVER


def _tags(sandbox: Sandbox) -> dict[str, str]:
    return {str(key): str(value) for key, value in (sandbox.labels or {}).items()}


def _field(exc: errors.ValidationFailed) -> errors.ValidationFailed:
    """/v1's 400 under E2B's field names."""
    names = {"timeout_s": "timeout", "envs": "envVars", "on_timeout": "autoPause"}
    for native, e2b in names.items():
        if native in exc.fields:
            return errors.ValidationFailed.field(e2b, exc.fields[native])
    return exc


def _on_timeout(body: schemas.NewSandbox) -> str:
    """``autoPause`` is a frozen pause at the timeout; with ``autoPauseMemory: false`` (the SDK's
    ``lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}``) a hibernation."""
    if not body.auto_pause:
        return "destroy"
    return "hibernate" if body.auto_pause_memory is False else "pause"


# --- sandboxes -----------------------------------------------------------------------------------


@router.post("/sandboxes", status_code=201)
@router.post("/v2/sandboxes", status_code=201)
async def create(body: schemas.NewSandbox, request: Request) -> dict[str, Any]:
    services, principal = await callers.caller(request.scope, None)
    if body.mcp:
        raise e2b_errors.NotBuilt("mcp: MCP gateways are not served by Paddock")
    network = body.network
    if network is not None:
        _refuse_unserved(network, "network.")
    if body.iam:
        raise e2b_errors.NotBuilt("iam: workload identity is not served by Paddock")
    # ``allowOut``/``denyOut`` (and ``allow_internet_access: false``, E2B's deny of everything) as the
    # native egress rules: an allowlist, or a denylist with allowed exceptions (schemas.egress).
    egress = schemas.egress(network, body.allow_internet_access)
    # How its ports are reached: /v1's ``ingress_host_header`` and ``ingress_https_ports``.
    host_mask = network.host_mask() if network is not None else None
    tls_ports = network.tls_ports() if network is not None else []
    timeout_s = store.check_timeout(body.timeout)
    metadata = store.check_metadata(body.metadata)
    auto_resume = body.resumes_on_activity()
    # One lifetime and one label set (issue #33): E2B's ``timeout`` and ``metadata`` are /v1's
    # ``timeout_s`` and ``metadata``, ``autoPause`` its ``on_timeout: pause`` (``hibernate`` with
    # ``autoPauseMemory: false``, the SDK's ``mode: "filesystem"``: only the disk is kept); the
    # reconciler's expiry pass enforces them. ``timeout`` 0 is no lifetime, as /v1's 0 is.
    async with services.sessions() as session:  # a template's or snapshot's ``name:tag`` (E2B's tags)
        tagged = await e2b_templates.template_for(
            session, principal.user_id, body.template_id
        ) or await e2b_snapshots.snapshot_for(session, principal.user_id, body.template_id)
        rootfs = tagged or identity.rootfs_for_template(body.template_id)
        # The E2B build that made its template: the sizes it asked (cpuCount, memoryMB), else the E2B
        # API's shape, the CPUs a create may ask of it (maxCpuCount), and its start command, run once
        # the sandbox runs.
        build = await e2b_templates.build_of(session, principal.user_id, rootfs)
    shape = e2b_templates.cpus_for(
        (build.shape if build is not None else None) or DEFAULT_SHAPE,
        build.max_cpu_count if build is not None else None,
        body.cpu_count,
    )
    start = e2b_start.StartCommand.from_json(build.start) if build is not None else None
    request_body = CreateSandboxRequest(
        shape=shape,
        rootfs=rootfs,
        envs=body.env_vars or None,
        egress=egress,
        timeout_s=timeout_s or None,
        on_timeout=_on_timeout(body) if timeout_s else None,
        metadata=metadata or None,
        # ``allowPublicTraffic`` is the ingress (docs/e2b.md): true opens the sandbox's URLs to anyone;
        # false or unset keeps them to the holder of its traffic token (Paddock opens nothing unasked).
        ingress_enabled=bool(network is not None and network.allow_public_traffic),
        ingress_host_header=host_mask,
        ingress_https_ports=tls_ports or None,
        volumes=e2b_volumes.attachments(body.volume_mounts),
    )
    try:
        sandbox = await lifecycle.create(services, principal.user_id, request_body)
    except errors.ValidationFailed as exc:
        if "rootfs" in exc.fields:
            raise errors.NotFound(f"template {body.template_id!r} not found") from None
        raise e2b_volumes.renamed(_field(exc)) from None
    except errors.InvalidState as exc:
        if "on_timeout" in exc.fields:  # a host whose tier does not hibernate
            raise errors.InvalidState(
                f"autoPauseMemory: false: {exc.fields['on_timeout']}", fields={"autoPauseMemory": "false"}
            ) from None
        raise e2b_volumes.renamed(exc) from None
    except errors.PaddockError as exc:
        raise e2b_volumes.renamed(exc) from None
    try:
        async with transaction(services.sessions) as session:
            await store.record(
                session,
                sandbox_id=sandbox.id,
                user_id=principal.user_id,
                template_id=body.template_id,
                now=services.clock(),
                auto_resume=auto_resume,
            )
        # A template whose E2B build asked a start command answers once it is ready (start_command.py);
        # so does a sandbox booted from a snapshot of one where memory is not in the snapshot (E2B's
        # keeps the running process; containers and gVisor start it afresh: fresh_start.py).
        if start is None and sandbox.rootfs.startswith(SNAPSHOT_PREFIX):
            start = await fresh_start.command_for(services, principal.user_id, sandbox)
        if start is not None:
            await e2b_start.run(services, sandbox, start, body.template_id)
    except BaseException:
        await destruction.destroy(services, principal.user_id, sandbox.id, reason="e2b_create_failed")
        raise
    return schemas.created(sandbox, body.template_id, services.settings)


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """``metadata=k1%3Dv1%26k2%3Dv2``: the SDK urlencodes its ``quote``-d pairs into one parameter."""
    if not raw:
        return {}
    if len(raw) > 16384:
        raise errors.ValidationFailed.field("metadata", "at most 16384 characters")
    pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True)
    if len(pairs) > store.MAX_METADATA_KEYS:
        raise errors.ValidationFailed.field("metadata", f"at most {store.MAX_METADATA_KEYS} keys")
    return {urllib.parse.unquote(key): urllib.parse.unquote(value) for key, value in pairs}


def _states_filter(raw: str | None) -> list[str]:
    if not raw:
        return ["running", "paused"]
    states = [part.strip() for part in raw.split(",") if part.strip()]
    for state in states:
        if state not in ("running", "paused"):
            raise errors.ValidationFailed.field("state", f"unknown state {state!r}; running or paused")
    return states


def _limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return MAX_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise errors.ValidationFailed.field("limit", "must be an integer") from None
    if value < 1:
        raise errors.ValidationFailed.field("limit", "must be at least 1")
    return min(value, MAX_LIMIT)


async def _list(request: Request, states: list[str]) -> JSONResponse:
    services, principal = await callers.caller(request.scope, None)
    query = request.query_params
    metadata = _metadata_filter(query.get("metadata"))
    limit = _limit(query.get("limit"))
    order = query.get("order") or "asc"
    if order not in ("asc", "desc"):
        raise errors.ValidationFailed.field("order", "must be asc or desc")
    token = query.get("nextToken") or ""
    if token and not _ID_RE.match(token):
        raise errors.ValidationFailed.field("nextToken", "is not a token this API gave")
    statuses = [status for status, state in schemas.STATES.items() if state in states]
    statement = (
        select(Sandbox, E2bSandbox)
        .outerjoin(E2bSandbox, E2bSandbox.sandbox_id == Sandbox.id)
        .where(Sandbox.user_id == principal.user_id, Sandbox.status.in_(statuses))
    )
    for key, value in metadata.items():  # /v1's own filter (queries.list_sandboxes)
        statement = statement.where(Sandbox.labels[key].as_string() == value)
    template = query.get("template")
    if template:
        statement = statement.where(
            (E2bSandbox.template_id == template) | (Sandbox.rootfs == identity.rootfs_for_template(template))
        )
    started_after = query.get("startedAfter")
    if started_after:
        try:
            after = dt.datetime.fromisoformat(started_after.replace("Z", "+00:00"))
        except ValueError:
            raise errors.ValidationFailed.field("startedAfter", "must be an RFC 3339 time") from None
        statement = statement.where(Sandbox.created_at >= as_utc(after))
    if token:
        statement = statement.where(Sandbox.id > token if order == "asc" else Sandbox.id < token)
    # Ids are ULIDs: their order is their creation order, and the last one seen is the next token.
    statement = statement.order_by(Sandbox.id if order == "asc" else Sandbox.id.desc()).limit(limit + 1)
    async with services.sessions() as session:
        rows = list((await session.execute(statement)).tuples().all())
        page = rows[:limit]
    items = [
        schemas.listed(sandbox, _template_of(sandbox, row), _end_of(sandbox), _tags(sandbox))
        for sandbox, row in page
    ]
    headers = {"x-next-token": page[-1][0].id} if len(rows) > limit else {}
    return JSONResponse(items, headers=headers)


@router.get("/v2/sandboxes")
async def list_v2(request: Request) -> JSONResponse:
    return await _list(request, _states_filter(request.query_params.get("state")))


@router.get("/sandboxes")
async def list_running(request: Request) -> JSONResponse:
    """The first list (``GET /sandboxes``): running sandboxes only."""
    return await _list(request, ["running"])


#: Forks per request (the SDK's ``MAX_FORK_COUNT``); they are made one after another.
MAX_FORKS = 20


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork(sandbox_id: str, request: Request) -> list[dict[str, Any]]:
    """Paddock's fork, ``count`` times: each child boots from a copy of the source's disk (its processes
    start afresh; E2B's keeps memory) with the source's template, metadata and a lifetime of its own.
    A child that cannot be made is an ``error`` entry; a missing source is 404 for the whole request."""
    services, principal = await callers.caller(request.scope, None)
    body = await optional_body(request, schemas.Fork)
    count = 1 if body.count is None else body.count
    if not 1 <= count <= MAX_FORKS:
        raise errors.ValidationFailed.field("count", f"must be between 1 and {MAX_FORKS}")
    source = await _visible(services, principal.user_id, sandbox_id)
    async with services.sessions() as session:
        row = await store.get(session, sandbox_id)
    timeout_s = store.check_timeout(body.timeout if body.timeout is not None else source.timeout_s)
    template_id = _template_of(source, row)
    # The child's lifetime runs from its own start; its metadata is its source's (lifecycle.fork).
    asked = ForkSandboxRequest(
        timeout_s=timeout_s or None,
        on_timeout=(source.on_timeout or "destroy") if timeout_s else None,
    )
    start = await fresh_start.command_for(services, principal.user_id, source)
    results: list[dict[str, Any]] = []
    for _ in range(count):
        try:
            child = await lifecycle.fork(services, principal.user_id, sandbox_id, asked)
            child = await _visible(services, principal.user_id, child.id, wait=SandboxStatus.RUNNING)
            if child.status != SandboxStatus.RUNNING:
                raise errors.InvalidState(f"the fork {child.id} is {child.status}, not running")
            async with transaction(services.sessions) as session:
                await store.record(
                    session,
                    sandbox_id=child.id,
                    user_id=principal.user_id,
                    template_id=template_id,
                    now=services.clock(),
                    auto_resume=row is not None and row.auto_resume,  # the source's lifecycle
                )
            if start is not None:
                try:
                    await e2b_start.run(services, child, start, template_id)
                except BaseException:
                    await destruction.destroy(services, principal.user_id, child.id, reason="e2b_fork_failed")
                    raise
            results.append({"sandbox": schemas.created(child, template_id, services.settings)})
        except errors.PaddockError as exc:
            results.append({"error": e2b_errors.error_body(exc.status, exc.message)})
    return results


@router.get("/sandboxes/metrics")
async def many_metrics(request: Request) -> dict[str, Any]:
    """The newest sample of each of ``sandbox_ids`` (comma-separated) that is the caller's, running, and
    sampled in the last :func:`sandbox_metrics.fresh_s`, by id; any other id is left out, as E2B leaves
    out what it cannot read. Declared before ``/sandboxes/{id}``, which would take "metrics" for an id."""
    services, principal = await callers.caller(request.scope, None)
    raw = request.query_params.get("sandbox_ids")
    ids = raw.split(",") if raw else []
    if not ids or not all(ids):
        raise errors.ValidationFailed.field("sandbox_ids", "must name sandboxes, comma-separated")
    if len(ids) > MAX_LIMIT:
        raise errors.ValidationFailed.field("sandbox_ids", f"at most {MAX_LIMIT} sandboxes a request")
    wanted = sorted({sandbox_id for sandbox_id in ids if _ID_RE.match(sandbox_id)})
    now = services.clock()
    async with services.sessions() as session:
        running = (
            await session.scalars(
                select(Sandbox.id).where(
                    Sandbox.user_id == principal.user_id,
                    Sandbox.id.in_(wanted),
                    Sandbox.status == SandboxStatus.RUNNING,
                )
            )
        ).all()
        since = now - dt.timedelta(seconds=sandbox_metrics.fresh_s(services.settings.metrics_interval_s))
        latest = await sandbox_metrics.newest(session, principal.user_id, list(running), since)
    return {"sandboxes": {sandbox_id: _metric(row) for sandbox_id, row in sorted(latest.items())}}


@router.get("/sandboxes/{sandbox_id}")
async def get(sandbox_id: str, request: Request) -> dict[str, Any]:
    services, principal = await callers.caller(request.scope, sandbox_id)
    sandbox = await _visible(services, principal.user_id, sandbox_id)
    async with services.sessions() as session:
        row = await store.get(session, sandbox_id)
        mounts = await e2b_volumes.mounts_of(session, sandbox_id)
    return {
        **schemas.detail(
            sandbox,
            _template_of(sandbox, row),
            _end_of(sandbox),
            _tags(sandbox),
            services.settings,
            auto_resume=row is not None and row.auto_resume,
        ),
        "volumeMounts": mounts,
    }


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, request: Request) -> Response:
    services, principal = await callers.caller(request.scope, sandbox_id)
    sandbox = await _visible(services, principal.user_id, sandbox_id)
    async with services.sessions() as session:
        holds_volumes = bool(await e2b_volumes.mounts_of(session, sandbox.id))
    await destruction.destroy(services, principal.user_id, sandbox.id)
    if holds_volumes:
        # E2B's programs mount a volume in the next sandbox as soon as the kill answers; Paddock's volume
        # is free once its holder is destroyed (one writer), so the kill waits for that.
        wait = queries.Wait(SandboxStatus.DESTROYED, SETTLE_S)
        await queries.get_when(services, principal.user_id, sandbox.id, _cutoff(services), wait)
    return Response(status_code=204)


async def _set_end(
    services: Services, sandbox: Sandbox, end_at: dt.datetime | None, timeout_s: int | None
) -> None:
    """Sets the native ``end_at`` (and ``timeout_s``), which ``/v1`` shows and the reconciler's expiry
    pass acts on; a sandbox with no lifetime yet (made through ``/v1``) is destroyed when it passes."""
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox.id, with_for_update=True)
        if row is None:
            raise errors.NotFound(f"sandbox {sandbox.id!r} not found")
        row.end_at = end_at
        if timeout_s is not None:
            row.timeout_s = timeout_s or None
        if row.timeout_s and row.on_timeout is None:
            row.on_timeout = "destroy"
        if end_at is not None and row.timeout_s is None:
            row.timeout_s = max(1, int((end_at - services.clock()).total_seconds()))
            row.on_timeout = row.on_timeout or "destroy"


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, body: schemas.Timeout, request: Request) -> Response:
    services, principal = await callers.caller(request.scope, sandbox_id)
    timeout_s = store.check_timeout(body.timeout)
    sandbox = await _visible(services, principal.user_id, sandbox_id)
    now = services.clock()
    paused = schemas.STATES[sandbox.status] == "paused"
    await _set_end(services, sandbox, None if paused else now + dt.timedelta(seconds=timeout_s), timeout_s)
    return Response(status_code=204)


def _refuse_unserved(network: schemas.EgressConfig, where: str) -> None:
    """A 501 naming the first network field set that Paddock does not act on (``where``: what its name
    starts with, ``network.`` in a create)."""
    unserved = network.unserved()
    if unserved:
        raise e2b_errors.NotBuilt(
            f"{where}{unserved[0]}: not served by Paddock; allowOut and denyOut are (its egress"
            " rules, docs/e2b.md), and its sandboxes resolve names through their host"
        )


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(sandbox_id: str, request: Request) -> Response:
    """The SDK's ``update_network``: the sandbox's egress allowlist replaced, as ``PUT /v1/…/egress``
    does, from the fields a create's ``network`` takes (``schemas.egress``). E2B's update replaces the
    whole configuration, so one that leaves everything out opens the sandbox again."""
    services, principal = await callers.caller(request.scope, sandbox_id)
    await _visible(services, principal.user_id, sandbox_id)  # 404 before 400, as /v1 (§11.7)
    body = await optional_body(request, schemas.NetworkUpdate)
    _refuse_unserved(body, "")
    egress = schemas.egress(body, body.allow_internet_access, where="")
    await traffic.set_egress(services, principal.user_id, sandbox_id, egress or [])
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
async def refresh(sandbox_id: str, request: Request) -> Response:
    services, principal = await callers.caller(request.scope, sandbox_id)
    body = await optional_body(request, schemas.Refresh)
    duration = store.check_timeout(body.duration, "duration")
    sandbox = await _visible(services, principal.user_id, sandbox_id)
    wanted = services.clock() + dt.timedelta(seconds=duration)
    if sandbox.end_at is not None and as_utc(sandbox.end_at) > wanted:
        return Response(status_code=204)  # a refresh only ever extends
    if schemas.STATES[sandbox.status] == "running":
        await _set_end(services, sandbox, wanted, None)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(sandbox_id: str, request: Request) -> Response:
    """``memory: false`` (the SDK's ``mode="filesystem"``) hibernates: only the disk is kept and the
    processes start afresh at the next connect (docs/hibernation.md); otherwise a frozen pause."""
    services, principal = await callers.caller(request.scope, sandbox_id)
    body = await optional_body(request, schemas.Pause)
    sandbox = await _visible(services, principal.user_id, sandbox_id, wait=SandboxStatus.RUNNING)
    if schemas.STATES[sandbox.status] == "paused":
        raise errors.InvalidState(f"sandbox {sandbox_id!r} is already paused")
    await suspension.pause(services, principal.user_id, sandbox_id, keep_memory=body.memory is not False)
    settled = await _visible(services, principal.user_id, sandbox_id, wait=SandboxStatus.PAUSED)
    if settled.status != SandboxStatus.PAUSED:
        raise errors.InvalidState(f"sandbox {sandbox_id!r} did not pause: {settled.status}")
    await _set_end(services, settled, None, None)
    return Response(status_code=204)


async def _resume_or_connect(request: Request, sandbox_id: str, *, only_paused: bool) -> JSONResponse:
    services, principal = await callers.caller(request.scope, sandbox_id)
    body = await optional_body(request, schemas.Connect)
    sandbox = await _visible(services, principal.user_id, sandbox_id)
    if sandbox.status == SandboxStatus.PAUSING:
        sandbox = await _visible(services, principal.user_id, sandbox_id, wait=SandboxStatus.PAUSED)
    async with services.sessions() as session:
        row = await store.get(session, sandbox_id)
    timeout_s = store.check_timeout(body.timeout if body.timeout is not None else sandbox.timeout_s)
    now = services.clock()
    wanted = now + dt.timedelta(seconds=timeout_s)
    resumed = sandbox.status == SandboxStatus.PAUSED
    if only_paused and not resumed:
        raise errors.InvalidState(f"sandbox {sandbox_id!r} is already running")
    not_ready = None
    if resumed:
        try:  # woken from hibernation: its template's start command runs again (fresh_start.py)
            await fresh_start.resume(services, principal.user_id, sandbox_id, _template_of(sandbox, row))
        except e2b_start.NotReady as exc:
            not_ready = exc  # it runs, with the user's files: its lifetime is set before the 409
    sandbox = await _visible(services, principal.user_id, sandbox_id, wait=SandboxStatus.RUNNING)
    if sandbox.status != SandboxStatus.RUNNING:
        raise errors.InvalidState(f"sandbox {sandbox_id!r} is {sandbox.status}, not running")
    if resumed or sandbox.end_at is None or as_utc(sandbox.end_at) < wanted:
        await _set_end(services, sandbox, wanted, timeout_s)  # connect extends a running one, never shortens
    if not_ready is not None:
        raise not_ready
    status = 201 if resumed else 200
    return JSONResponse(
        schemas.created(sandbox, _template_of(sandbox, row), services.settings), status_code=status
    )


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(sandbox_id: str, request: Request) -> JSONResponse:
    """Resumes a paused sandbox (201) or extends a running one's timeout (200)."""
    return await _resume_or_connect(request, sandbox_id, only_paused=False)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
async def resume(sandbox_id: str, request: Request) -> JSONResponse:
    """The deprecated resume: 409 for a sandbox that is not paused."""
    return await _resume_or_connect(request, sandbox_id, only_paused=True)


def _metric(row: sandbox_metrics.SandboxMetricSample) -> dict[str, Any]:
    """A sample as E2B's ``SandboxMetric``. ``memCache`` is 0: the memory used already leaves the
    reclaimable page cache out."""
    return {
        "timestamp": rfc3339(row.at),
        "timestampUnix": int(as_utc(row.at).timestamp()),
        "cpuCount": row.vcpu,
        "cpuUsedPct": row.cpu_pct,
        "memUsed": row.mem_used_bytes,
        "memTotal": row.mem_limit_bytes,
        "memCache": 0,
        "diskUsed": row.disk_used_bytes,
        "diskTotal": row.disk_limit_bytes,
    }


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(
    sandbox_id: str,
    request: Request,
    start: Annotated[int | None, Query(ge=0, le=params.LAST_UNIX_S)] = None,
    end: Annotated[int | None, Query(ge=0, le=params.LAST_UNIX_S)] = None,
) -> list[dict[str, Any]]:
    """The sandbox's samples from ``start`` (default: its creation) to ``end`` (default: now), unix
    seconds, as the SDK's ``get_metrics()`` parses them (docs/e2b.md): the metrics worker's raw samples
    while they cover ``start`` (an hour), else its one-minute averages (a day). A killed sandbox's stay
    readable as long as they are kept, as E2B's do."""
    services, principal = await callers.caller(request.scope, sandbox_id)
    sandbox = await _ever_had(services, principal.user_id, sandbox_id)
    now = services.clock()
    since = as_utc(sandbox.created_at) if start is None else dt.datetime.fromtimestamp(start, dt.UTC)
    until = now if end is None else dt.datetime.fromtimestamp(end, dt.UTC)
    async with services.sessions() as session:
        rows = await sandbox_metrics.between(session, sandbox_id, since, until, now)
    return [_metric(row) for row in rows]


#: A cutoff no row is older than: the record answers for every run the account ever had.
_EVER = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


async def _ever_had(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    """The caller's sandbox, running, paused or ended however long ago; 404 for one it never had."""
    if not _ID_RE.match(sandbox_id):
        raise errors.NotFound(f"sandbox {sandbox_id!r} not found")
    return await queries.get_when(services, user_id, sandbox_id, _EVER, None)


@router.get("/unstable/sandboxes/{sandbox_id}/record")
async def record(sandbox_id: str, request: Request) -> dict[str, Any]:
    """E2B's ``SandboxRecord`` of one of the caller's sandboxes (SDK 2.64's generated client), running,
    paused or ended, however long ago (the rows stay); 404 for one it never had."""
    services, principal = await callers.caller(request.scope, sandbox_id)
    sandbox = await _ever_had(services, principal.user_id, sandbox_id)
    async with services.sessions() as session:
        row = await store.get(session, sandbox_id)
    return schemas.record(
        sandbox,
        _template_of(sandbox, row),
        services.settings,
        services.clock(),
        monitoring_kept=dt.timedelta(seconds=sandbox_metrics.ROLLUP_RETENTION_S),
        events_kept=dt.timedelta(days=services.settings.audit_retention_days),
    )


async def _boot_log(services: Services, sandbox: Sandbox) -> list[sandbox_logs.Entry]:
    """The sandbox's boot log as E2B's log entries (``sandbox_logs``); none while it is not booted."""
    if sandbox.status not in BOOTED:
        return []
    try:
        link = await hostlink.for_host(services, sandbox.host_id)
        log = await link.logs(sandbox.id, "boot", MAX_LOG_TAIL_LINES)
    except hostlink.SandboxGoneError:
        return []
    except hostlink.HostError as exc:
        raise errors.Unavailable(f"the sandbox's host did not answer: {exc}") from None
    return sandbox_logs.entries(log.lines, sandbox.created_at)


#: The most of the trail's events one logs page reads when it filters them by level or text (without a
#: filter it reads only as many as it answers): a page stays one bounded query however long the trail.
SCAN_EVENTS = 5000


async def _log_entries(
    services: Services,
    principal: Principal,
    sandbox_id: str,
    *,
    since_ms: int | None,
    limit: int,
    backward: bool = False,
    filtered: bool = False,
) -> list[sandbox_logs.Entry]:
    """What both logs routes page through, oldest first: the sandbox's boot log merged with its audit
    events as entries, ``limit`` of them from ``since_ms`` on, or (``backward``) up to it, the newest
    (``SCAN_EVENTS`` when the page filters them afterwards); 404 for a sandbox the caller never had.
    A sandbox's access token gets the boot log alone: the trail is its owner's account's to read
    (``/v1``'s audit route answers a token 403)."""
    sandbox = await _ever_had(services, principal.user_id, sandbox_id)
    boot = await _boot_log(services, sandbox)
    if principal.sandbox_id is not None:
        return boot
    await services.audit.flush_now()  # a log read shows the call just made, as a read of the trail does
    at = None if since_ms is None else dt.datetime.fromtimestamp(since_ms / 1000, dt.UTC)
    async with services.sessions() as session:
        events, _ = await audit.page(
            session,
            sandbox_id,
            principal.user_id,
            since=None if backward else at,
            until=at + dt.timedelta(microseconds=1) if backward and at is not None else None,
            limit=SCAN_EVENTS if filtered else limit,
            newest_first=backward,
        )
    if backward:
        events.reverse()
    return sandbox_logs.merged(boot, sandbox_logs.from_events(events))


@router.get("/sandboxes/{sandbox_id}/logs")
async def logs(sandbox_id: str, request: Request) -> dict[str, Any]:
    """E2B's logs are its envd's own; a Paddock sandbox's are its boot log and its audit trail
    (``sandbox_logs``), from ``start`` (milliseconds since the epoch), ``limit`` of them (at most
    1000). The trail's outlive the sandbox (the boot log goes with it), so a killed one still answers."""
    services, principal = await callers.caller(request.scope, sandbox_id)
    query = request.query_params
    since_ms = params.int_param(query, "start", 0, params.LAST_UNIX_MS)
    limit = params.int_param(query, "limit", 0, MAX_LOG_TAIL_LINES)
    limit = MAX_LOG_TAIL_LINES if limit is None else limit
    found = await _log_entries(services, principal, sandbox_id, since_ms=since_ms, limit=limit)
    chosen = sandbox_logs.page(found, since_ms=since_ms, limit=limit)
    return {"logs": [entry.v1() for entry in chosen], "logEntries": [entry.structured() for entry in chosen]}


@router.get("/v2/sandboxes/{sandbox_id}/logs")
async def logs_v2(sandbox_id: str, request: Request) -> dict[str, Any]:
    """The same entries from ``cursor`` (milliseconds since the epoch), ``direction`` ``forward``
    (oldest first) or ``backward`` (newest first, up to the cursor), at ``level`` or above, holding
    ``search``, ``limit`` of them (at most 1000)."""
    services, principal = await callers.caller(request.scope, sandbox_id)
    query = request.query_params
    since_ms = params.int_param(query, "cursor", 0, params.LAST_UNIX_MS)
    limit = params.int_param(query, "limit", 0, MAX_LOG_TAIL_LINES)
    backward = params.choice_param(query, "direction", ("forward", "backward")) == "backward"
    level = params.choice_param(query, "level", params.LOG_LEVELS)
    search = query.get("search") or None
    if search is not None and len(search) > 256:
        raise errors.ValidationFailed.field("search", "at most 256 characters")
    limit = MAX_LOG_TAIL_LINES if limit is None else limit
    filtered = level is not None or search is not None
    found = await _log_entries(
        services, principal, sandbox_id, since_ms=since_ms, limit=limit, backward=backward, filtered=filtered
    )
    chosen = sandbox_logs.page(
        found, since_ms=since_ms, limit=limit, backward=backward, level=level, search=search
    )
    return {"logs": [entry.structured() for entry in chosen]}


@router.get("/health")
async def health() -> Response:
    return Response(status_code=204)


def create_app(services: Services) -> FastAPI:
    """The E2B API as its own ASGI app, sharing the control plane's services (one process, one state)."""
    app = FastAPI(title="Paddock E2B-compatible API", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.services = services
    e2b_errors.install(app)
    app.include_router(router)
    app.include_router(e2b_templates.router)
    template_catalog.install(app, DEFAULT_SHAPE)
    app.include_router(e2b_volumes.router)
    app.include_router(e2b_volume_content.router)
    app.include_router(e2b_snapshots.router)

    def too_large(limit_bytes: int, field: str) -> errors.PaddockError:
        return errors.PayloadTooLarge(f"{field} is over the {limit_bytes}-byte limit")

    def render(exc: Exception) -> Response:
        assert isinstance(exc, errors.PaddockError)
        return e2b_errors.from_paddock(exc)

    uploads = BodyRoute("PUT", r"/e2b-uploads", e2b_templates.MAX_UPLOAD_BYTES)
    volume_files = BodyRoute("PUT", r"/volumecontent/[^/]+/file", VOLUME_FILE_BYTES)
    app.add_middleware(AuditMiddleware, locate=audit_targets.api_target)  # inside the body limit, as /v1's
    app.add_middleware(
        BodyLimit,
        default_bytes=MAX_BODY_BYTES,
        refuse=too_large,
        render=render,
        routes=[uploads, volume_files],
    )
    app.add_middleware(RequestContextMiddleware, service="e2b")
    return app
