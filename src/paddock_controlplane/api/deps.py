"""Request dependencies: the session, the caller, pagination. Aliases keep route signatures short."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane import accounts
from paddock_controlplane.services import Services
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


async def principal_for_key(services: Services, presented: str) -> accounts.Principal:
    """The caller behind an ``X-Api-Key`` value (1 s cache); 401 for a missing, unknown or revoked key."""
    cache_key = sha256_hex(presented)
    principal = services.principals.get(cache_key)
    if not isinstance(principal, accounts.Principal):
        async with services.sessions() as session:
            principal = await accounts.authenticate(session, presented)
        services.principals.put(cache_key, principal)
    return principal


async def scope_principal(scope: fastlane.Scope) -> tuple[Services, accounts.Principal]:
    """The services and the caller of a request, from its ASGI scope (the dependency below and the fast
    lane's handlers share it); the user id goes into the request's log line."""
    services: Services = scope["app"].state.services
    principal = await principal_for_key(services, fastlane.header(scope, b"x-api-key"))
    scope.setdefault("state", {})["user_id"] = principal.user_id
    return services, principal


async def get_principal(request: Request) -> accounts.Principal:
    return (await scope_principal(request.scope))[1]


PrincipalDep = Annotated[accounts.Principal, Depends(get_principal)]


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


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise errors.ValidationFailed.field(name, "must be an integer") from None


async def get_page(request: Request) -> PageParams:
    limit = _int_param(request, "limit", DEFAULT_PAGE)
    offset = _int_param(request, "offset", 0)
    if limit < 1:
        raise errors.ValidationFailed.field("limit", "must be at least 1")
    if offset < 0:
        raise errors.ValidationFailed.field("offset", "must be 0 or more")
    return PageParams(limit=min(limit, MAX_PAGE), offset=offset)


PageDep = Annotated[PageParams, Depends(get_page)]
