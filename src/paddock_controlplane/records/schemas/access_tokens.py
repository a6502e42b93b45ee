"""The delegated access token body (§12.1)."""

from __future__ import annotations

from pydantic import Field, StrictInt

from paddock_controlplane.records.schemas.base import Body


class AccessTokenRequest(Body):
    """Create and rotate take no body (§2.2); ``expires_in_seconds`` is this server's extension."""

    expires_in_seconds: StrictInt | None = Field(default=None, ge=1, le=365 * 24 * 3600)
