"""Route dependencies: the wired services and the authenticated wallet."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from paddock_gateway import auth
from paddock_gateway.services import Services


def services_of(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def get_services(request: Request) -> Services:
    """Async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, per request."""
    return services_of(request)


async def authenticated(request: Request) -> auth.Caller:
    services = services_of(request)
    caller = await auth.authenticate(
        services.sessions,
        request.headers,
        services.clock(),
        skew_ms=services.settings.timestamp_skew_ms,
        contract_check=services.contract_signature,
    )
    request.scope.setdefault("state", {})["wallet"] = caller.wallet
    return caller


ServicesDep = Annotated[Services, Depends(get_services)]
CallerDep = Annotated[auth.Caller, Depends(authenticated)]
