"""E2B's wire models, as its SDKs send and read them (e2b-dev/infra ``spec/openapi.yml``; the field
names are E2B's camelCase). Requests are parsed strictly enough that a wrong type is a 400 naming the
field; fields Paddock does not act on are accepted and ignored unless acting on them matters (then 501)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from paddock_controlplane.edge.e2b import identity
from paddock_controlplane.records.models import Sandbox
from paddock_core.timeutil import rfc3339


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NewSandbox(Body):
    """``POST /sandboxes`` and ``POST /v2/sandboxes`` (``NewSandbox``/``NewSandboxV2``)."""

    template_id: StrictStr = Field(alias="templateID", min_length=1, max_length=128)
    timeout: StrictInt | None = None
    auto_pause: StrictBool | None = Field(default=None, alias="autoPause")
    secure: StrictBool | None = None
    allow_internet_access: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    env_vars: dict[StrictStr, StrictStr] | None = Field(default=None, alias="envVars")
    mcp: dict[str, Any] | None = None
    volume_mounts: list[Any] | None = Field(default=None, alias="volumeMounts")
    network: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None


class Timeout(Body):
    """``POST /sandboxes/{id}/timeout``."""

    timeout: StrictInt


class Refresh(Body):
    """``POST /sandboxes/{id}/refreshes``."""

    duration: StrictInt | None = None


class Connect(Body):
    """``POST /sandboxes/{id}/connect``, ``/v2/…/connect`` and ``/resume``."""

    timeout: StrictInt | None = None
    auto_pause: StrictBool | None = Field(default=None, alias="autoPause")


class Fork(Body):
    """``POST /sandboxes/{id}/fork``."""

    timeout: StrictInt | None = None
    count: StrictInt | None = None


#: Paddock statuses as E2B's two states; any other status is not shown (E2B lists only these two).
STATES: dict[str, str] = {
    "creating": "running",
    "running": "running",
    "resuming": "running",
    "forking": "running",
    "pausing": "paused",
    "paused": "paused",
}


def created(sandbox: Sandbox, template_id: str, settings: Any) -> dict[str, Any]:
    """E2B's ``Sandbox``: what a create, connect or resume answers."""
    return {
        "templateID": template_id,
        "sandboxID": sandbox.id,
        "clientID": identity.CLIENT_ID,
        "envdVersion": identity.ENVD_VERSION,
        "envdAccessToken": identity.envd_access_token(settings, sandbox.id),
        # The edge opens the sandbox's other ports (49999 too) to this token when its ingress is off,
        # as E2B does for a sandbox without public traffic; the SDK sends it to every port.
        "trafficAccessToken": identity.envd_access_token(settings, sandbox.id),
        "domain": identity.domain(settings),
        "alias": template_id,
    }


def listed(
    sandbox: Sandbox, template_id: str, end_at: dt.datetime, metadata: dict[str, str]
) -> dict[str, Any]:
    """E2B's ``ListedSandbox``."""
    return {
        "templateID": template_id,
        "alias": template_id,
        "sandboxID": sandbox.id,
        "clientID": identity.CLIENT_ID,
        "startedAt": rfc3339(sandbox.running_at or sandbox.created_at),
        "endAt": rfc3339(end_at),
        "cpuCount": sandbox.vcpu,
        "memoryMB": sandbox.mem_mib,
        "diskSizeMB": sandbox.disk_mib,
        "metadata": metadata,
        "state": STATES[sandbox.status],
        "envdVersion": identity.ENVD_VERSION,
    }


def detail(
    sandbox: Sandbox, template_id: str, end_at: dt.datetime, metadata: dict[str, str], settings: Any
) -> dict[str, Any]:
    """E2B's ``SandboxDetail``."""
    return {
        **listed(sandbox, template_id, end_at, metadata),
        "envdAccessToken": identity.envd_access_token(settings, sandbox.id),
        # The edge opens the sandbox's other ports (49999 too) to this token when its ingress is off,
        # as E2B does for a sandbox without public traffic; the SDK sends it to every port.
        "trafficAccessToken": identity.envd_access_token(settings, sandbox.id),
        "domain": identity.domain(settings),
        "allowInternetAccess": not sandbox.egress,
    }
