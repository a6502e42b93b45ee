"""Route dependencies: the wired services and the authenticated wallet."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from paddock_gateway import auth, siwx
from paddock_gateway.deployments import public_base
from paddock_gateway.errors import AuthError
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


async def manager(request: Request) -> auth.Caller:
    """The routes where a wallet manages what it paid for (list, status, delete) also take x402's
    ``SIGN-IN-WITH-X`` proof; when it is sent, it decides alone. A 401 ``auth_missing`` there carries the
    SIWx challenge (``sign-in-with-x``: info, supportedChains, schema), as a 402 does."""
    services = services_of(request)
    header = request.headers.get(siwx.HEADER)
    if header is None:
        try:
            return await authenticated(request)
        except AuthError as exc:
            if exc.code == "auth_missing":
                challenge = siwx.declaration(
                    public_base(services), services.registry, services.clock(), request.url.path
                )
                exc.extra["extensions"] = {siwx.SIGN_IN_WITH_X: challenge}
            raise
    context = siwx.SiwxContext(
        sessions=services.sessions,
        registry=services.registry,
        public_url=public_base(services),
        verifier=services.signatures,
        chains=services.chains,
        skew_s=services.settings.timestamp_skew_ms / 1000,
    )
    caller = await siwx.authenticate(context, header, services.clock())
    request.scope.setdefault("state", {})["wallet"] = caller.wallet
    return caller


ServicesDep = Annotated[Services, Depends(get_services)]
CallerDep = Annotated[auth.Caller, Depends(authenticated)]
ManagerDep = Annotated[auth.Caller, Depends(manager)]
