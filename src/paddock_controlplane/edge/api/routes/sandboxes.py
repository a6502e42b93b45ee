"""Sandbox routes (§11.3–§11.9): parse, call one domain function, render the view."""

from __future__ import annotations

import datetime as dt
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import QueryParams

from paddock_controlplane.edge.api.deps import (
    PageDep,
    PrincipalDep,
    SandboxPrincipalDep,
    ServicesDep,
    scope_principal,
)
from paddock_controlplane.edge.api.errors import error_response
from paddock_controlplane.edge.api.routes import access_tokens
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records import queries, validation, views
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.schemas.sandboxes import (
    CreateSandboxRequest,
    EgressRequest,
    ForkSandboxRequest,
    PatchSandboxRequest,
    PauseSandboxRequest,
    RechargeRequest,
    ResizeRequest,
    SshKeysRequest,
    TimeoutRequest,
)
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import destruction, lifecycle, patching, suspension, traffic
from paddock_core import envelope, errors, fastlane

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"], route_class=BoundaryRoute)


def view(services: Services, sandbox: Sandbox) -> dict[str, Any]:
    s = services.settings
    return views.sandbox_view(sandbox, scheme=s.ingress_scheme, domain=s.ingress_url_domain)


def cutoff(services: Services) -> dt.datetime:
    return services.clock() - dt.timedelta(hours=services.settings.retention_destroyed_h)


def mark(request: Request, sandbox_id: str) -> None:
    request.scope.setdefault("state", {})["resource_id"] = sandbox_id


@router.post("")
async def create(
    body: CreateSandboxRequest, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    sandbox = await lifecycle.create(services, principal.user_id, body)
    s = services.settings
    return envelope.success(
        views.create_response(sandbox, scheme=s.ingress_scheme, domain=s.ingress_url_domain)
    )


@router.get("")
async def list_sandboxes(
    request: Request, principal: PrincipalDep, services: ServicesDep, page: PageDep
) -> dict[str, Any]:
    async with services.sessions() as session:
        rows, total = await queries.page(
            session,
            principal.user_id,
            status=request.query_params.get("status") or None,
            limit=page.limit,
            offset=page.offset,
            cutoff=cutoff(services),
            metadata=lifecycle.metadata_filter(request.query_params.multi_items()),
        )
    items = [view(services, row) for row in rows]
    return envelope.success(envelope.page(items, total=total, limit=page.limit, offset=page.offset))


@router.get("/by-ip/{ip}")
async def by_ip(ip: str, principal: PrincipalDep, services: ServicesDep) -> dict[str, Any]:
    async with services.sessions() as session:
        return envelope.success(view(services, await queries.by_ip(session, principal.user_id, ip)))


@router.get("/{sandbox_id}")
async def get(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    # Served by ``_get_answer`` below in the fast lane; this route is its OpenAPI entry and the same call.
    mark(request, sandbox_id)
    return await _read(services, principal.user_id, sandbox_id, request.query_params)


async def _read_row(services: Services, user_id: str, sandbox_id: str, query: QueryParams) -> Sandbox:
    wait = queries.wait_params(query.get("wait_for"), query.get("wait_ms"))
    return await queries.get_when(services, user_id, sandbox_id, cutoff(services), wait)


async def _read(services: Services, user_id: str, sandbox_id: str, query: QueryParams) -> dict[str, Any]:
    return envelope.success(view(services, await _read_row(services, user_id, sandbox_id, query)))


#: GET's answer per sandbox row. ``PointReads`` hands out the same row object until something is
#: committed, so a polled sandbox is rendered once per change rather than once per poll (the view and
#: its JSON were a fifth of a cached GET's cost); the entry goes with the row.
_RENDERED: weakref.WeakKeyDictionary[Sandbox, bytes] = weakref.WeakKeyDictionary()


def _rendered(services: Services, sandbox: Sandbox) -> bytes:
    body = _RENDERED.get(sandbox)
    if body is None:
        body = bytes(JSONResponse(envelope.success(view(services, sandbox))).body)
        _RENDERED[sandbox] = body
    return body


#: What a fast-lane sandbox route answers, given the caller (already allowed on the sandbox).
FastAnswer = Callable[[Services, str, str, fastlane.Scope], Awaitable[Response]]


def _fast_sandbox_route(answer: FastAnswer, *, tokens: bool = True) -> fastlane.Handler:
    """A ``/v1/sandboxes/{id}…`` route in the fast lane: the same checks and errors as the FastAPI
    routes below, which stay the endpoints' OpenAPI entries, without FastAPI's routing and dependency
    solving (clients poll GET hard, §7.2; it was a third of the control plane's CPU per pause).
    ``tokens``: the sandbox's access token may call it (``SandboxPrincipalDep``); without, account keys
    only (``PrincipalDep``)."""

    async def handle(
        scope: fastlane.Scope, params: dict[str, str], _: bytes, __: fastlane.Receive
    ) -> Response | None:
        sandbox_id = params["sandbox_id"]
        if "\x00" in sandbox_id or b"%00" in scope.get("query_string", b""):
            return None  # the route renders the 400 (``BoundaryRoute``)
        scope.setdefault("state", {})["resource_id"] = sandbox_id
        try:
            services, principal = await scope_principal(scope, sandbox_id if tokens else None)
            return await answer(services, principal.user_id, sandbox_id, scope)
        except errors.PaddockError as exc:
            return error_response(exc)

    return handle


async def _get_answer(services: Services, user_id: str, sandbox_id: str, scope: fastlane.Scope) -> Response:
    query = QueryParams(scope.get("query_string", b""))
    sandbox = await _read_row(services, user_id, sandbox_id, query)
    return Response(_rendered(services, sandbox), media_type="application/json")


def _transition_answer(operation: Callable[[Services, str, str], Awaitable[Sandbox]]) -> FastAnswer:
    """A bodiless state change (pause, resume), answered with the sandbox's view."""

    async def answer(services: Services, user_id: str, sandbox_id: str, _: fastlane.Scope) -> Response:
        return JSONResponse(envelope.success(view(services, await operation(services, user_id, sandbox_id))))

    return answer


async def _destroy_answer(services: Services, user_id: str, sandbox_id: str, _: fastlane.Scope) -> Response:
    return JSONResponse(envelope.success(await destruction.destroy(services, user_id, sandbox_id)))


async def _fork_answer(services: Services, user_id: str, sandbox_id: str, _: fastlane.Scope) -> Response:
    child = await lifecycle.fork(services, user_id, sandbox_id, ForkSandboxRequest())
    return JSONResponse(envelope.success(view(services, child)))


#: Bodies that ask for nothing: both SDKs send ``{}`` when a call has no overrides (§11.9).
_NO_FIELDS = (b"", b"{}")


def _bodiless(handler: fastlane.Handler) -> fastlane.Handler:
    """Serves only requests without a query, and without a body or with ``{}``, in the fast lane; the
    others (a pause's ``keep_memory``, a fork's overrides) go on to the route below, which parses
    them."""

    async def handle(
        scope: fastlane.Scope, params: dict[str, str], body: bytes, receive: fastlane.Receive
    ) -> Response | None:
        if body.strip() not in _NO_FIELDS or scope.get("query_string"):
            return None
        return await handler(scope, params, body, receive)  # type: ignore[return-value]

    return handle


FAST_ROUTES = [
    fastlane.FastRoute("GET", r"/v1/sandboxes/(?P<sandbox_id>[^/]+)", _fast_sandbox_route(_get_answer)),
    # Every sandbox made is destroyed once; FastAPI's routing and dependencies were a third of it.
    fastlane.FastRoute(
        "DELETE", r"/v1/sandboxes/(?P<sandbox_id>[^/]+)", _bodiless(_fast_sandbox_route(_destroy_answer))
    ),
    fastlane.FastRoute(
        "POST",
        r"/v1/sandboxes/(?P<sandbox_id>[^/]+)/pause",
        _bodiless(_fast_sandbox_route(_transition_answer(suspension.pause))),
    ),
    fastlane.FastRoute(
        "POST",
        r"/v1/sandboxes/(?P<sandbox_id>[^/]+)/resume",
        _fast_sandbox_route(_transition_answer(suspension.resume)),
    ),
    # A fork without overrides; its route's routing and dependencies were ~0.5 ms of every fork's answer.
    fastlane.FastRoute(
        "POST",
        r"/v1/sandboxes/(?P<sandbox_id>[^/]+)/fork",
        _bodiless(_fast_sandbox_route(_fork_answer, tokens=False)),
    ),
]


@router.patch("/{sandbox_id}")
async def patch(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    body = await optional_body(request, PatchSandboxRequest)
    return envelope.success(
        view(services, await patching.patch(services, principal.user_id, sandbox_id, body))
    )


@router.delete("/{sandbox_id}")
async def destroy(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    # A bodiless destroy is served by ``_destroy_answer`` in the fast lane; this route is its OpenAPI
    # entry and the same call.
    mark(request, sandbox_id)
    return envelope.success(await destruction.destroy(services, principal.user_id, sandbox_id))


@router.post("/{sandbox_id}/pause")
async def pause(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    # A bodiless pause is served by ``_transition_answer`` in the fast lane; this route is its OpenAPI
    # entry and the same call, and serves pauses with a body or query (issue #34: ``keep_memory``
    # false hibernates; ``hibernate_after_seconds`` hibernates a frozen pause later; docs/hibernation.md).
    mark(request, sandbox_id)
    body = await optional_body(request, PauseSandboxRequest)
    keep_memory = body.keep_memory
    if keep_memory is None:
        keep_memory = _query_bool(request.query_params.get("keep_memory"), "keep_memory", default=True)
    after = validation.auto_pause_seconds(body.hibernate_after_seconds, "hibernate_after_seconds")
    if after is not None and not keep_memory:
        raise errors.ValidationFailed.field(
            "hibernate_after_seconds",
            "only with a frozen pause (keep_memory true): this pause hibernates now",
        )
    paused = await suspension.pause(
        services, principal.user_id, sandbox_id, keep_memory=keep_memory, hibernate_after_seconds=after
    )
    return envelope.success(view(services, paused))


def _query_bool(value: str | None, field: str, *, default: bool) -> bool:
    if value is None:
        return default
    parsed = {"true": True, "1": True, "false": False, "0": False}.get(value.lower())
    if parsed is None:
        raise errors.ValidationFailed.field(field, "must be a boolean (true or false)")
    return parsed


@router.post("/{sandbox_id}/resume")
async def resume(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    # Served by ``_transition_answer`` in the fast lane; this route is its OpenAPI entry and the same call.
    mark(request, sandbox_id)
    return envelope.success(view(services, await suspension.resume(services, principal.user_id, sandbox_id)))


@router.post("/{sandbox_id}/fork")
async def fork(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    mark(request, sandbox_id)
    body = await optional_body(request, ForkSandboxRequest)
    return envelope.success(
        view(services, await lifecycle.fork(services, principal.user_id, sandbox_id, body))
    )


@router.post("/{sandbox_id}/timeout")
async def set_timeout(
    sandbox_id: str, body: TimeoutRequest, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    """A new lifetime from now (extend or shorten; 0 or ``null``: none). An extension of the contract."""
    sandbox = await lifecycle.set_timeout(
        services, principal.user_id, sandbox_id, body.timeout_s, body.on_timeout
    )
    return envelope.success(view(services, sandbox))


@router.post("/{sandbox_id}/resize")
async def resize(
    sandbox_id: str, body: ResizeRequest, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    return envelope.success(await patching.resize(services, principal.user_id, sandbox_id, body.disk_mib))


@router.post("/{sandbox_id}/ssh-pubkeys")
async def ssh_pubkeys(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    body = await optional_body(request, SshKeysRequest)
    # Keys added through the sandbox's access token belong to that token (docs/access-tokens.md).
    token_id = principal.key_id if principal.sandbox_id is not None else None
    added = await patching.add_ssh_keys(services, principal.user_id, sandbox_id, body.keys, token_id=token_id)
    return envelope.success(added)


@router.get("/{sandbox_id}/egress")
async def get_egress(
    sandbox_id: str, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    return envelope.success(await traffic.get_egress(services, principal.user_id, sandbox_id))


@router.put("/{sandbox_id}/egress")
async def put_egress(
    sandbox_id: str, request: Request, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    body = await optional_body(request, EgressRequest)
    return envelope.success(await traffic.set_egress(services, principal.user_id, sandbox_id, body.egress))


@router.get("/{sandbox_id}/bandwidth")
async def get_bandwidth(
    sandbox_id: str, principal: SandboxPrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    return envelope.success(await traffic.get_bandwidth(services, principal.user_id, sandbox_id))


@router.post("/{sandbox_id}/bandwidth/recharge")
async def recharge(
    sandbox_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> dict[str, Any]:
    async with services.sessions() as session:
        await queries.get_owned(session, principal.user_id, sandbox_id)  # 404 before 400 (§11.7)
    body = await optional_body(request, RechargeRequest)
    return envelope.success(await traffic.recharge(services, principal.user_id, sandbox_id, body.add_bytes))


# §12's routes share this prefix; included here so they come with the sandbox routes.
router.include_router(access_tokens.router)
