"""Who calls the E2B API: an account key or a delegated access token, as on ``/v1``, in E2B's
``X-API-Key`` or, without one, in ``Authorization: Bearer <key>``. The SDK (2.64 on) sends the caller's
own ``Authorization`` header in place of an API key when it has none (``api_headers``, for E2B's OAuth
access tokens); here the token is a Paddock key. ``X-API-Key`` wins when both are sent (the SDK then
sends only it)."""

from __future__ import annotations

from paddock_controlplane.edge.api.deps import scope_principal
from paddock_controlplane.records.principals import Principal
from paddock_controlplane.records.services import Services
from paddock_core import errors, fastlane

#: The 401 for a request that carries no key, in E2B's words (``/v1``'s names PADDOCK_API_KEY).
NO_KEY = "no API key was sent: set E2B_API_KEY (sent as X-API-Key) or send Authorization: Bearer <key>"


def presented_key(scope: fastlane.Scope) -> str:
    """The key a request to the E2B API carries: ``X-API-Key``, else a Bearer ``Authorization``, else
    ``""`` (which the caller's check refuses with a 401)."""
    key = fastlane.header(scope, b"x-api-key")
    if key:
        return key
    scheme, _, value = fastlane.header(scope, b"authorization").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


async def caller(scope: fastlane.Scope, sandbox_id: str | None) -> tuple[Services, Principal]:
    """The services and the caller, allowed to act on ``sandbox_id`` (``None``: an account-level
    operation, which a sandbox's access token may not make), as ``deps.scope_principal`` decides."""
    presented = presented_key(scope)
    if not presented:
        raise errors.Unauthorized(NO_KEY)
    return await scope_principal(scope, sandbox_id, presented)
