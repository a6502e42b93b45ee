"""Request dependencies: the session, the caller, pagination. Aliases keep route signatures short."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
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
    if principal is None:
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
