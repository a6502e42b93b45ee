"""The host agent's heartbeat body (internal routes, not in the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


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
