"""Request dependencies: the session, the caller, pagination. Aliases keep route signatures short."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.principals import Principal
from paddock_controlplane.records.services import Services
from paddock_controlplane.resources import access_tokens, accounts
from paddock_controlplane.sandboxes import file_urls
from paddock_core import errors, fastlane
from paddock_core.crypto import constant_time_equals, sha256_hex

MAX_PAGE = 500
DEFAULT_PAGE = 50


async def get_services(request: Request) -> Services:
    """Every dependency here is async on purpose: FastAPI runs a plain ``def`` one in its thread pool."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_session(services: ServicesDep) -> AsyncIterator[AsyncSession]:
    async with services.sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


#: The 401 for a request without a key says where a client takes it from.
NO_KEY = "no API key was sent: set PADDOCK_API_KEY (the SDK and CLI read it) or send the X-Api-Key header"


async def principal_for_key(services: Services, presented: str) -> Principal:
    """The caller behind an ``X-Api-Key`` value — an account key or a delegated sandbox access token
    (§3, §12.1) — from a 1 s cache; 401 for a missing, unknown, revoked or expired one."""
    if not presented:
        raise errors.Unauthorized(NO_KEY)
    cache_key = sha256_hex(presented)
    principal = services.principals.get(cache_key)
    if principal is None:
        async with services.sessions() as session:
            if presented.startswith(access_tokens.TOKEN_PREFIX):
                principal = await access_tokens.authenticate(session, presented, services.clock())
            else:
                principal = await accounts.authenticate(session, presented)
        services.principals.put(cache_key, principal)
    # Checked on every use, so a cached token is not honoured past its expiry even for a moment.
    if principal.expires_at is not None and principal.expires_at <= services.clock():
        services.principals.drop(cache_key)
        raise errors.Unauthorized("missing, invalid, expired or revoked API key or access token")
    return principal


async def scope_caller(scope: fastlane.Scope, presented: str | None = None) -> tuple[Services, Principal]:
    """The services and the caller of a request, from its ASGI scope, *before* any scope check; the
    user id goes into the request's log line. Routes use the aliases below, which check. The key is
    ``X-Api-Key``'s unless the listener read it elsewhere (``presented``: the E2B API's callers)."""
    services: Services = scope["app"].state.services
    if presented is None:
        presented = fastlane.header(scope, b"x-api-key")
    principal = await principal_for_key(services, presented)
    state = scope.setdefault("state", {})
    state["user_id"] = principal.user_id
    state["key_id"] = principal.key_id  # the audit trail's "who" (edge/auditing.py); an id, not the key
    return services, principal


async def scope_principal(
    scope: fastlane.Scope, sandbox_id: str | None, presented: str | None = None
) -> tuple[Services, Principal]:
    """The caller, allowed to act on ``sandbox_id`` (``None``: an account-level operation). The fast
    lane's handlers, the dependencies below and the E2B API share it, so every lane scopes tokens alike."""
    services, principal = await scope_caller(scope, presented)
    principal.require_scope(sandbox_id)
    return services, principal


async def get_caller(request: Request) -> Principal:
    return (await scope_caller(request.scope))[1]


CallerDep = Annotated[Principal, Depends(get_caller)]


async def get_principal(caller: CallerDep) -> Principal:
    """An account-level caller: every account key; a delegated access token gets 403."""
    caller.require_scope(None)
    return caller


async def get_sandbox_principal(sandbox_id: str, caller: CallerDep) -> Principal:
    """A caller acting on the sandbox of the path's ``{sandbox_id}``: the owner's key, or that
    sandbox's access token (§12.1; any other sandbox is 404 to it). Only the operations §12.1 opens to
    tokens take this one; everything else takes ``PrincipalDep`` and so refuses tokens by default."""
    caller.require_scope(sandbox_id)
    return caller


#: The default: account keys only (tokens get 403).
PrincipalDep = Annotated[Principal, Depends(get_principal)]
#: Sandbox operations a delegated token may call on its own sandbox (§12.1's allowed list).
SandboxPrincipalDep = Annotated[Principal, Depends(get_sandbox_principal)]


_SANDBOX_BY_ID = select(Sandbox).where(Sandbox.id == bindparam("sandbox_id"))


async def get_file_caller(sandbox_id: str, request: Request, services: ServicesDep) -> str:
    """The user whose sandbox a ``GET``/``PUT …/files`` acts as: the caller's (a key or that sandbox's
    access token), or, for a request with no key that carries a signed link's ``signature`` and
    ``expires`` (``sandboxes/file_urls.py``), the sandbox's owner, once the link checks out (401 naming
    why not). The audit trail files it under ``signed_url``."""
    params = request.query_params
    if "signature" not in params or fastlane.header(request.scope, b"x-api-key"):
        return (await get_sandbox_principal(sandbox_id, await get_caller(request))).user_id
    refused = file_urls.refusal(
        services.settings.secret_key.get_secret_value(),
        sandbox_id,
        request.method,
        params.get("path", ""),
        params.get("expires", ""),
        params["signature"],
        services.clock().timestamp(),
    )
    sandbox = (
        await services.reads.first(_SANDBOX_BY_ID, {"sandbox_id": sandbox_id}) if refused is None else None
    )
    if sandbox is None:
        raise errors.Unauthorized(refused or "signature: not this server's for this sandbox")
    state = request.scope.setdefault("state", {})
    state["user_id"] = sandbox.user_id
    state["key_id"] = "signed_url"  # the audit trail's "who": the holder of a link, not a key
    return sandbox.user_id


#: ``GET``/``PUT …/files``: a key, the sandbox's token, or a signed link.
FileCallerDep = Annotated[str, Depends(get_file_caller)]


async def require_host_token(request: Request, services: ServicesDep) -> None:
    expected = services.settings.host_token.get_secret_value()
    presented = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not expected or not presented or not constant_time_equals(presented, expected):
        raise errors.Unauthorized("invalid host token")


HostAuthDep = Annotated[None, Depends(require_host_token)]


@dataclass(frozen=True)
class PageParams:
    limit: int
    offset: int


# Declared as Query constraints so the OpenAPI documents what the server enforces. An offset is bounded
# because the databases take it as a signed 64-bit integer (2^63 overflowed SQLite into a 500), and no
# list is anywhere near 2^31 rows; a limit above MAX_PAGE is clamped (§8.2), not refused.
MAX_OFFSET = 2**31 - 1
LimitQuery = Annotated[
    int | None,
    Query(ge=1, description=f"page size; values above {MAX_PAGE} are clamped to {MAX_PAGE}"),
]
OffsetQuery = Annotated[int | None, Query(ge=0, le=MAX_OFFSET, description="rows to skip")]


async def get_page(limit: LimitQuery = None, offset: OffsetQuery = None) -> PageParams:
    return PageParams(
        limit=DEFAULT_PAGE if limit is None else min(limit, MAX_PAGE),
        offset=0 if offset is None else offset,
    )


PageDep = Annotated[PageParams, Depends(get_page)]
