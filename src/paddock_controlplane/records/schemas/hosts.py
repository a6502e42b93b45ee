"""The host agent's heartbeat body (internal routes, not in the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class EgressAuditPosition(BaseModel):
    """How far the host's record of egress attempts has come: the agent's run (``epoch``, empty when
    the host enforces no egress) and the number of its last attempt (``seq``, 0: none this run). The
    audit writer asks a host for attempts only when this is past what it recorded."""

    epoch: str = Field(default="", max_length=40)
    seq: int = Field(default=0, ge=0, le=2**62)


class HibernatedSummary(BaseModel):
    """The host's hibernated sandboxes as a count and a digest of their ids (``paddock_core/heartbeat.py``);
    ``listed``: whether the beat's ``sandboxes`` lists them too."""

    count: int = Field(default=0, ge=0, le=10**7)
    digest: str = Field(default="", max_length=64)
    listed: bool = True


class Heartbeat(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    url: str = Field(min_length=1, max_length=300)
    status: str = "active"
    free_mib: int = 0
    total_mib: int = 0
    vm_count: int = 0
    rootfses: list[str] = []
    buildable: list[str] = []
    labels: dict[str, str] = {}
    sandboxes: list[dict[str, Any]] = []
    #: Sent by agents that know it; without it the host is asked on every poll, as before.
    egress_audit: EgressAuditPosition | None = None
    #: Sent by agents that can leave their hibernated sandboxes out of ``sandboxes``.
    hibernated: HibernatedSummary | None = None
