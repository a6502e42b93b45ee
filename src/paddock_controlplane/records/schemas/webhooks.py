"""The webhook endpoint body (§10.16, §11.14)."""

from __future__ import annotations

from pydantic import BaseModel


class CreateEndpointRequest(BaseModel):
    url: str
    events: list[str] | None = None
